import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from relay import vault
from triggers import objects, services, slack
from triggers.models import Event, EventState, WorkflowStart

log = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=8)
def process_event(self: object, event_id: str) -> None:
    """Read, summarise, offload and filter one event (triggers.services.process).

    Takes the event id, never the body. Retry policy: storage and database unavailability
    is retried after 2, 4, 8 … seconds (at most 5 minutes apart, 8 times); after that the
    event stays `received` and requeue_stuck_events sends it again. Every attempt at reading
    counts (one whose worker is lost too), and after EVENTS_MAX_ATTEMPTS the event ends
    `failed`. Anything else is no error of the worker: the event ends `failed` with the
    reason (the document is read in a child process, so no document takes the worker down)."""
    try:
        services.process(event_id)
    except Exception as exc:
        if not services.is_transient(exc):
            raise
        log.warning("event %s: %s; retrying", event_id, exc)
        raise self.retry(exc=exc, countdown=min(2 ** (self.request.retries + 1), 300)) from exc


@shared_task(bind=True, acks_late=True, max_retries=6)
def notify_slack(self: object, event_id: str) -> None:
    """Post a matched event's Slack message. Retry policy: network errors, 429 and 5xx are
    retried after 10, 20, 40 … seconds (6 times); any other answer, or the last try, is
    recorded on the event as `failed` with what Slack said."""
    try:
        services.notify(event_id)
    except slack.SlackError as exc:
        if exc.transient and self.request.retries < self.max_retries:
            raise self.retry(exc=exc, countdown=10 * 2**self.request.retries) from exc
        services.record_notification(event_id, "failed", str(exc))
    except vault.VaultUnavailable as exc:
        raise self.retry(exc=exc, countdown=10 * 2**self.request.retries) from exc


@shared_task(acks_late=True)
def requeue_stuck_events() -> int:
    """Send again the events still `received` after EVENTS_STUCK_AFTER seconds: a lost broker
    message, a dead worker or a broker that was down when the event came in loses nothing.
    So too the Slack messages and the workflow runs of matched events whose task was lost.
    (EVENTS_STUCK_AFTER must be longer than a read may take, EVENTS_READ_TIMEOUT.)"""
    return requeue_received_before(timezone.now() - timedelta(seconds=settings.EVENTS_STUCK_AFTER))


def requeue_received_before(moment: object) -> int:
    """Events received before `moment` and not being read since (an attempt that began after
    it may still be under way): those out of attempts end `failed`, the others are sent again."""
    stuck = (
        Event.objects.filter(state=EventState.RECEIVED, received_at__lt=moment)
        .filter(Q(attempted_at__isnull=True) | Q(attempted_at__lt=moment))
        .order_by("received_at")
        .only("pk", "attempts", "failure_reason")[:1000]
    )
    ids = []
    for event in stuck:
        if event.out_of_attempts:
            if event.give_up():
                log.warning("event %s failed: gave up after %d attempts", event.pk, event.attempts)
            continue
        ids.append(event.pk)
    for event_id in ids:
        process_event.delay(str(event_id))
    # Notifications whose task was lost (broker down when the event was read).
    for event_id in Event.objects.filter(notification="pending", processed_at__lt=moment).values_list(
        "pk", flat=True
    )[:1000]:
        notify_slack.delay(str(event_id))
    # Workflow runs whose start was lost the same way.
    for event_id in Event.objects.filter(
        workflow_start=WorkflowStart.PENDING, processed_at__lt=moment
    ).values_list("pk", flat=True)[:1000]:
        services.queue_workflow_start(event_id)
    if ids:
        log.info("requeued %d events stuck in received", len(ids))
    return len(ids)


@shared_task(acks_late=True)
def purge_expired_events() -> int:
    """Delete the events received more than EVENTS_RETENTION_DAYS ago (none when it is 0),
    with their stored objects (triggers.objects). Runs from beat; returns how many went."""
    if settings.EVENTS_RETENTION_DAYS <= 0:
        return 0
    return services.purge_received_before(timezone.now() - timedelta(days=settings.EVENTS_RETENTION_DAYS))


@shared_task(acks_late=True)
def delete_released_objects() -> int:
    """Delete the stored objects that deleted events released and no event refers to: those
    the delete itself did not get to (storage down, or too many to do in the request).
    Runs from beat; a storage error ends the run, and the next one tries again."""
    return objects.sweep()
