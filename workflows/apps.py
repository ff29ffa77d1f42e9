import logging

from django.apps import AppConfig
from django.conf import settings

log = logging.getLogger(__name__)


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs.signals import run_changed
        from workflows.steps import registry
        from workflows.steps.puppet_plan_run_start import PlanRunStart
        from workflows.steps.puppet_run import PuppetRun
        from workflows.steps.puppet_run_start import RunStart
        from workflows.steps.puppet_run_wait import RunWait
        from workflows.steps.puppet_task_run_start import TaskRunStart
        from workflows.steps.slack_message_send import MessageSend

        # The step kinds of the published images this app runs itself (scriptsteps registers
        # its own): the engine's registry imports none of them.
        for kind in (RunStart, RunWait, PuppetRun, TaskRunStart, PlanRunStart, MessageSend):
            registry.register(kind.image, kind)
        if settings.WORKFLOW_NOOP_STEPS:
            from workflows.steps.noop import NoopStep

            registry.register(NoopStep.image, NoopStep)
        run_changed.connect(_wake_puppet_steps, dispatch_uid="workflows-wake-puppet-steps")


def _wake_puppet_steps(sender: type, run: object, **kwargs: object) -> None:
    """A Puppet run changed status (sent after its commit): the steps waiting on it look now.
    Never fails the request that changed it: a step not woken is checked at its recheck time."""
    from workflows.engine import wake

    try:
        wake("puppet-run", str(run.pk))  # type: ignore[attr-defined]
    except Exception:
        log.warning("could not wake the steps waiting on puppet run %s", run.pk, exc_info=True)  # type: ignore[attr-defined]
