"""The worker's side of an event: read it, summarise it, offload its large parts, filter it."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import DatabaseError, DataError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from relay import dispatch
from relay.api.parsers import RefusedJSON, read_json
from triggers import objects, reader, slack
from triggers.models import Event, EventState, TriggerKind, WorkflowStart
from triggers.objects import body_name, part_name

log = logging.getLogger(__name__)


class StorageUnavailable(Exception):
    """The events storage did not answer as it should (a later try may succeed). The message,
    shown on the event, names no path or bucket; the log has the backend's error."""


@contextmanager
def _storage(what: str) -> Iterator[Storage]:
    # Whatever the backend raises (OSError from files, botocore's errors from S3) is an
    # outage to retry, never a reason to fail the event.
    try:
        yield storages["events"]
    except Exception as exc:
        log.warning("the events storage could not %s: %s", what, exc)
        raise StorageUnavailable(f"The events storage could not {what} ({type(exc).__name__}).") from exc


def is_transient(exc: BaseException) -> bool:
    """Storage or database unavailable: worth another try. Data the database refuses is not."""
    if isinstance(exc, StorageUnavailable | objects.Vanished):
        return True
    return isinstance(exc, DatabaseError) and not isinstance(exc, DataError | IntegrityError)


def process(event_id: str) -> None:
    """Idempotent: an event that is not `received` any more is left as it is. Storage and
    database unavailability propagate (the task retries); anything else ends the event
    `failed` with the reason, and so does an event out of attempts (EVENTS_MAX_ATTEMPTS)."""
    event = Event.objects.select_related("trigger").filter(pk=event_id).first()
    if event is None:
        log.warning(
            "event %s is not in this database, dropped: a task of another deployment on the "
            "same broker? Give each deployment its own RELAY_DEPLOYMENT_ID.",
            event_id,
        )
        return
    if event.state != EventState.RECEIVED:
        return
    if event.out_of_attempts:
        if event.give_up():
            log.warning("event %s failed: gave up after %d attempts", event.pk, event.attempts)
        return
    try:
        if event.trigger.kind == TriggerKind.WEBHOOK:
            _process_webhook(event)
        else:
            _process(event)
    except Exception as exc:
        if is_transient(exc):
            _note(event, exc)
            raise
        log.exception("event %s failed", event.pk)
        with transaction.atomic():
            event.fail(f"The report could not be processed: {_reason(exc)}"[:1000])


def _reason(exc: Exception) -> str:
    # The database's own message quotes the SQL it refused, and with it the event's data:
    # that is for the worker's log (above), not for the event list.
    if isinstance(exc, DatabaseError):
        return f"the database refused what was read ({type(exc).__name__}); the worker's log has why."
    return f"{type(exc).__name__}: {exc}"


def _note(event: Event, exc: BaseException) -> None:
    error = (
        str(exc) if isinstance(exc, StorageUnavailable) else f"The database failed ({type(exc).__name__})."
    )
    try:
        event.note_error(error)
    except DatabaseError:
        pass  # the database is what is down


def _process(event: Event) -> None:
    with _storage("read the body") as storage:
        body = storage.open(body_name(event.body_sha256), "rb")
        try:
            body.fileno()  # S3: downloaded now, where its errors are storage errors
        except BaseException:
            body.close()
            raise
    with body:
        if not event.start_attempt():
            return  # another delivery has finished it meanwhile
        try:
            read = reader.read(body, event.body_format, event.trigger.filters())
        except reader.Failed as exc:
            _log_read(event, exc.seconds, exc.peak_rss, f"failed: {exc}")
            if exc.detail:
                log.warning("event %s: the reader raised\n%s", event.pk, exc.detail)
            event.fail(str(exc))
            return
    try:
        _log_read(event, read.seconds, read.peak_rss, "read")
        # Large parts go to storage now, before the event points at them.
        parts = {name: _offload(part) for name, part in read.parts.items()}
    finally:
        read.close()
    _record(event, read, parts)


def _process_webhook(event: Event) -> None:
    """A webhook trigger's body is its event's data as it is: a JSON object of at most
    WEBHOOK_MAX_BODY_BYTES, checked at the door (triggers.webhooks), read here again from
    storage. It matches (a webhook trigger has no filters) and starts its workflow's run."""
    with _storage("read the body") as storage, storage.open(body_name(event.body_sha256), "rb") as body:
        raw = body.read(settings.WEBHOOK_MAX_BODY_BYTES + 1)
    if not event.start_attempt():
        return  # another delivery has finished it meanwhile
    try:
        # The door's reader: a body stored before the door refused what it refuses now fails
        # here with its reason, not with the database's.
        data = read_json(raw)
    except RefusedJSON as exc:
        event.fail(f"The body is not JSON this service takes: {exc}"[:1000])
        return
    if not isinstance(data, dict) or len(raw) > settings.WEBHOOK_MAX_BODY_BYTES:
        event.fail("The body is not a JSON object of at most WEBHOOK_MAX_BODY_BYTES bytes.")
        return
    found = {
        "data": data,
        "workflow_start": WorkflowStart.PENDING if event.trigger.workflow_id else WorkflowStart.NONE,
        "key": event.key,
        "failure_reason": "",
    }
    try:
        with transaction.atomic():
            if event.finish(EventState.MATCHED, **found) and event.trigger.workflow_id:
                transaction.on_commit(lambda: queue_workflow_start(event.pk))
    except IntegrityError:
        # Another event of this trigger with the same Idempotency-Key won the unique index.
        original = _original(event, "", event.key)
        event.finish(EventState.DUPLICATE, duplicate_of=original, data=found["data"], failure_reason="")


def _log_read(event: Event, seconds: float, peak_rss: int, outcome: str) -> None:
    log.info(
        "event %s: %s (%.2f s; the reader's peak RSS %d MB)",
        event.pk,
        outcome,
        seconds,
        peak_rss // 2**20,
        extra={"reader_peak_rss": peak_rss},
    )


def _offload(part: reader.Part) -> dict[str, Any]:
    """Store a part (JSON) under its SHA-256; returns {name, size, sha256}."""
    name = part_name(part.sha256)
    with _storage("store a part") as storage:
        if not storage.exists(name):
            storage.save(name, File(part.file, name=name))
    return {"name": name, "size": part.size, "sha256": part.sha256}


def _record(event: Event, read: reader.Read, parts: dict[str, Any]) -> None:
    trigger = event.trigger
    summary = read.summary
    state = EventState.MATCHED if read.matched else EventState.FILTERED
    send_message = state == EventState.MATCHED and trigger.has_slack_webhook
    start_run = state == EventState.MATCHED and trigger.workflow_id is not None
    found = {
        "notification": "pending" if send_message else "",
        "workflow_start": WorkflowStart.PENDING if start_run else WorkflowStart.NONE,
        "filter_note": read.filter_note,
        "summary": summary,
        "data": read.data,
        "parts": parts,
        "host": summary["host"][:255],
        "status": summary["status"],
        "transaction_uuid": str(summary.get("transaction_uuid") or "")[:64],
        "key": read.key,
        "failure_reason": "",
    }
    try:
        with transaction.atomic():
            if _finish(event, state, **found):
                if send_message:
                    transaction.on_commit(lambda: _queue_notification(event.pk))
                if start_run:
                    # The run is started by a task of its own, once this is on record: not
                    # here, where a workflow's trouble would hold the event up.
                    transaction.on_commit(lambda: queue_workflow_start(event.pk))
    except IntegrityError:
        # Another event of this trigger holds the same transaction_uuid or key (the unique
        # indexes say so, race-free): this one is a resend.
        original = _original(event, found["transaction_uuid"], found["key"])
        resend = {**found, "notification": "", "workflow_start": WorkflowStart.NONE}
        _finish(event, EventState.DUPLICATE, duplicate_of=original, **resend)


def _finish(event: Event, state: str, **fields: Any) -> bool:
    with transaction.atomic():
        finished = event.finish(state, **fields)
        # The parts were saved (or found) before this transaction: claim them in it (see
        # triggers.objects). Update first, claim second: a delete of this event locks its row
        # before it releases names, so waiting for that lock while holding no claim cannot
        # deadlock.
        names = [part["name"] for part in fields.get("parts", {}).values()]
        if names and finished and objects.claim(names):
            raise objects.Vanished(f"a part of event {event.pk} was deleted meanwhile")
        if names and not finished:
            # Deleted (or finished by another delivery) meanwhile: the parts may be no one's.
            objects.release(names)
    return finished


def _original(event: Event, transaction_uuid: str, key: str) -> Event | None:
    same = Q(transaction_uuid=transaction_uuid) if transaction_uuid else Q()
    if key:
        same = same | Q(key=key) if transaction_uuid else Q(key=key)
    return (
        Event.objects.filter(same, trigger=event.trigger, state__in=(EventState.MATCHED, EventState.FILTERED))
        .exclude(pk=event.pk)
        .first()
    )


def _queue_notification(event_id: object) -> None:
    dispatch.publish_or_log(
        "triggers.tasks.notify_slack", str(event_id), what=f"the notification of event {event_id}"
    )


def queue_workflow_start(event_id: object) -> None:
    """Queue the start of the run a workflow trigger's matched event asks for (by the task's
    name: the workflows app is above this one). A broker that is down loses nothing:
    requeue_stuck_events sends it again."""
    dispatch.publish_or_log(
        "workflows.tasks.start_run_for_event", str(event_id), what=f"the workflow run of event {event_id}"
    )


def notify(event_id: str) -> None:
    """Send the Slack message of a matched event, once. Raises SlackError when it could not
    be delivered (its `transient` says whether to try again)."""
    event = Event.objects.select_related("trigger").filter(pk=event_id, notification="pending").first()
    if event is None:
        return
    trigger = event.trigger
    filters = trigger.filters()
    link = f"{settings.RELAY_PUBLIC_URL}/api/triggers/{trigger.pk}/events/{event.pk}/"
    url = trigger.slack_webhook_url()
    if not url:
        record_notification(event_id, "failed", "The trigger has no Slack webhook any more.")
        return
    slack.post_message(url, slack.message(event.summary, filters.matching(event.summary["resources"]), link))
    record_notification(event_id, "sent", "")


def record_notification(event_id: str, outcome: str, detail: str) -> None:
    Event.objects.filter(pk=event_id, notification="pending").update(
        notification=outcome, notification_detail=detail[:2000], notified_at=timezone.now()
    )


PURGE_BATCH = 500
PURGE_MAX_BATCHES = 10


def purge_received_before(moment: datetime) -> int:
    """Delete events received before `moment`, oldest first, in transactions of PURGE_BATCH
    (short row locks), at most PURGE_MAX_BATCHES a run; returns how many went. Their stored
    objects are released with them and deleted once no event refers to them."""
    purged = 0
    for _ in range(PURGE_MAX_BATCHES):
        ids = list(
            Event.objects.filter(received_at__lt=moment)
            .order_by("received_at")
            .values_list("pk", flat=True)[:PURGE_BATCH]
        )
        if not ids:
            break
        _, deleted = Event.objects.filter(pk__in=ids).delete()
        purged += deleted.get(Event._meta.label, 0)
    if purged:
        log.info("purged %d events received before %s", purged, moment.isoformat())
    return purged
