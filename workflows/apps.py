import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs.signals import run_changed
        from workflows.steps import registry

        registry.load()
        run_changed.connect(_wake_puppet_steps, dispatch_uid="workflows-wake-puppet-steps")


def _wake_puppet_steps(sender: type, run: object, **kwargs: object) -> None:
    """A Puppet run changed status (sent after its commit): the steps waiting on it look now.
    Never fails the request that changed it: a step not woken is checked at its recheck time."""
    from workflows.engine import wake

    try:
        wake("puppet-run", str(run.pk))  # type: ignore[attr-defined]
    except Exception:
        log.warning("could not wake the steps waiting on puppet run %s", run.pk, exc_info=True)  # type: ignore[attr-defined]
