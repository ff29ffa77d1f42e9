"""The connection's node inventory, from PuppetDB to the service (issue 21 §3), over the
`/_puppet/inventory` extension (relay_bridge.api; the shipped Ruby agent never calls it).

What leaves the site, per node: its certname, environment, last report's status and time,
when its facts were stored, whether it is deactivated or expired, and the facts the
allow-list (`inventory_facts`) names, each by its dotted path into PuppetDB's structured
facts (`os.release.full`). Facts can hold secrets: nothing else is sent.

A sync is streamed: PuppetDB is read a page of nodes at a time (with those nodes' facts),
and each page is sent before the next is read, so the bridge holds one page whatever the
fleet's size. The service says whether a sync is full (the first, after the allow-list
changed, once a day) or incremental: only the nodes whose facts, catalog or report PuppetDB
stored since the time the service keeps, and every deactivated or expired node (PuppetDB
keeps those until it purges them: a handful). That time is PuppetDB's own clock at the
start of the sync less OVERLAP, and the service keeps it only when the sync ends well: a
sync that fails half way (PuppetDB down) is asked again in full from the same time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from relay_bridge import trust
from relay_bridge.api import ApiError, RelayClient
from relay_bridge.logs import logger
from relay_bridge.puppetdb import PuppetDB, PuppetDBError

DEFAULT_FACTS = ("os.family", "os.release.full", "kernel", "networking.fqdn", "puppetversion")
PAGE_NODES = 500
# Pages overlap by this many nodes: PuppetDB pages by offset, and a node deactivated and
# purged between two pages would shift the next one. (The repeats are not sent twice.)
PAGE_OVERLAP = 25
# A command PuppetDB received before a sync began may be stored after it read that node:
# the next sync asks again from this long before the start.
OVERLAP = timedelta(seconds=30)
SHOWN_REFUSALS = 20  # of a page's refused nodes, in the log


class InventoryError(Exception):
    pass


@dataclass
class Synced:
    full: bool
    nodes: int = 0
    refused: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def sync(client: RelayClient, puppetdb: PuppetDB, facts: tuple[str, ...] = DEFAULT_FACTS) -> Synced:
    """One sync, full or incremental as the service says. InventoryError when PuppetDB or
    the service fails it (the service is told, and its time for the next sync stays)."""
    began = time.monotonic()
    start = client.inventory_start(list(facts))
    sync_id, since, full = start["id"], start.get("since"), bool(start.get("full"))
    page_size = min(PAGE_NODES, int(start.get("page_max_nodes") or PAGE_NODES))
    limit = int(start.get("page_max_bytes") or 2 * 1024 * 1024)
    done = Synced(full=full or not since)
    clock: datetime | None = None
    try:
        for page in pages(puppetdb, None if done.full else since, facts, page_size):
            clock = clock or puppetdb.clock
            for part in _within(page, limit):
                answer = client.inventory_page(sync_id, part)
                done.nodes += int(answer.get("stored") or 0)
                done.refused.extend(answer.get("refused") or [])
        clock = clock or puppetdb.clock or datetime.now(timezone.utc)
    except PuppetDBError as exc:
        client.inventory_end(sync_id, error=str(exc))
        raise InventoryError(str(exc)) from None
    except ApiError as exc:
        # The service refused a page (a node over its page bound): end the sync failed, or
        # it stays under way and refuses every sync until INVENTORY_SYNC_IDLE has passed.
        client.inventory_end(sync_id, error=f"the service refused a page: {exc}")
        raise InventoryError(f"the service refused a page: {exc}") from None
    client.inventory_end(sync_id, since=(clock - OVERLAP).isoformat(timespec="seconds"))
    done.seconds = time.monotonic() - began
    if done.refused:
        logger.warning(
            "the service refused nodes of the inventory",
            extra={"fields": {"refused": len(done.refused), "first": done.refused[:SHOWN_REFUSALS]}},
        )
    logger.info(
        "inventory synced",
        extra={"fields": {"full": done.full, "nodes": done.nodes, "seconds": round(done.seconds, 2)}},
    )
    return done


def changed_since(since: str | None) -> list[Any]:
    """PuppetDB's query for the nodes to send: every node, or those changed since `since`."""
    every = ["=", "node_state", "any"]
    if since is None:
        return every
    latest_reports = ["and", ["=", "latest_report?", True], [">", "receive_time", since]]
    return [
        "and",
        every,
        [
            "or",
            [">", "facts_timestamp", since],
            [">", "catalog_timestamp", since],
            [">", "report_timestamp", since],
            # report_timestamp is the agent's clock; receive_time is PuppetDB's.
            ["in", "certname", ["extract", ["certname"], ["select_reports", latest_reports]]],
            ["null?", "deactivated", False],
            ["null?", "expired", False],
        ],
    ]


def pages(
    puppetdb: PuppetDB, since: str | None, facts: tuple[str, ...], size: int = PAGE_NODES
) -> Iterator[list[dict[str, Any]]]:
    """The nodes to send, a page at a time, each with the allow-list's facts."""
    query = changed_since(since)
    # The service sets the page size: the overlap must leave each page a step forward, or a
    # page of PAGE_OVERLAP nodes (or fewer) would be asked again for ever.
    size = max(1, size)
    step = size - min(PAGE_OVERLAP, size // 2)
    offset, previous = 0, set()
    while True:
        rows = puppetdb.query(
            query, "nodes", order_by=[{"field": "certname", "order": "asc"}], limit=size, offset=offset
        )
        fresh = [row for row in rows if row.get("certname") not in previous]
        if fresh:
            yield _with_facts(puppetdb, [_node(row) for row in fresh], facts)
        if len(rows) < size:
            return
        previous = {row.get("certname") for row in rows}
        offset += step


def _node(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "certname": row.get("certname"),
        "environment": row.get("facts_environment")
        or row.get("report_environment")
        or row.get("catalog_environment"),
        "report_status": row.get("latest_report_status"),
        "report_timestamp": row.get("report_timestamp"),
        "facts_timestamp": row.get("facts_timestamp"),
        "deactivated": row.get("deactivated"),
        "expired": row.get("expired"),
        "facts": {},
    }


def _with_facts(
    puppetdb: PuppetDB, nodes: list[dict[str, Any]], paths: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The nodes, with the value of each allow-listed path their facts have. PuppetDB is
    asked for the top-level facts the paths start with, for these certnames only."""
    if not paths or not nodes:
        return nodes
    names = sorted({path.split(".", 1)[0] for path in paths})
    by_name = {node["certname"]: node for node in nodes}
    rows = puppetdb.query(
        ["and", ["in", "certname", ["array", list(by_name)]], ["in", "name", ["array", names]]], "facts"
    )
    for row in rows:
        node = by_name.get(row.get("certname"))
        if node is None:
            continue
        for path in paths:
            head, _, rest = path.partition(".")
            if head != row.get("name"):
                continue
            found, value = dig(row.get("value"), rest)
            if found:
                node["facts"][path] = value
    return nodes


def dig(value: Any, path: str) -> tuple[bool, Any]:
    """(found, the value at dotted `path` inside a structured fact)."""
    for key in path.split(".") if path else []:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return False, None
    return True, value


def _within(nodes: list[dict[str, Any]], limit: int) -> Iterator[list[dict[str, Any]]]:
    """The page, split until each part's body is under the service's limit."""
    if len(nodes) <= 1 or len(json.dumps({"nodes": nodes}).encode()) < limit:
        yield nodes
        return
    half = len(nodes) // 2
    yield from _within(nodes[:half], limit)
    yield from _within(nodes[half:], limit)


def answer_queries(client: RelayClient, puppetdb: PuppetDB, status: dict[str, Any]) -> int:
    """Resolve the preview queries the service lists (`status` is its GET /_puppet/inventory
    answer) through PuppetDB, as a run's query scope is (relay_bridge.backends.query), and
    send the certnames, or PuppetDB's message. Returns how many were answered.

    One answer a request: a batch of wide answers is over the service's body bound (413),
    and all of them were refused each minute again. An answer over it alone is sent as
    that query's error."""
    answered = 0
    for asked in status.get("queries") or []:
        if not isinstance(asked, dict) or not isinstance(asked.get("key"), str):
            continue
        try:
            names = puppetdb.certnames(asked.get("query"))
            bad = [n for n in names if not trust.certname_ok(n)]
            if bad:
                raise PuppetDBError(f"PuppetDB returned what is no certname: {trust.shown(bad[0])}")
            answer: dict[str, Any] = {"key": asked["key"], "certnames": names}
        except PuppetDBError as exc:
            answer = {"key": asked["key"], "error": str(exc) or "PuppetDB failed"}
        try:
            try:
                client.inventory_answers([answer])
            except ApiError as exc:
                if exc.status != 413:
                    raise
                error = f"the query names {len(answer['certnames'])} nodes: over the service's body bound"
                client.inventory_answers([{"key": asked["key"], "error": error}])
            answered += 1
        except ApiError as exc:
            logger.error("a preview query's answer was refused", extra={"fields": {"error": str(exc)}})
    if answered:
        logger.info("preview queries answered", extra={"fields": {"queries": answered}})
    return answered


class Timer:
    """`serve`'s inventory: a sync at start, then whenever the service asks for one (it is
    asked every CHECK seconds, and answered the preview queries it lists) or `interval`
    seconds have passed."""

    CHECK = 60.0

    def __init__(
        self, client: RelayClient, puppetdb: PuppetDB, facts: tuple[str, ...], interval: float
    ) -> None:
        self.client, self.puppetdb, self.facts, self.interval = client, puppetdb, facts, interval
        self.last = float("-inf")

    def tick(self) -> None:
        """Sync if due. Errors are logged: the next tick tries again."""
        try:
            status = self.client.inventory_status()
            answer_queries(self.client, self.puppetdb, status)
            due = time.monotonic() - self.last >= self.interval or bool(status.get("due"))
            if due:
                sync(self.client, self.puppetdb, self.facts)
                self.last = time.monotonic()
        except Exception as exc:  # the daemon's loop must live on: log, retry at the next tick
            logger.error("inventory sync failed", extra={"fields": {"error": str(exc)}})
