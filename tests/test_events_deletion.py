"""Deleting events deletes their stored bodies and parts, once no event refers to them; the
retention purge; the sweep that finishes what a delete could not. Real commits (transactional
tests), so what runs after the commit runs, against PostgreSQL and the filesystem storage."""

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.files.storage import storages
from django.db import connections, transaction
from django.test import Client
from django.utils import timezone

from tests.events_helpers import big_report, post
from triggers import objects, services
from triggers.models import Event, ReleasedObject, Trigger
from triggers.objects import body_name
from triggers.tasks import delete_released_objects, purge_expired_events

pytestmark = pytest.mark.django_db(transaction=True)


def make_trigger(owner: User, name: str = "reports") -> tuple[Trigger, str]:
    trigger, token = Trigger.create_with_token(owner=owner, name=name)
    return trigger, str(token)


def ingest(token: str, body: bytes) -> Event:
    response = post(token, body)
    assert response.status_code == 202, response.content
    services.process(response.json()["id"])
    return Event.objects.get(pk=response.json()["id"])


def names(event: Event) -> set[str]:
    """The event's objects in the events storage: its body and its parts."""
    assert set(event.parts) == {"report", "logs", "events"}
    return {body_name(event.body_sha256), *(part["name"] for part in event.parts.values())}


def stored(names: set[str]) -> set[str]:
    return {name for name in names if storages["events"].exists(name)}


def test_deleting_an_event_through_the_api_deletes_its_body_and_parts(alice, alice_api):
    trigger, token = make_trigger(alice)
    event = ingest(token, big_report(3, host="web1.example.com"))
    mine = names(event)
    assert stored(mine) == mine

    response = alice_api.delete(f"/api/triggers/{trigger.pk}/events/{event.pk}/")
    assert response.status_code == 204
    assert not Event.objects.filter(pk=event.pk).exists()
    assert stored(mine) == set()
    assert ReleasedObject.objects.count() == 0


def test_an_object_two_events_share_stays_until_the_second_goes(alice, alice_api):
    report = big_report(3)
    first_trigger, first_token = make_trigger(alice, "first")
    second_trigger, second_token = make_trigger(alice, "second")
    first = ingest(first_token, report)
    second = ingest(second_token, report)  # the same body: the same objects
    assert names(first) == names(second)
    shared = names(first)

    assert alice_api.delete(f"/api/triggers/{first_trigger.pk}/events/{first.pk}/").status_code == 204
    assert stored(shared) == shared
    body = alice_api.get(f"/api/triggers/{second_trigger.pk}/events/{second.pk}/parts/body")
    assert b"".join(body.streaming_content) == report

    assert alice_api.delete(f"/api/triggers/{second_trigger.pk}/events/{second.pk}/").status_code == 204
    assert stored(shared) == set()
    assert ReleasedObject.objects.count() == 0


def test_deleting_a_trigger_deletes_its_events_objects_but_not_what_another_trigger_shares(alice, alice_api):
    doomed, doomed_token = make_trigger(alice, "doomed")
    _, kept_token = make_trigger(alice, "kept")
    shared_report = big_report(2, host="shared.example.com")
    own = [ingest(doomed_token, big_report(2, host=f"web{i}.example.com")) for i in range(3)]
    ingest(doomed_token, shared_report)
    kept = ingest(kept_token, shared_report)
    kept_names = names(kept)
    own_names = set().union(*(names(event) for event in own)) - kept_names
    assert stored(own_names) == own_names

    assert alice_api.delete(f"/api/triggers/{doomed.pk}/").status_code == 204
    assert stored(own_names) == set()
    assert stored(kept_names) == kept_names
    assert list(Event.objects.all()) == [kept]


def test_deleting_a_user_deletes_the_objects_of_their_triggers_events(alice, bob):
    _, token = make_trigger(bob)
    events = [ingest(token, big_report(2, host=f"db{i}.example.com")) for i in range(2)]
    theirs = set().union(*(names(event) for event in events))

    bob.delete()
    assert not Event.objects.exists()
    assert stored(theirs) == set()


def test_the_admin_deletes_events_with_their_objects(alice, staff):
    _, token = make_trigger(alice)
    doomed = [ingest(token, big_report(2, host=f"app{i}.example.com")) for i in range(2)]
    left = ingest(token, big_report(2, host="left.example.com"))
    doomed_names = set().union(*(names(event) for event in doomed)) - names(left)
    admin = Client()
    admin.force_login(staff)

    page = admin.post(f"/admin/triggers/event/{doomed[0].pk}/delete/", {"post": "yes"})
    assert page.status_code == 302
    page = admin.post(
        "/admin/triggers/event/",
        {"action": "delete_selected", "_selected_action": [str(doomed[1].pk)], "post": "yes"},
    )
    assert page.status_code == 302
    assert list(Event.objects.all()) == [left]
    assert stored(doomed_names) == set()
    assert stored(names(left)) == names(left)


def test_objects_go_when_the_delete_commits_not_before(alice):
    _, token = make_trigger(alice)
    event = ingest(token, big_report(2))
    mine = names(event)

    with pytest.raises(RuntimeError), transaction.atomic():
        Event.objects.filter(pk=event.pk).delete()
        assert stored(mine) == mine  # deleted in this transaction, but not committed yet
        raise RuntimeError("roll back")
    assert Event.objects.filter(pk=event.pk).exists()
    assert stored(mine) == mine
    assert ReleasedObject.objects.count() == 0

    with transaction.atomic():
        Event.objects.filter(pk=event.pk).delete()
        assert stored(mine) == mine
    assert stored(mine) == set()


def test_what_a_delete_leaves_for_later_the_sweep_deletes(alice, alice_api, monkeypatch):
    monkeypatch.setattr(objects, "DELETE_AFTER_COMMIT", 2)
    trigger, token = make_trigger(alice)
    events = [ingest(token, big_report(2, host=f"n{i}.example.com")) for i in range(3)]
    theirs = set().union(*(names(event) for event in events))

    assert alice_api.delete(f"/api/triggers/{trigger.pk}/").status_code == 204
    assert len(stored(theirs)) == len(theirs) - 2  # two right after the commit
    assert ReleasedObject.objects.count() == len(theirs) - 2
    assert delete_released_objects() == len(theirs) - 2
    assert stored(theirs) == set()
    assert ReleasedObject.objects.count() == 0


def test_a_report_sent_again_before_the_sweep_keeps_its_body(alice, alice_api, monkeypatch):
    monkeypatch.setattr(objects, "DELETE_AFTER_COMMIT", 0)  # everything waits for the sweep
    trigger, token = make_trigger(alice)
    report = big_report(2)
    event = ingest(token, report)
    assert alice_api.delete(f"/api/triggers/{trigger.pk}/events/{event.pk}/").status_code == 204
    assert ReleasedObject.objects.filter(name=body_name(event.body_sha256)).exists()

    again = ingest(token, report)  # the body is in storage still: not saved again, but claimed
    assert not ReleasedObject.objects.filter(name=body_name(event.body_sha256)).exists()
    delete_released_objects()
    assert stored(names(again)) == names(again)
    body = alice_api.get(f"/api/triggers/{trigger.pk}/events/{again.pk}/parts/body")
    assert b"".join(body.streaming_content) == report


class HeldIngest:
    """An ingest of a body stopped inside its transaction, after its claim, until release()."""

    def __init__(self, event: Event) -> None:
        self.event = event
        self.claimed, self.commit = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.claimed.wait(10)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                assert objects.claim([body_name(self.event.body_sha256)]) == []  # still there
                Event.objects.create(
                    trigger_id=self.event.trigger_id,
                    body_format="yaml",
                    body_sha256=self.event.body_sha256,
                    body_size=self.event.body_size,
                )
                self.claimed.set()
                self.commit.wait(10)
        finally:
            connections.close_all()

    def release(self) -> None:
        self.commit.set()
        self.thread.join(10)


def in_a_thread(work) -> threading.Thread:
    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_deleter_waits_for_a_reference_being_added_and_then_sees_it(alice, monkeypatch):
    """The race in triggers.objects: an ingest holds its claim on a body, uncommitted, while
    the sweep would delete the body, released by its only other event's delete. The deleter
    waits for the claim's commit, then sees the new event and keeps the body."""
    monkeypatch.setattr(objects, "DELETE_AFTER_COMMIT", 0)
    _, token = make_trigger(alice)
    event = ingest(token, big_report(2))
    name = body_name(event.body_sha256)
    event.delete()
    assert ReleasedObject.objects.filter(name=name).exists()

    held = HeldIngest(event)
    deleted: list[int] = []
    deleter = in_a_thread(lambda: deleted.append(objects.delete_released([name])))
    deleter.join(1.0)
    assert deleter.is_alive(), "the deleter waits for the claim"
    held.release()
    deleter.join(10)
    assert deleted == [0]
    assert storages["events"].exists(name)
    assert Event.objects.filter(body_sha256=event.body_sha256).count() == 1


def test_a_delete_while_a_reference_is_being_added_waits_for_it_and_then_sees_it(alice):
    """The other order: no release pending when the ingest claims the body; then the body's
    other event is deleted. Its release waits for the claim's commit, and after its own commit
    the deleter sees the new event."""
    _, token = make_trigger(alice)
    event = ingest(token, big_report(2))
    name = body_name(event.body_sha256)

    held = HeldIngest(event)
    deleter = in_a_thread(lambda: Event.objects.filter(pk=event.pk).delete())
    deleter.join(1.0)
    assert deleter.is_alive(), "the release waits for the claim"
    held.release()
    deleter.join(10)
    assert not Event.objects.filter(pk=event.pk).exists()
    assert storages["events"].exists(name)
    assert Event.objects.filter(body_sha256=event.body_sha256).count() == 1


def test_the_purge_deletes_old_events_with_their_objects_and_keeps_young_ones(alice, settings):
    settings.EVENTS_RETENTION_DAYS = 30
    _, token = make_trigger(alice)
    old = ingest(token, big_report(2, host="old.example.com"))
    young = ingest(token, big_report(2, host="young.example.com"))
    shared = big_report(2, host="shared.example.com")
    old_shared = ingest(token, shared)
    _, other_token = make_trigger(alice, "other")
    young_shared = ingest(other_token, shared)
    long_ago = timezone.now() - timedelta(days=30, minutes=1)
    Event.objects.filter(pk__in=[old.pk, old_shared.pk]).update(received_at=long_ago)
    Event.objects.filter(pk=young.pk).update(received_at=timezone.now() - timedelta(days=29))
    old_names = names(old) - names(young) - names(young_shared)

    assert purge_expired_events() == 2
    assert set(Event.objects.all()) == {young, young_shared}
    assert stored(old_names) == set()
    assert stored(names(young)) == names(young)
    assert stored(names(young_shared)) == names(young_shared)


def test_the_purge_goes_in_bounded_batches_and_zero_days_turns_it_off(alice, settings, monkeypatch):
    monkeypatch.setattr(services, "PURGE_BATCH", 2)
    monkeypatch.setattr(services, "PURGE_MAX_BATCHES", 2)
    _, token = make_trigger(alice)
    for i in range(5):
        post(token, f"host: old{i}\nstatus: changed\n".encode())
    Event.objects.update(received_at=timezone.now() - timedelta(days=8))

    settings.EVENTS_RETENTION_DAYS = 0
    assert purge_expired_events() == 0
    settings.EVENTS_RETENTION_DAYS = 7
    assert purge_expired_events() == 4  # two batches of two
    assert purge_expired_events() == 1
    assert not Event.objects.exists()


def test_beat_runs_the_purge_and_the_sweep():
    from django.conf import settings

    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"triggers.tasks.purge_expired_events", "triggers.tasks.delete_released_objects"} <= tasks


def test_a_part_deleted_while_the_worker_offloads_it_is_saved_again(alice, monkeypatch):
    """The worker's side of the race: its part was in storage when it offloaded, and was
    deleted before its event referred to it. Claiming finds it gone; the retry saves it."""
    _, token = make_trigger(alice)
    first = ingest(token, big_report(2))
    part = first.parts["logs"]["name"]  # another run of the same changes: the same logs
    response = post(token, big_report(2))
    assert response.status_code == 202
    second_id = response.json()["id"]
    assert second_id != str(first.pk)
    offload = services._offload  # the worker's step that stores a part the reader wrote

    def offload_then_lose(written: object) -> dict:
        meta = offload(written)
        if meta["name"] == part:  # just now, its other event goes, and the part with it
            Event.objects.filter(pk=first.pk).delete()
            assert not storages["events"].exists(part)
        return meta

    monkeypatch.setattr(services, "_offload", offload_then_lose)
    with pytest.raises(objects.Vanished):
        services.process(second_id)
    assert Event.objects.get(pk=second_id).state == "received"
    monkeypatch.setattr(services, "_offload", offload)
    services.process(second_id)  # the task's retry
    second = Event.objects.get(pk=second_id)
    assert second.state == "matched"
    assert stored(names(second)) == names(second)


def test_an_event_deleted_while_the_worker_reads_it_leaves_no_parts(alice, monkeypatch):
    _, token = make_trigger(alice)
    event_id = post(token, big_report(2, host="gone.example.com")).json()["id"]
    offload = services._offload
    saved: list[str] = []

    def offload_while_deleted(written: object) -> dict:
        meta = offload(written)
        saved.append(meta["name"])
        Event.objects.filter(pk=event_id).delete()
        return meta

    monkeypatch.setattr(services, "_offload", offload_while_deleted)
    services.process(event_id)
    assert not Event.objects.filter(pk=event_id).exists()
    assert len(saved) == 3 and stored(set(saved)) == set()
