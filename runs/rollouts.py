"""Rollouts: a run worked in batches by this service (runs.models.Rollout), each batch an
ordinary run that any bridge works unchanged, the shipped Ruby agent included.

- `nodes_of` is where a scope becomes the rollout's nodes: a `nodes` scope as it is; a
  `query` as the connection's bridge resolved it through PuppetDB (`resolve_query`, through
  inventory.scope);
- `plan` turns the rollout section's numbers and percentages into counts;
- `advance` moves a rollout on: a batch whose run ended is recorded (the rollout pauses, or
  stops, or is done), and a pause that is over starts the next batch. Called by the task that
  a batch's run ending queues (runs.apps), by that task again after the pause (a countdown),
  and by the beat's sweep, which finds what a lost message or a restarted worker left.
"""

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from inventory.models import PreviewQuery
from inventory.scope import QUERY_FAILED, resolve_scope
from puppet_connection.models import PuppetConnection
from relay import dispatch
from runs import results
from runs.models import SUCCEEDED, Rollout, RolloutBatch, RolloutState, Run, Status

log = logging.getLogger(__name__)

ADVANCE = "runs.tasks.advance_rollout"  # its Celery name: queued by name (relay.dispatch)


@dataclass(frozen=True)
class NotResolvable:
    """A scope whose nodes cannot be listed (yet); `reason` says why, for a 400. `asked`:
    not yet, the connection's bridge has been asked to resolve its query."""

    reason: str
    asked: bool = False


class QueryAsked(Exception):
    """Raised, instead of a 400, to a caller that waits for the bridge to resolve a rollout's
    query (a puppet-run step, which cannot be started again as an API client can)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def nodes_of(connection: PuppetConnection, scope: dict[str, Any]) -> "list[str] | NotResolvable":
    """The certnames a rollout of `scope` goes through, in order, each once."""
    if "nodes" in scope:
        return list(dict.fromkeys(scope["nodes"]))
    if "query" in scope:
        return resolve_query(connection, scope["query"])
    kind = next(iter(scope))
    return NotResolvable(
        f"A rollout needs the nodes its scope names before it starts, and a `{kind}` scope is "
        "resolved by the PE orchestrator, out of this service's sight: give `nodes` (or a `query`)."
    )


def resolve_query(connection: PuppetConnection, query: Any) -> "list[str] | NotResolvable":
    """A PuppetDB query's certnames, as the connection's bridge last resolved it for a
    preview (inventory.scope: fresh for INVENTORY_QUERY_FRESH seconds). Without a fresh
    answer the bridge is asked (it answers at its next check) and the rollout is refused
    until then, saying so: the service cannot read PuppetDB itself."""
    certnames, flags = resolve_scope(connection, {"query": query})
    if certnames == []:
        # Not a rollout of nothing: its batch would be a run with an empty node list, which
        # no run may have (a bridge-resolved query that matches nothing ends `error`).
        return NotResolvable("The query matches no node: there is nothing to roll out.")
    if certnames is not None:
        return certnames
    if flags and flags[0].startswith(QUERY_FAILED):
        return NotResolvable(f"The query could not be resolved to nodes: {flags[0]}.")
    PreviewQuery.ask(connection, query)
    return NotResolvable(
        "A rollout of a `query` scope starts from the nodes the query names, which only the "
        "connection's bridge can ask PuppetDB for: it has been asked, and answers at its next "
        "check (POST /api/connections/puppet/{id}/preview/ with the scope shows when it has). "
        "Start the rollout again then, or give the nodes (`scope: {nodes: [...]}`).",
        asked=True,
    )


def count(value: int | str, total: int) -> int:
    """A count as given (10), or a percentage of `total` ("20%"), rounded down as Ansible's
    `serial` and `max_fail_percentage` are."""
    if isinstance(value, str):
        return total * int(value.removesuffix("%")) // 100
    return value


def plan(spec: dict[str, Any], total: int) -> dict[str, Any]:
    """The rollout's numbers for `total` nodes (the section validated by
    runs.api.serializers.RolloutSerializer): Rollout's fields."""
    return {
        "spec": spec,
        "canary": spec["canary"],
        "batch_size": max(count(spec["batch"], total), 1),
        "max_failures": count(spec["max_failures"], total),
        "pause": spec["pause"],
    }


# Moving on -----------------------------------------------------------------------------------


def advance(rollout_id: Any, now: datetime | None = None) -> str:
    """Do what is due for the rollout; returns its state after. Safe to call any number of
    times, from any number of workers at once: every step is a compare-and-set."""
    now = now or timezone.now()
    rollout = Rollout.objects.select_related("run").filter(pk=rollout_id).first()
    if rollout is None:
        return ""
    if rollout.state == RolloutState.RUNNING:
        batch = rollout.batches.select_related("run").filter(index=rollout.current).first()
        if batch is None or batch.run.status != Status.COMPLETE:
            return rollout.state  # its run is out; its end queues this again
        outcomes, why = node_outcomes(batch.run, rollout.batch_nodes(batch.index))
        if not rollout.end_batch(batch.index, outcomes, why, now):
            return advance(rollout_id, now)  # another worker recorded it: look again
    if rollout.state == RolloutState.PAUSED:
        assert rollout.next_batch_at is not None
        if rollout.next_batch_at <= now:
            rollout.start_batch(rollout.current + 1, now)
        else:
            # Without a worker waiting: a message due when the pause ends (the sweep sends
            # it again if this one is lost with a restarted worker).
            wait = (rollout.next_batch_at - now).total_seconds()
            dispatch.publish_or_log(ADVANCE, str(rollout.pk), countdown=wait, what=f"rollout {rollout.pk}")
    return rollout.state


def node_outcomes(run: Run, nodes: list[str]) -> tuple[dict[str, str], str]:
    """Each node's outcome in a batch's run: its item's `state` in the run's results (every
    backend's node items, PE's orchestrator's too, say `finished` for a good run), or, for a
    node with no item, the run's own outcome. And a few words on how the run ended, for the
    reason a rollout stopped."""
    items = {}
    for item in _node_items(run):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            items[item["name"]] = str(item.get("state") or "unknown")
    outcomes = {node: items.get(node, run.outcome or "unknown") for node in nodes}
    why = ""
    if run.outcome != SUCCEEDED:
        message = _message(run.run_results)
        why = f" (run {run.id}: {run.outcome}" + (f", {message}" if message else "") + ")"
    return outcomes, why


def _node_items(run: Run) -> list[Any]:
    found = run.run_results
    if run.results_sha256:  # too large for the row: the whole results are in storage
        with results.open_stored(run.results_sha256) as stored:
            found = json.load(stored)
    nodes = found.get("nodes") if isinstance(found, dict) else None
    return nodes if isinstance(nodes, list) else []


def _message(run_results: Any) -> str:
    if not isinstance(run_results, dict):
        return ""
    for holder in (run_results.get("result"), run_results):
        if isinstance(holder, dict):
            for key in ("msg", "reason"):
                if isinstance(holder.get(key), str):
                    return holder[key][:300]
    return ""


def sweep(now: datetime | None = None) -> int:
    """Queue `advance` for every rollout with something due: a pause over, or a batch whose
    run ended (its message lost). From beat; returns how many it queued."""
    now = now or timezone.now()
    ended = RolloutBatch.objects.filter(
        rollout=OuterRef("pk"), index=OuterRef("current"), ended_at__isnull=True, run__status=Status.COMPLETE
    )
    due = Rollout.objects.filter(state=RolloutState.PAUSED, next_batch_at__lte=now) | Rollout.objects.filter(
        Exists(ended), state=RolloutState.RUNNING
    )
    queued = 0
    for rollout_id in due.values_list("pk", flat=True)[:1000]:
        queued += dispatch.publish_or_log(ADVANCE, str(rollout_id), what=f"rollout {rollout_id}")
    return queued


def batch_ended(run: Run) -> None:
    """A run ended: when it is a rollout's batch, that rollout moves on (in a worker)."""
    if run.status != Status.COMPLETE:
        return
    rollout_id = RolloutBatch.objects.filter(run_id=run.pk).values_list("rollout_id", flat=True).first()
    if rollout_id is not None:
        dispatch.publish_or_log(ADVANCE, str(rollout_id), what=f"rollout {rollout_id}")
