"""What a bridge's inventory sync may send: the allow-list it declares when a sync starts,
and the nodes of each page. A node that cannot be kept (a certname Puppet would not issue,
a time that is no time) is refused alone, with its reason in the answer, and the rest of
its page is kept; a fact over INVENTORY_FACT_MAX_BYTES is left out of its node, and said so.
A fact the allow-list does not name refuses the node: the bridge sent what it said it
would not."""

import json
import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

from inventory.models import ReportStatus

CERTNAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # as a run's node list takes them
FACT_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*$")
SHOWN_CHARS = 100  # of a refused certname, in an answer


class PageError(ValueError):
    """The page as a whole cannot be taken (a 400)."""


def check_fact_paths(value: Any) -> list[str]:
    """The allow-list a sync declares: dotted fact paths (`os.release.full`)."""
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise PageError('facts: a list of dotted fact paths, e.g. ["os.family", "kernel"].')
    if len(value) > settings.INVENTORY_FACTS_MAX:
        raise PageError(f"facts: at most {settings.INVENTORY_FACTS_MAX} fact paths.")
    for path in value:
        if len(path) > 255 or not FACT_PATH.match(path):
            raise PageError(f"facts: {path[:SHOWN_CHARS]!r} is not a dotted fact path.")
    return list(dict.fromkeys(value))


def check_page(body: Any, fact_paths: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(the nodes to store, as Node fields; the ones refused, each with its certname and why)."""
    if not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
        raise PageError('The page must be a JSON object with a list of "nodes".')
    nodes = body["nodes"]
    if len(nodes) > settings.INVENTORY_PAGE_MAX_NODES:
        raise PageError(
            f"At most {settings.INVENTORY_PAGE_MAX_NODES} nodes a page; this one has {len(nodes)}."
        )
    allowed = set(fact_paths)
    kept: dict[str, dict[str, Any]] = {}
    refused: list[dict[str, str]] = []
    for index, node in enumerate(nodes):
        try:
            row, notes = _node(node, allowed)
        except ValueError as exc:
            name = node.get("certname") if isinstance(node, dict) else None
            shown = name[:SHOWN_CHARS] if isinstance(name, str) else f"nodes[{index}]"
            refused.append({"certname": shown, "reason": str(exc)})
            continue
        kept[row["certname"]] = row  # the last of one certname sent twice in a page
        refused.extend({"certname": row["certname"], "reason": note} for note in notes)
    return list(kept.values()), refused


def _node(node: Any, allowed: set[str]) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(node, dict):
        raise ValueError("A node must be a JSON object.")
    certname = node.get("certname")
    if not isinstance(certname, str) or len(certname) > 255 or not CERTNAME.match(certname):
        raise ValueError(
            "Not a certname Puppet issues (lowercase letters, digits, '.', '_', '-', at most 255):"
            " not kept, and no run can name it."
        )
    environment = node.get("environment") or ""
    if not isinstance(environment, str) or len(environment) > 255:
        raise ValueError("environment: a name of at most 255 characters.")
    status = node.get("report_status") or ""
    if status not in ReportStatus.values:
        raise ValueError(
            f"report_status: one of changed, unchanged, failed, or null; not {str(status)[:20]!r}."
        )
    facts = node.get("facts") or {}
    if not isinstance(facts, dict):
        raise ValueError("facts: an object of dotted fact paths to values.")
    outside = sorted(set(facts) - allowed)
    if outside:
        raise ValueError(f"facts: {', '.join(outside)[:200]} not in the allow-list this sync declared.")
    notes, kept = [], {}
    for path, value in facts.items():
        if len(json.dumps(value)) > settings.INVENTORY_FACT_MAX_BYTES:
            notes.append(f"facts.{path}: over {settings.INVENTORY_FACT_MAX_BYTES} bytes, not kept.")
        else:
            kept[path] = value
    return {
        "certname": certname,
        "environment": environment,
        "report_status": status,
        "report_at": _time(node, "report_timestamp"),
        "facts_at": _time(node, "facts_timestamp"),
        "deactivated_at": _time(node, "deactivated"),
        "expired_at": _time(node, "expired"),
        "facts": kept,
    }, notes


def _time(node: dict[str, Any], key: str) -> datetime | None:
    value = node.get(key)
    if value is None:
        return None
    moment = parse_datetime(value) if isinstance(value, str) and len(value) <= 64 else None
    if moment is None or moment.tzinfo is None:
        raise ValueError(f"{key}: an ISO 8601 time with its offset, as PuppetDB gives it.")
    return moment
