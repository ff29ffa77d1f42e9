"""A report answered 202 survives a worker killed mid-parse and a broker that loses its
message: real Celery worker processes on Redis, and the periodic sweeper."""

import time

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from tests.events_helpers import Worker, big_report, clear_queues, post, queue_key, wait_until
from triggers.models import Event, Trigger
from triggers.tasks import requeue_received_before

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    clear_queues(client)  # messages earlier tests queued for events that are gone
    yield client
    clear_queues(client)


@pytest.fixture
def token():
    owner = User.objects.create_user("ops")
    return str(Trigger.create_with_token(owner=owner, name="t")[1])


def test_a_worker_killed_mid_parse_loses_nothing(broker, token):
    worker = Worker()
    try:
        event_id = post(token, big_report(3000)).json()["id"]  # about 4 MB: seconds to read
        # The worker has started on it (attempts counts), but not finished.
        wait_until(lambda: Event.objects.get(pk=event_id).attempts == 1)
        worker.kill()
    finally:
        worker.stop()
    assert Event.objects.get(pk=event_id).state == "received"

    worker = Worker()
    try:
        assert requeue_received_before(Event.objects.get(pk=event_id).received_at) == 0  # not stuck yet
        assert requeue_received_before(time_after_now()) == 1  # the beat's sweep, later
        wait_until(lambda: Event.objects.get(pk=event_id).state != "received")
    finally:
        worker.stop()
    event = Event.objects.get(pk=event_id)
    assert event.state == "matched" and event.summary["resources_total"] == 3000


def test_a_message_the_broker_lost_is_sent_again(broker, token):
    event_id = post(token, big_report(5)).json()["id"]
    assert broker.llen(queue_key()) == 1
    clear_queues(broker)  # the broker restarts without its queue
    worker = Worker()
    try:
        time.sleep(1)
        assert Event.objects.get(pk=event_id).state == "received"
        requeue_received_before(time_after_now())
        wait_until(lambda: Event.objects.get(pk=event_id).state != "received")
    finally:
        worker.stop()
    assert Event.objects.get(pk=event_id).state == "matched"


def time_after_now():
    from django.utils import timezone

    return timezone.now() + timezone.timedelta(seconds=1)
