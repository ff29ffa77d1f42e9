import logging

from celery import shared_task
from django.db import DatabaseError
from django.utils import timezone

from runs import models, rollouts

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def expire_runs() -> int:
    """Complete overdue runs as `timed-out` (see runs.models.expire_runs). Runs every
    RUN_EXPIRY_INTERVAL seconds from beat; a missed or doubled run is harmless, since each
    expiry is a compare-and-set."""
    expired = models.expire_runs(timezone.now())
    if expired:
        log.info("%d runs timed out", expired)
    return expired


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=5)
def advance_rollout(rollout_id: str) -> None:
    """Move a rollout on (runs.rollouts.advance): queued when one of its batches' runs ends,
    again when its pause is over, and by the sweep. A duplicate does nothing twice (each
    step is a compare-and-set); a database error is retried after 1, 2, 4 … seconds, and
    whatever is lost the sweep sends again."""
    rollouts.advance(rollout_id)


@shared_task(acks_late=True)
def sweep_rollouts() -> int:
    """From beat, every ROLLOUT_SWEEP_INTERVAL seconds: advance the rollouts with something
    due whose message was lost (a worker restarted during a pause, a broker hiccup)."""
    return rollouts.sweep()
