"""The objects events keep in the `events` storage, and when they are deleted.

Bodies (`bodies/aa/bb/<sha256>`) and parts (`parts/aa/bb/<sha256>.json`) are named by their
content, so several events may share one: the same report sent to two triggers, the `[]` of
every report without logs. An object goes only when no event refers to it any more:

- Deleting events releases their objects: one ReleasedObject row each, written in the
  deleting transaction (EventQuerySet.delete, Event.delete, and a trigger's pre_delete, which
  also covers a trigger deleted with its user), so a delete that commits cannot lose them.
- After the commit, delete_released() deletes each released object that no event refers to,
  looked up in the database then, and drops its row. If storage fails, the row stays and
  triggers.tasks.delete_released_objects tries again every EVENTS_SWEEP_INTERVAL.

The race: an ingest of the same body (or a worker offloading the same part) may have seen the
object in storage, and so not saved it, while its event is not committed yet. A deleter that
looked for references then would not see that event, would delete the object, and the event
would commit pointing at nothing. Looking again after the commit does not help either (the
ingest may look just before the deletion). So both sides write the name's row, which orders
them. Whoever adds a reference claims the name in the transaction that adds it (claim(): an
upsert of the row, then its delete) and only then checks that the object is still there,
saving it again if not. The deleter takes the row with a write before it looks for
references. So: a deleter that took the row first has deleted the object and committed
before the claim goes on, and the claim saves the object again; a claim that came first
cancels the pending release, and the deleter, once the claim commits, finds no row; with no
release pending, the claim's insert makes a release of the name (another event's delete) wait
for the claim's commit, after which the deleter sees the new event. Writes rather than
SELECT … FOR UPDATE, so that SQLite (`make run`, no row locks) serialises them the same way,
through its database write lock.

Not covered: a body saved by a request whose database write then failed (a resend of the
report uses it again), and deletes that bypass the ORM.
"""

import logging
import math
import time
from collections.abc import Iterable

from django.core.files.storage import storages
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from django.utils import timezone

from triggers.models import PART_KINDS, Event, ReleasedObject, Trigger, events_deleting

log = logging.getLogger(__name__)
# Names deleted right after the commit that released them; more (a large trigger, a purge
# batch) wait for the sweep, so that a delete request does not wait for thousands of them.
DELETE_AFTER_COMMIT = 100
SWEEP_BATCH = 5000
SWEEP_SECONDS = 40.0


class Vanished(OSError):
    """An object an event was about to refer to was deleted meanwhile: try again."""


def body_name(sha256: str) -> str:
    return f"bodies/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def part_name(sha256: str) -> str:
    return f"parts/{sha256[:2]}/{sha256[2:4]}/{sha256}.json"


def claim(names: Iterable[str]) -> list[str]:
    """Call in the transaction that makes an event refer to `names`, before it commits.
    Returns the names not in storage any more: the caller saves them again, or fails."""
    names = sorted(set(names))  # one order for every claimer: no deadlock between two
    ReleasedObject.objects.bulk_create(
        [ReleasedObject(name=name) for name in names],
        update_conflicts=True,
        unique_fields=["name"],
        update_fields=["queued_at"],
    )
    ReleasedObject.objects.filter(name__in=names).delete()
    storage = storages["events"]
    return [name for name in names if not storage.exists(name)]


def release(names: Iterable[str]) -> None:
    """Call in the transaction that removes references to `names`: they are deleted after it
    commits, unless another event still refers to them."""
    names = sorted(set(names))
    for start in range(0, len(names), 1000):
        ReleasedObject.objects.bulk_create(
            [ReleasedObject(name=name) for name in names[start : start + 1000]], ignore_conflicts=True
        )
    soon = names[:DELETE_AFTER_COMMIT]
    if soon:
        # robust: a failure here is logged, never raised into the request that committed.
        transaction.on_commit(lambda: delete_released(soon), robust=True)


def release_events(events: QuerySet[Event]) -> None:
    """Release the objects of `events`, which the caller's transaction is deleting."""
    # Locked, so that a worker cannot give one of them parts between this read and the delete
    # (it waits, then finds the event gone and releases its parts itself).
    # (Through a subquery, so that whatever the caller's queryset holds, DISTINCT or joins, the
    # lock takes only these rows.)
    locked = Event.objects.filter(pk__in=events.order_by().values("pk")).select_for_update()
    rows = locked.order_by("pk").values_list("body_sha256", "parts")
    names: set[str] = set()
    for sha256, parts in rows.iterator(chunk_size=2000):
        names.add(body_name(sha256))
        names.update(part["name"] for part in parts.values())
    release(names)


@receiver(events_deleting, sender=Event)
def _release_deleted_events(sender: type, events: QuerySet[Event], **kwargs: object) -> None:
    release_events(events)


@receiver(pre_delete, sender=Trigger)
def _release_trigger_events(sender: type, instance: Trigger, **kwargs: object) -> None:
    # A signal, so that the admin's bulk delete and a user's cascade count too; pre_delete runs
    # in the deleting transaction, while the events are still there to read.
    release_events(Event.objects.filter(trigger=instance))


def is_referenced(name: str) -> bool:
    """Does an event refer to this stored object? (Unknown names count as referenced.)"""
    if name.startswith("bodies/"):
        return Event.objects.filter(body_sha256=name.rpartition("/")[2]).exists()
    if name.startswith("parts/"):
        same = Q()
        for kind in PART_KINDS:
            same |= Q(**{f"parts__{kind}__name": name})
        return Event.objects.filter(same).exists()
    return True


def delete_released(names: Iterable[str], deadline: float = math.inf) -> int:
    """Delete the released objects among `names` that no event refers to; returns how many.
    Stops at the first error (storage is probably down), leaving the rest for the sweep, and
    at `deadline` (time.monotonic())."""
    storage = storages["events"]
    deleted = 0
    for name in names:
        if time.monotonic() >= deadline:
            break
        try:
            with transaction.atomic():
                # Take the row first (see the module's docstring); none: a claim cancelled the
                # release, or another deleter got there first.
                if not ReleasedObject.objects.filter(name=name).update(queued_at=F("queued_at")):
                    continue
                if not is_referenced(name):
                    storage.delete(name)
                    deleted += 1
                ReleasedObject.objects.filter(name=name).delete()
        except Exception as exc:  # storage errors are OSError, botocore's own, …
            log.warning("stored object %s left for the sweep: %s", name, exc)
            _requeue(name)
            break
    return deleted


def _requeue(name: str) -> None:
    # To the back of the queue, so that one object that cannot be deleted does not stop the rest.
    try:
        ReleasedObject.objects.filter(name=name).update(queued_at=timezone.now())
    except Exception:  # the database may be what failed
        log.warning("could not requeue stored object %s", name)


def sweep() -> int:
    """Delete released objects, oldest first: at most SWEEP_BATCH, for at most SWEEP_SECONDS
    (so that runs every EVENTS_SWEEP_INTERVAL do not pile up on a slow store)."""
    deadline = time.monotonic() + SWEEP_SECONDS
    names = list(ReleasedObject.objects.order_by("queued_at").values_list("name", flat=True)[:SWEEP_BATCH])
    deleted = delete_released(names, deadline)
    if names:
        log.info("released objects: %d deleted from storage, %d queued before this run", deleted, len(names))
    return deleted
