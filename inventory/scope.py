"""Which nodes a run's scope names, from the connection's inventory: the scope preview
(before a run or a `puppet-run` step starts, and on the approval), and resolve_scope for any
other code that needs a scope's certnames (rollouts in batches, issue 21 §5).

A node list names its nodes. A `query` (PQL or PuppetDB's AST) is PuppetDB's to answer, and
the service has no PuppetDB of its own: a preview asks the bridge (inventory.models.
PreviewQuery, over /_puppet/inventory), which answers at its next check; until then, and for
other code, resolve_scope gives no certnames and says the bridge resolves it at run time. The
run itself always asks PuppetDB again when it starts (relay_bridge.backends.query). A
`node_group` (PE's classifier) and an `application` are resolved by PE at run time."""

from collections.abc import Iterable
from typing import Any

from inventory.models import Inventory, Node, PreviewQuery, State
from puppet_connection.models import PuppetConnection

# Flags: each a word the page and the API show, for the scope or for a node.
UNKNOWN = "unknown"  # the inventory has no such certname (accepted: it may be new)
RESOLVED_AT_RUN_TIME = "resolved by the bridge at run time"
ASKED = "asked the bridge, which resolves it through PuppetDB at its next check (a minute at most)"
RESOLVED_BY_BRIDGE = "resolved by the bridge through PuppetDB"
QUERY_FAILED = "PuppetDB could not resolve it"
NO_INVENTORY = "no inventory"  # the connection's bridge never synced one
FLAGGED_STATES = (State.STALE, State.DEACTIVATED, State.EXPIRED)


def resolve_scope(connection: PuppetConnection, scope: dict[str, Any]) -> tuple[list[str] | None, list[str]]:
    """(the certnames the scope names, or None when only the bridge or PE can tell at run
    time; flags on the scope as a whole). Certnames the inventory does not know are kept:
    a node list may name a node that has not reported yet."""
    if isinstance(scope.get("nodes"), list):
        flags = (
            []
            if Inventory.objects.filter(connection=connection, synced_at__isnull=False).exists()
            else [NO_INVENTORY]
        )
        return list(dict.fromkeys(str(n) for n in scope["nodes"])), flags
    if "query" in scope:
        row = PreviewQuery.objects.filter(
            connection=connection, key=PreviewQuery.key_of(scope["query"])
        ).first()
        if row is None or not row.fresh:
            return None, [RESOLVED_AT_RUN_TIME]
        if row.error:
            return None, [f"{QUERY_FAILED}: {row.error}"]
        when = row.answered_at.isoformat(timespec="seconds") if row.answered_at else ""
        return list(row.certnames or []), [
            f"{RESOLVED_BY_BRIDGE} at {when}; the run asks again when it starts"
        ]
    kind = next(iter(scope), "scope")
    return None, [f"{kind}: resolved by Puppet Enterprise at run time"]


def preview(connection: PuppetConnection, scope: dict[str, Any], ask: bool = True) -> dict[str, Any]:
    """What a run with this scope would touch, node by node, as the inventory knows it:
    `nodes` (each with its state, or `unknown`), and the certnames that are unknown,
    stale, deactivated or expired, listed apart for the approver. A query without a fresh
    answer is asked of the bridge (`ask`), which answers at its next check."""
    certnames, flags = resolve_scope(connection, scope)
    if certnames is None and "query" in scope and ask and not flags[0].startswith(QUERY_FAILED):
        PreviewQuery.ask(connection, scope["query"])
        flags = [ASKED]
    answer: dict[str, Any] = {"resolved": certnames is not None, "flags": flags}
    if certnames is None:
        return {**answer, "nodes": [], "count": None, **{key: [] for key in _KEYS}}
    known = {node.certname: node for node in _nodes(connection, certnames)}
    rows, grouped = [], {key: [] for key in _KEYS}
    for name in certnames:
        node = known.get(name)
        state = node.state if node else UNKNOWN
        rows.append(
            {
                "certname": name,
                "state": state,
                "report_status": (node.report_status or None) if node else None,
                "report_at": node.report_at.isoformat() if node and node.report_at else None,
            }
        )
        if state != State.ACTIVE:
            grouped[state].append(name)
    return {**answer, "count": len(certnames), "nodes": rows, **grouped}


_KEYS = (UNKNOWN, *FLAGGED_STATES)


def _nodes(connection: PuppetConnection, certnames: Iterable[str]) -> Iterable[Node]:
    names = list(certnames)
    for start in range(0, len(names), 1000):  # a bounded IN (...) a statement
        yield from Node.objects.filter(connection=connection, certname__in=names[start : start + 1000])
