"""`relaysh/core` and `relaysh/core:latest-python` (any tag): the step's `input` lines, or its
`command` and `args`, run in a sandbox on the `steps` queue (services.py, sandbox.py). The
handler only queues the script and follows it: the step waits without a worker and is woken
when the script ends."""

from scriptsteps import services
from scriptsteps.models import ScriptRun
from workflows.steps.base import Done, Outcome, StepContext


class ScriptStep:
    image = services.CORE

    def start(self, ctx: StepContext) -> Outcome:
        problem = services.problem_with(ctx)
        if problem:
            return Done(False, message=problem)
        return services.follow(services.queue(ctx.step_run_id))

    def check(self, ctx: StepContext) -> Outcome:
        script = ScriptRun.objects.filter(pk=ctx.step_run_id).first()
        if script is None:
            return Done(False, message="Its script is gone.")
        return services.follow(script)

    def cancel(self, ctx: StepContext) -> None:
        services.cancel(ctx.step_run_id)


class ContainerStep(ScriptStep):
    """Any other image, in the container runtime STEP_CONTAINER_RUNTIME names (container.py)."""

    image = "*"

    def start(self, ctx: StepContext) -> Outcome:
        problem = services.problem_with(ctx, needs_program=False)
        if problem:
            return Done(False, message=problem)
        return services.follow(services.queue(ctx.step_run_id))
