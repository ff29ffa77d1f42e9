"""No report takes the worker down. Poison documents sent to a live service end `failed` with
a reason while real Celery worker processes go on to the next report; a worker killed
mid-read again and again gives up after EVENTS_MAX_ATTEMPTS; deployments sharing a Redis
take only their own tasks."""

import json
import uuid

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from tests.events_helpers import Worker, big_report, clear_queues, fixture, post, queue_key, wait_until
from triggers.ingest import PEEK_WHOLE_JSON
from triggers.models import Event, Trigger
from triggers.parsing import PSYCH_REPORT
from triggers.tasks import process_event, requeue_received_before

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = 50_000  # 100 KB of brackets: far beyond what a recursive reader's stack survives
PUPPET_8 = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")
POISON = {
    "nested YAML, flow": (b"host: deep\nx: " + b"[" * DEEP + b"]" * DEEP + b"\n", "application/x-yaml"),
    "nested YAML, block": (b"host: deep\nx:\n" + b"- " * DEEP + b"a\n", "application/x-yaml"),
    # Larger than the door reads whole (which refuses it at once), so that the worker reads it.
    "nested JSON": (
        b'{"host": "deep", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}" + b" " * PEEK_WHOLE_JSON,
        "application/json",
    ),
    "nested JSON as YAML": (b'{"host": "deep", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}", "text/yaml"),
    # Where the reader expects mappings and lists, numbers and strings.
    "push body of the wrong shape": (
        json.dumps(
            {
                "data": {
                    "host": "web1.example.com",
                    "status": "changed",
                    "resource_statuses": {"File[/etc/motd]": {"change_count": 1, "events": 5}},
                },
                "key": "run-1",
            }
        ).encode(),
        "application/json",
    ),
    "Puppet report of the wrong shape": (
        PSYCH_REPORT
        + b"host: web2.example.com\nstatus: changed\nresource_statuses:\n"
        + b"  File[/etc/motd]:\n    changed: true\n    tags: 7\n",
        "application/x-yaml",
    ),
}
REASONS = {
    "nested YAML, flow": "nested deeper than 64 levels",
    "nested YAML, block": "nested deeper than 64 levels",
    "nested JSON": "nested deeper than 64 levels",
    "nested JSON as YAML": "nested deeper than 64 levels",
    "push body of the wrong shape": "TypeError",
    "Puppet report of the wrong shape": "TypeError",
}


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    clear_queues(client)
    yield client
    clear_queues(client)


@pytest.fixture
def token() -> str:
    owner = User.objects.create_user("ops")
    return str(Trigger.create_with_token(owner=owner, name="t")[1])


def send(url: str, token: str, body: bytes, content_type: str) -> str:
    answer = requests.post(
        f"{url}/api/events",
        data=body,
        headers={"Content-Type": content_type, "Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def state(event_id: str) -> str:
    return Event.objects.get(pk=event_id).state


def test_poison_reports_end_failed_and_the_worker_reads_the_next(broker, token, live_server, tmp_path):
    worker = Worker(pool="prefork", log=tmp_path / "worker.log")  # tasks in a pool process, as in production
    try:
        poison = {name: send(live_server.url, token, body, kind) for name, (body, kind) in POISON.items()}
        normal = send(live_server.url, token, PUPPET_8, "application/x-yaml")
        wait_until(lambda: all(state(i) != "received" for i in [*poison.values(), normal]), timeout=120)
    finally:
        worker.stop()
    for name, event_id in poison.items():
        event = Event.objects.get(pk=event_id)
        assert (event.state, event.attempts) == ("failed", 1), name
        assert REASONS[name] in event.failure_reason, (name, event.failure_reason)
    assert state(normal) == "matched"
    # No pool process died on the way (Celery logs "Process ... exited with 'signal 11'").
    assert "exited with" not in worker.logged() and "WorkerLostError" not in worker.logged()


def test_a_worker_killed_mid_read_again_and_again_gives_up(broker, token, settings):
    settings.EVENTS_MAX_ATTEMPTS = 2
    cap = {"EVENTS_MAX_ATTEMPTS": "2"}
    # No Puppet header: the reference reader takes it, several seconds for 8 MB here.
    body = big_report(6000).removeprefix(PSYCH_REPORT)
    event_id = post(token, body).json()["id"]
    for attempt in (1, 2):
        worker = Worker(env=cap)
        try:
            if attempt == 2:
                assert requeue_received_before(timezone.now() + timezone.timedelta(seconds=1)) == 1
            wait_until(lambda n=attempt: Event.objects.get(pk=event_id).attempts == n)  # reading has begun
            worker.kill()
        finally:
            worker.stop()
        assert state(event_id) == "received"

    worker = Worker(env=cap)
    try:
        process_event.delay(event_id)  # the message a lost worker leaves, delivered again
        wait_until(lambda: state(event_id) != "received")
    finally:
        worker.stop()
    event = Event.objects.get(pk=event_id)
    assert (event.state, event.attempts) == ("failed", 2)
    assert event.failure_reason == "gave up after 2 attempts: worker lost"


def test_deployments_sharing_a_redis_take_only_their_own_tasks(broker, token, tmp_path):
    namespace = f"other-{uuid.uuid4().hex[:8]}"
    other = Worker(env={"RELAY_DEPLOYMENT_ID": namespace}, log=tmp_path / "other.log")
    try:
        event_id = post(token, PUPPET_8).json()["id"]
        assert broker.llen(queue_key()) == 1  # queued in this deployment's namespace
        # The other deployment's worker (same Redis db) leaves it alone.
        with pytest.raises(AssertionError, match="timed out"):
            wait_until(lambda: state(event_id) != "received" or broker.llen(queue_key()) == 0, timeout=5)
    finally:
        other.stop()
        clear_queues(broker, f"{namespace}:")

    ours = Worker(log=tmp_path / "ours.log")
    try:
        wait_until(lambda: state(event_id) == "matched")
        # A task for an event this database lacks (from a deployment without its own
        # namespace) is dropped, and said so.
        unknown = str(uuid.uuid4())
        process_event.delay(unknown)
        wait_until(lambda: unknown in ours.logged())
    finally:
        ours.stop()
    [line] = [line for line in ours.logged().splitlines() if unknown in line]
    assert "WARNING" in line and "not in this database" in line
