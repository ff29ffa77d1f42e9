"""A report answered 202 survives a worker killed mid-parse and a broker that loses its
message: real Celery worker processes on Redis, and the periodic sweeper."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from tests.events_helpers import big_report, post
from triggers.models import Event, Trigger
from triggers.tasks import requeue_received_before

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


class Worker:
    """`celery worker` in its own process, on the tests' Redis db and test database."""

    def __init__(self) -> None:
        db = connection.settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        }
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "relay",
                "worker",
                "--pool",
                "solo",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()  # messages earlier tests queued for events that are gone
    yield client
    client.flushdb()


@pytest.fixture
def token():
    owner = User.objects.create_user("ops")
    return str(Trigger.create_with_token(owner=owner, name="t")[1])


def wait_until(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


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
    assert broker.llen("celery") == 1
    broker.flushdb()  # the broker restarts without its queue
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
