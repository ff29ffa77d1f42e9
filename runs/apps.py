import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Puppet runs"  # apart from the workflows' runs
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs.signals import run_changed

        run_changed.connect(_rollout_batch_ended, dispatch_uid="runs-rollout-batch-ended")


def _rollout_batch_ended(sender: type, run: object, **kwargs: object) -> None:
    """A run changed (after its commit): when it is a rollout's batch that ended, the rollout
    moves on. Never fails the request that changed it: the beat's sweep finds what this missed."""
    from runs import rollouts

    try:
        rollouts.batch_ended(run)  # type: ignore[arg-type]
    except Exception:
        log.warning("could not look at the rollout of run %s", getattr(run, "pk", "?"), exc_info=True)
