"""`relaysh/puppet-step-run`: the RFC's one-step `run`. It asks for a Puppet run and follows
it to its end; outputs `jobID` and `outcome` (and `id`, at once).

spec (the RFC's names; the published steps' lower-case ones are taken too): connection
(puppet), timeoutAfterMissedHeartbeats (default 3), environment, scope, noOp (noop),
no_noop, debug, trace, evalTrace (evaltrace), and rollout (beyond the RFC):
`{canary: 1, batch: 10 | "20%", max_failures: 0 | "5%", pause: 30s}`, which makes the run a
rollout, in batches (runs.models.Rollout), and adds the outputs `batches` (which ran: each
one's nodes, run, outcome and failed nodes), `nodes` (certname -> outcome, `not-run` for
nodes of batches that never started) and `stopped` (why it stopped early, or ""). A rollout of
a `query` scope waits (up to QUERY_WAIT) for the connection's bridge to resolve the query.

It ends `success` when the outcome is `finished` or `success` (a plan's), and `failure` for
any other, as the bridge's relay-puppet-run exits. It gives up (outcome `timed-out`, and
the run is asked to cancel) when the bridge misses `timeoutAfterMissedHeartbeats`
heartbeats: once now is later than `updated_at + timeoutAfterMissedHeartbeats *
(next_update_before - updated_at)`."""

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.utils import timezone

from runs.models import Outcome, Run, Status
from runs.rollouts import QueryAsked
from workflows.steps import puppet
from workflows.steps.base import Done, StepContext, Wait
from workflows.steps.spec import SpecError, check_fields

SUCCESS = (Outcome.FINISHED, Outcome.SUCCESS)
# A rollout of a `query` scope waits for the connection's bridge to resolve it (the bridge
# answers at its inventory check, every minute): looked at this often, for at most this long.
QUERY_RECHECK = timedelta(seconds=10)
QUERY_WAIT = timedelta(minutes=10)
# The run's fields and the spec's names for them; the RFC's first.
SPELLINGS = {
    "environment": ("environment",),
    "scope": ("scope",),
    "noop": ("noOp", "noop"),
    "no_noop": ("no_noop",),
    "debug": ("debug",),
    "trace": ("trace",),
    "evaltrace": ("evalTrace", "evaltrace"),
    "rollout": ("rollout",),
}


def run_fields(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each run field -> the spec's name for it; both spellings of one field are an error."""
    names = {}
    for field, spellings in SPELLINGS.items():
        given = [name for name in spellings if spec.get(name) is not None]
        if len(given) > 1:
            raise SpecError(f"spec.{given[0]}: give {given[0]} or {given[1]}, not both.")
        names[field] = given[0] if given else spellings[0]
    return names


class PuppetRun:
    image = "relaysh/puppet-step-run"
    known = {"connection", "timeoutAfterMissedHeartbeats", *(n for both in SPELLINGS.values() for n in both)}

    def start(self, ctx: StepContext) -> Done | Wait:
        try:
            check_fields(ctx.spec, self.known, self.image)
            connection = puppet.connection_from(ctx.spec)
            missed = puppet.missed_heartbeats(ctx.spec)
            names = run_fields(ctx.spec)
            body = {"type": "run", **puppet.optional(ctx.spec, names)}
            run = puppet.create_run(connection, body, names, wait_for_query=True)
        except SpecError as exc:
            return Done(False, message=str(exc))
        except QueryAsked:
            if timezone.now() - ctx.started_at > QUERY_WAIT:
                seconds = int(QUERY_WAIT.total_seconds())
                return Done(
                    False,
                    message=f"spec.scope: The connection's bridge did not resolve the query within "
                    f"{seconds} seconds: is it running, with puppetdb_url? (It resolves queries at "
                    "its inventory check, every minute.)",
                )
            return Wait(recheck_at=timezone.now() + QUERY_RECHECK, state={"query_asked": True})
        return self.follow(run, puppet.kept(run, connection, missed=missed), ctx)

    def check(self, ctx: StepContext) -> Done | Wait:
        if ctx.state.get("query_asked"):
            return self.start(ctx)  # no run yet: its rollout's query may be resolved by now
        run = puppet.run_of(ctx)
        return puppet.GONE if run is None else self.follow(run, ctx.state, ctx)

    def cancel(self, ctx: StepContext) -> None:
        run = puppet.run_of(ctx) if ctx.state.get("run") else None
        if run is not None:
            puppet.cancel(run, ctx)

    def follow(self, run: Run, state: Mapping[str, Any], ctx: StepContext) -> Done | Wait:
        outputs = {"id": str(run.id), "jobID": run.job_id}
        if run.is_rollout:
            return self.follow_rollout(run, state, outputs)
        if run.status == Status.COMPLETE:
            return Done(run.outcome in SUCCESS, {**outputs, "outcome": run.outcome}, puppet.ended(run))
        deadline = puppet.heartbeat_deadline(run, state["missed"])
        if deadline is not None and timezone.now() > deadline:
            message = puppet.give_up(run, ctx, state["missed"])
            return Done(False, {**outputs, "outcome": Outcome.TIMED_OUT.value}, message)
        return puppet.wait_for(run, state, {"id": str(run.id)}, until=deadline)

    def follow_rollout(self, run: Run, state: Mapping[str, Any], outputs: dict[str, Any]) -> Done | Wait:
        """A rollout: its own run ends when its last batch does, or it stopped. No heartbeat
        to watch: each batch is a run the service expires when its bridge goes silent,
        which fails the batch. Its progress is published at each batch (the rollout's run
        changes, which wakes the step)."""
        rollout = run.rollout
        if run.status == Status.COMPLETE:
            report, progress = rollout.report(), rollout.progress()
            done = {
                **outputs,
                "outcome": run.outcome,
                **{k: report[k] for k in ("batches", "nodes", "stopped")},
                "rollout": progress,  # its last word: the outputs a Wait published merge with these
            }
            message = rollout.stop_reason or (
                f"Rollout {run.id}: {progress['batches']} batches ran, {rollout.nodes_failed} of "
                f"{progress['nodes']} nodes failed (at most {rollout.max_failures} allowed)."
            )
            return Done(run.outcome in SUCCESS, done, message)
        return puppet.wait_for(run, state, {"id": str(run.id), "rollout": rollout.progress()}, until=None)
