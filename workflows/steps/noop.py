"""`relay-internal/noop`: a step that does (almost) nothing, for the engine's tests and
bench/workflows.py. Registered (WorkflowsConfig.ready) only when WORKFLOW_NOOP_STEPS is on,
which production never sets: its `sleep` holds a worker, and its `raise` fails on purpose.

Its spec, all optional:
- `sleep`: seconds to spend in start (a step that takes time, to be killed mid-step);
- `outputs`: a mapping published as the step's outputs;
- `fail`: a message; the step ends `failure` with it;
- `raise`: a message; start raises with it (the worker "could not do its job");
- `waitForPuppetRun`: a runs.Run id; the step waits, without a worker, until that Puppet
  run is complete (woken by its completion), and outputs its `outcome`.
"""

import logging
import time
from datetime import timedelta

from django.utils import timezone

from runs.models import Run, Status
from workflows.steps.base import Done, Outcome, StepContext, Wait

log = logging.getLogger(__name__)

IMAGE = "relay-internal/noop"


class NoopStep:
    image = IMAGE

    def start(self, ctx: StepContext) -> Outcome:
        log.info("noop step %s (%s) started", ctx.step_name, ctx.step_run_id)
        spec = ctx.spec
        sleep = spec.get("sleep")
        if isinstance(sleep, int | float) and sleep > 0:
            time.sleep(float(sleep))
        if spec.get("raise"):
            raise RuntimeError(str(spec["raise"]))
        if spec.get("waitForPuppetRun"):
            return self._wait(str(spec["waitForPuppetRun"]))
        if spec.get("fail"):
            return Done(success=False, message=str(spec["fail"]))
        outputs = spec.get("outputs")
        return Done(success=True, outputs=dict(outputs) if isinstance(outputs, dict) else {})

    def check(self, ctx: StepContext) -> Outcome:
        run_id = str(ctx.spec.get("waitForPuppetRun", ""))
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            return Done(success=False, message=f"Puppet run {run_id} is gone.")
        if run.status != Status.COMPLETE:
            return self._wait(run_id)
        return Done(success=run.outcome in ("finished", "success"), outputs={"outcome": run.outcome})

    def cancel(self, ctx: StepContext) -> None:
        log.info("noop step %s (%s) cancelled", ctx.step_name, ctx.step_run_id)

    def _wait(self, run_id: str) -> Wait:
        return Wait(
            recheck_at=timezone.now() + timedelta(hours=1),
            state={"run": run_id},
            wake_on=("puppet-run", run_id),
        )
