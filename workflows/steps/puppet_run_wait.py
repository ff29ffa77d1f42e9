"""`relaysh/puppet-step-run-wait`: waits for a Puppet run to end; outputs `jobID`,
`outcome` and, when the run has any, `results` (relay-integrations/relay-puppet,
steps/run-wait).

spec: connection (puppet), id (the run's, e.g. `!Output [start-puppet-run, id]`), and,
beyond the published step, timeoutAfterMissedHeartbeats (default 3).

Like the published step it ends `success` whatever outcome the bridge reported (`failed`
too: a workflow reads it from `outcome`). It ends `failure` when the run timed out: when
its bridge missed `timeoutAfterMissedHeartbeats` heartbeats (the RFC's rule; the run is then
asked to cancel), or when the service expired it (outcome `timed-out`)."""

import uuid
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from runs.models import Outcome, Run, Status
from workflows.steps import puppet
from workflows.steps.base import Done, StepContext, Wait
from workflows.steps.spec import SpecError, check_fields


def outputs_of(run: Run) -> dict[str, Any]:
    outputs: dict[str, Any] = {"jobID": run.job_id, "outcome": run.outcome}
    if run.run_results:
        outputs["results"] = run.run_results
    return outputs


class RunWait:
    image = "relaysh/puppet-step-run-wait"
    known = {"connection", "id", "timeoutAfterMissedHeartbeats"}

    def start(self, ctx: StepContext) -> Done | Wait:
        try:
            check_fields(ctx.spec, self.known, self.image)
            connection = puppet.connection_from(ctx.spec)
            missed = puppet.missed_heartbeats(ctx.spec)
            run = Run.objects.filter(pk=self.run_id(ctx.spec), connection=connection).first()
            if run is None:
                raise SpecError(f"spec.id: the puppet connection has no run {ctx.spec['id']}.")
        except SpecError as exc:
            return Done(False, message=str(exc))
        return self.follow(run, puppet.kept(run, connection, missed=missed), ctx)

    @staticmethod
    def run_id(spec: Mapping[str, Any]) -> uuid.UUID:
        try:
            return uuid.UUID(spec.get("id"))
        except (TypeError, ValueError, AttributeError):
            raise SpecError(
                "spec.id: give the id of a Puppet run, e.g. !Output {from: start-puppet-run, name: id}."
            ) from None

    def check(self, ctx: StepContext) -> Done | Wait:
        run = puppet.run_of(ctx)
        return puppet.GONE if run is None else self.follow(run, ctx.state, ctx)

    def cancel(self, ctx: StepContext) -> None:
        run = puppet.run_of(ctx) if ctx.state else None
        if run is not None:
            puppet.cancel(run, ctx)

    def follow(self, run: Run, state: Mapping[str, Any], ctx: StepContext) -> Done | Wait:
        if run.status == Status.COMPLETE:
            return Done(run.outcome != Outcome.TIMED_OUT, outputs_of(run), puppet.ended(run))
        deadline = puppet.heartbeat_deadline(run, state["missed"])
        if deadline is not None and timezone.now() > deadline:
            message = puppet.give_up(run, ctx, state["missed"])
            return Done(False, {"jobID": run.job_id, "outcome": Outcome.TIMED_OUT.value}, message)
        return puppet.wait_for(run, state, {}, until=deadline)
