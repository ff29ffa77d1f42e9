"""A run's results: kept in its row when small, in the events storage when not.

A large fleet's results (a node item each, with the tail of its output) can pass
RUN_RESULTS_MAX_BYTES. Refusing them would lose the run: the bridge would resend its final
state until the run timed out. So they are stored whole, under their SHA-256
(`run-results/aa/bb/<sha256>.json`), and the run keeps a summary of them; the full results
are at `GET /_puppet/runs/{id}/results`.
"""

import hashlib
import json
from collections import Counter
from typing import Any

from django.conf import settings
from django.core.files.storage import storages

from relay.storage import save_once

# The summary of stored results stays about this small, whatever their size.
SUMMARY_BYTES = 16 * 1024
SMALL_VALUE_BYTES = 1024


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def object_name(sha256: str) -> str:
    return f"run-results/{sha256[:2]}/{sha256[2:4]}/{sha256}.json"


def keep(state: dict[str, Any]) -> dict[str, Any]:
    """The state as the run keeps it: when its run_results are over RUN_RESULTS_MAX_BYTES,
    they are stored (before the run points at them) and replaced by their summary, with
    `results_size` and `results_sha256` naming the stored object."""
    results = state.get("run_results")
    if results is None:
        return state
    data = encode(results)
    if len(data) <= settings.RUN_RESULTS_MAX_BYTES:
        return state
    sha256 = hashlib.sha256(data).hexdigest()
    save_once(object_name(sha256), data)
    return {**state, "run_results": summarise(results), "results_size": len(data), "results_sha256": sha256}


def summarise(results: Any) -> Any:
    """What a workflow can read at a glance: a mapping's small values as they are and its
    large ones described (a list of node items by their `state`), within SUMMARY_BYTES;
    anything else described."""
    if not isinstance(results, dict):
        return _describe(results)
    summary: dict[str, Any] = {}
    used = 0
    for index, (key, value) in enumerate(results.items()):
        size = len(encode(value))
        brief = value if size <= SMALL_VALUE_BYTES else _describe(value, size)
        used += len(encode(brief)) + len(key) + 4
        if used > SUMMARY_BYTES:
            summary["omitted_keys"] = len(results) - index
            break
        summary[key] = brief
    return summary


def _describe(value: Any, size: int | None = None) -> dict[str, Any]:
    """A large value in a few words: its kind and size, and for a list of node items (the
    bridges' and the PE orchestrator's results) how many are in each state and, when the
    bridge read their reports, how many have changes pending and how many could not say."""
    size = len(encode(value)) if size is None else size
    if isinstance(value, list):
        described: dict[str, Any] = {"omitted": "list", "items": len(value), "bytes": size}
        items = [item for item in value if isinstance(item, dict)]
        states = Counter(item["state"] for item in items if isinstance(item.get("state"), str))
        if states:
            described["states"] = dict(states.most_common(20))
        pending = Counter(item["changes_pending"] for item in items if "changes_pending" in item)
        if pending:
            described["changes_pending"] = pending[True]
            described["changes_unknown"] = sum(n for key, n in pending.items() if not isinstance(key, bool))
        return described
    if isinstance(value, dict):
        return {"omitted": "object", "keys": len(value), "bytes": size}
    return {"omitted": "string" if isinstance(value, str) else type(value).__name__, "bytes": size}


def open_stored(sha256: str) -> Any:
    """The stored results' file, for streaming."""
    return storages["events"].open(object_name(sha256), "rb")
