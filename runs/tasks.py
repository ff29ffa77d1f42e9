import logging

from celery import shared_task
from django.utils import timezone

from runs import models

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
