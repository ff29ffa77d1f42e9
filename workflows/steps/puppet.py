"""What the Puppet steps share: the connection their spec names, runs made through the runs
model with the validation of `POST /_puppet/runs`, and following a run without a worker.

A step finds its connection by the token in `spec.connection` (`!Connection {type: puppet,
name}` resolves to `{relayAPIURL, token}`), exactly as the published images authenticate to
the API with it; it makes the run here, not over HTTP, so `relayAPIURL` is not called. What
it keeps between checks is the run's and the connection's ids, never the token.
"""

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from puppet_connection.models import PuppetConnection
from relay.api.problems import field_errors
from runs.api.serializers import RunCreateSerializer
from runs.models import Conflict, Run, Status, wire_status
from workflows.steps.base import Done, StepContext, Wait
from workflows.steps.spec import SpecError, check_fields

# The engine wakes a waiting step when its run changes (Wait.wake_on); this is how long it
# waits at most before looking again anyway.
RECHECK = timedelta(seconds=30)
WAKE_ON = "puppet-run"
MISSED_HEARTBEATS = 3  # the RFC's example, and the bridge's relay-puppet-run default
MOST_MISSED_HEARTBEATS = 1000


def connection_from(spec: Mapping[str, Any]) -> PuppetConnection:
    value = spec.get("connection")
    token = value.get("token") if isinstance(value, Mapping) else None
    if not isinstance(token, str):
        raise SpecError(
            "spec.connection: give a puppet connection, e.g. !Connection {type: puppet, name: my-puppet}."
        )
    connection = PuppetConnection.for_token(token)
    if connection is None or not connection.owner.is_active:
        raise SpecError(
            "spec.connection: its token is no puppet connection's (was the connection's token "
            "regenerated, or the connection deleted?)."
        )
    return connection


def optional(spec: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """The run's fields (API name -> spec name) that the spec gives; null counts as absent,
    as it does for the published steps, which take a default for what is not there."""
    return {api: spec[name] for api, name in names.items() if spec.get(name) is not None}


def create_run(
    connection: PuppetConnection, body: dict[str, Any], names: Mapping[str, str], wait_for_query: bool = False
) -> Run:
    """A run made as `POST /_puppet/runs` makes it, with its checks. `names` maps the body's
    fields back to the spec's, for the messages. `wait_for_query`: a rollout whose query the
    bridge has yet to resolve raises runs.rollouts.QueryAsked (runs.api.serializers.rollout_plan)."""
    context = {"connection": connection, "wait_for_query": wait_for_query}
    request = RunCreateSerializer(data=body, context=context)
    if not request.is_valid():
        details = serializers.ValidationError(request.errors).get_full_details()
        problems = [f"{spec_place(e['pointer'], names)}: {e['detail']}" for e in field_errors(details)]
        raise SpecError(" ".join(problems))
    return Run.create_for(connection, request.validated_data)


def spec_place(pointer: str, names: Mapping[str, str]) -> str:
    """`#/scope/nodes/0` as the author wrote it: `spec.scope.nodes[0]`."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.removeprefix("#").split("/") if p]
    if not parts or parts[0] not in names:
        return "spec"  # the request as a whole, or a field the step sets itself (type)
    place = f"spec.{names[parts[0]]}"
    for part in parts[1:]:
        place += f"[{part}]" if part.isdigit() else f".{part}"
    return place


def missed_heartbeats(spec: Mapping[str, Any]) -> int:
    value = spec.get("timeoutAfterMissedHeartbeats", MISSED_HEARTBEATS)
    if value is None:
        return MISSED_HEARTBEATS
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # numbers from expressions are floats, as in Go
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST_MISSED_HEARTBEATS:
        raise SpecError(
            f"spec.timeoutAfterMissedHeartbeats: a whole number from 1 to {MOST_MISSED_HEARTBEATS}."
        )
    return value


def kept(run: Run, connection: PuppetConnection, **more: Any) -> dict[str, Any]:
    """What a waiting step keeps: ids, never the token."""
    return {"run": str(run.id), "connection": str(connection.pk), **more}


def run_of(ctx: StepContext) -> Run | None:
    """The run the step made or follows; None when it is gone (its connection was deleted)."""
    return Run.objects.filter(pk=ctx.state["run"], connection_id=ctx.state["connection"]).first()


GONE = Done(False, message="The Puppet run is gone: its puppet connection was deleted.")


def wait_for(run: Run, state: Mapping[str, Any], outputs: Mapping[str, Any], until: datetime | None) -> Wait:
    """Wait without a worker until the run changes, or `until` (when the step would give up)."""
    recheck = timezone.now() + RECHECK
    if until is not None:
        recheck = min(recheck, until + timedelta(seconds=1))
    return Wait(recheck_at=recheck, state=state, outputs=outputs, wake_on=(WAKE_ON, str(run.id)))


def heartbeat_deadline(run: Run, missed: int) -> datetime | None:
    """The RFC's rule: a run in progress is given up once `missed` of the bridge's heartbeat
    intervals (`next_update_before - updated_at`) have passed since its last update. None
    while no bridge has started it (the service expires those: RUN_ACCEPTED_TIMEOUT,
    RUN_PENDING_TIMEOUT)."""
    if run.status != Status.IN_PROGRESS or run.next_update_before is None:
        return None
    return run.updated_at + missed * (run.next_update_before - run.updated_at)


def give_up(run: Run, ctx: StepContext, missed: int) -> str:
    """Ask the bridge to stop the run nobody hears from; the step's message."""
    cancel(run, ctx)
    return (
        f"The bridge missed {missed} heartbeats: run {run.id} was last updated at "
        f"{run.updated_at.isoformat()} and its next update was due before "
        f"{run.next_update_before.isoformat() if run.next_update_before else '?'}. "
        "The run was asked to cancel."
    )


def cancel(run: Run, ctx: StepContext) -> None:
    """The run's own cancel: at once while pending, else its bridge is asked to stop it."""
    try:
        run.cancel(f"workflow:{ctx.run_id}"[:64])
    except Conflict:
        pass  # it had ended already


def ended(run: Run) -> str:
    reason = (run.run_results or {}).get("reason") if isinstance(run.run_results, dict) else None
    return f"Run {run.id} ended: {run.outcome}" + (f" ({reason})" if reason else "") + "."


class StartsARun:
    """run-start, task-run-start, plan-run-start: make the run, publish its `id` at once, and
    end when a bridge has taken it, as the published steps' loop does: once the run leaves
    `pending` (as the API shows it) or its job id is known, with `jobID` when it is."""

    image = ""
    known: set[str] = set()

    def body(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The run's request, and its fields' names in the spec."""
        raise NotImplementedError

    def start(self, ctx: StepContext) -> Done | Wait:
        try:
            check_fields(ctx.spec, self.known, self.image)
            connection = connection_from(ctx.spec)
            body, names = self.body(ctx.spec)
            run = create_run(connection, body, names)
        except SpecError as exc:
            return Done(False, message=str(exc))
        return self.follow(run, kept(run, connection))

    def check(self, ctx: StepContext) -> Done | Wait:
        run = run_of(ctx)
        return GONE if run is None else self.follow(run, ctx.state)

    def cancel(self, ctx: StepContext) -> None:
        run = run_of(ctx) if ctx.state else None
        if run is not None:
            cancel(run, ctx)

    def follow(self, run: Run, state: Mapping[str, Any]) -> Done | Wait:
        outputs = {"id": str(run.id)}
        if run.job_id:
            outputs["jobID"] = run.job_id
        status = wire_status(run.status)
        if status == Status.PENDING and not run.job_id:
            return wait_for(run, state, outputs, until=None)
        if status == Status.COMPLETE:
            # As the published loop: the step has done its part; run-wait reports the outcome.
            taken = "was taken by a bridge and ended" if run.accepted_at else "ended before a bridge took it"
            return Done(True, outputs, f"Run {run.id} {taken}: {run.outcome}.")
        job = f", job {run.job_id}" if run.job_id else ""
        return Done(True, outputs, f"Run {run.id} was taken by its bridge ({status}{job}).")
