"""The worker's side of an event: read it, summarise it, offload its large parts, filter it."""

import hashlib
import json
import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from triggers import objects, parsing, slack
from triggers.models import BodyFormat, Event, EventState
from triggers.objects import body_name, part_name
from triggers.reports import analyse, events_of, logs_of

log = logging.getLogger(__name__)


def read(event: Event, data: bytes) -> Any:
    """The document as plain data, or UnreadableReport."""
    # A node needs a few bytes of text, unless aliases multiply it: anything far beyond is a bomb.
    budget = 1_000_000 + len(data) // 2
    if event.body_format == BodyFormat.YAML:
        return parsing.read_yaml(data, budget)
    return parsing.plain(parsing.load_json(data), budget)


def offload(value: Any) -> dict[str, Any]:
    """Store a part as JSON under its SHA-256; returns {name, size, sha256}."""
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    sha256 = hashlib.sha256(data).hexdigest()
    name = part_name(sha256)
    storage = storages["events"]
    if not storage.exists(name):
        storage.save(name, ContentFile(data))
    return {"name": name, "size": len(data), "sha256": sha256}


def process(event_id: str) -> None:
    """Idempotent: an event that is not `received` any more is left as it is. Storage and
    database errors propagate (the task retries); an unreadable document fails the event."""
    event = Event.objects.select_related("trigger").filter(pk=event_id, state=EventState.RECEIVED).first()
    if event is None:
        return
    Event.objects.filter(pk=event.pk).update(attempts=event.attempts + 1)
    with storages["events"].open(body_name(event.body_sha256), "rb") as body:
        data = body.read()
    try:
        analysed = analyse(read(event, data))
    except parsing.UnreadableReport as exc:
        _finish(event, EventState.FAILED, failure_reason=str(exc))
        log.info("event %s failed: %s", event.pk, exc)
        return

    # Large parts go to storage now, before the event points at them.
    parts = {
        "report": offload(analysed.report),
        "logs": offload(logs_of(analysed.report)),
        "events": offload(events_of(analysed.report)),
    }
    trigger = event.trigger
    matched, filter_note = trigger.filters().verdict(analysed.summary, analysed.resources)
    state = EventState.MATCHED if matched else EventState.FILTERED
    send_message = state == EventState.MATCHED and trigger.has_slack_webhook
    found = {
        "notification": "pending" if send_message else "",
        "filter_note": filter_note,
        "summary": analysed.summary,
        "parts": parts,
        "host": analysed.summary["host"][:255],
        "status": analysed.summary["status"],
        "transaction_uuid": str(analysed.summary.get("transaction_uuid") or "")[:64],
        "key": analysed.key,
    }
    try:
        with transaction.atomic():
            if _finish(event, state, **found) and send_message:
                transaction.on_commit(lambda: _queue_notification(event.pk))
    except IntegrityError:
        # Another event of this trigger holds the same transaction_uuid or key (the unique
        # indexes say so, race-free): this one is a resend.
        original = _original(event, found["transaction_uuid"], found["key"])
        _finish(event, EventState.DUPLICATE, duplicate_of=original, **{**found, "notification": ""})


def _original(event: Event, transaction_uuid: str, key: str) -> Event | None:
    same = Q(transaction_uuid=transaction_uuid) if transaction_uuid else Q()
    if key:
        same = same | Q(key=key) if transaction_uuid else Q(key=key)
    return (
        Event.objects.filter(same, trigger=event.trigger, state__in=(EventState.MATCHED, EventState.FILTERED))
        .exclude(pk=event.pk)
        .first()
    )


def _finish(event: Event, state: str, **fields: Any) -> bool:
    # Only from `received`: a second delivery of the same task changes nothing.
    with transaction.atomic():
        finished = bool(
            Event.objects.filter(pk=event.pk, state=EventState.RECEIVED).update(
                state=state, processed_at=timezone.now(), **fields
            )
        )
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


def _queue_notification(event_id: object) -> None:
    from triggers.tasks import notify_slack

    try:
        notify_slack.delay(str(event_id))
    except Exception:
        log.warning("could not queue the notification of event %s", event_id)


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
