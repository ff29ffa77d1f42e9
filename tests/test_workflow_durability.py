"""A workflow run survives a worker SIGKILLed mid-step and messages the broker lost: real
Celery worker processes on Redis, and the beat's sweep (called here, at chosen times)."""

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from tests.events_helpers import clear_queues, queue_key
from tests.workflow_helpers import NOOP, EngineWorker, finished, run_of, statuses, steps_of, wait_until
from workflows import engine
from workflows.models import StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

CHAIN = f"""
apiVersion: v1
steps:
- name: slow
  image: {NOOP}
  spec: {{sleep: 3, outputs: {{done: true}}}}
- name: next
  image: {NOOP}
  spec: {{outputs: {{saw: !Output [slow, done]}}}}
"""


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    clear_queues(client)  # messages earlier tests queued for runs that are gone
    yield client
    clear_queues(client)


def test_a_worker_killed_mid_step_loses_nothing(broker, owner, tmp_path):
    run = run_of(owner, CHAIN)
    slow = steps_of(run)["slow"]
    first = EngineWorker(tmp_path / "first.log", pool="solo")
    try:
        wait_until(lambda: f"({slow.pk}) started" in first.log())  # inside its start, sleeping
        first.kill()
    finally:
        first.stop()
    slow.refresh_from_db()
    assert (slow.status, slow.attempts, slow.state) == ("in-progress", 1, None)
    assert slow.lease_until - slow.started_at == timedelta(seconds=settings.WORKFLOW_STEP_LEASE)
    assert engine.sweep() == 0  # its lease still runs: the worker might only be slow

    # The lease runs out.
    StepRun.objects.filter(pk=slow.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    second = EngineWorker(tmp_path / "second.log", pool="solo")
    try:
        assert engine.sweep() == 1
        run = finished(run)
    finally:
        second.stop()
    assert run.outcome == "success" and statuses(run) == {"slow": "success", "next": "success"}
    steps = steps_of(run)
    assert steps["slow"].attempts == 2  # started again, once
    assert steps["next"].outputs == {"saw": True}
    assert second.log().count(f"({slow.pk}) started") == 1


def test_messages_the_broker_lost_are_sent_again(broker, owner, tmp_path):
    lost_start = run_of(owner, CHAIN.replace("sleep: 3", "sleep: 0"))
    assert broker.llen(queue_key()) == 1
    clear_queues(broker)  # the broker restarts without its queue
    begun = run_of(owner, CHAIN.replace("sleep: 3", "sleep: 0"), name="wf2")
    begun.begin()  # start_run ran, and the start_step it queued was lost:
    clear_queues(broker)
    worker = EngineWorker(tmp_path / "worker.log", pool="solo")
    try:
        assert engine.sweep() == 0  # nothing is overdue yet
        assert WorkflowRun.objects.get(pk=lost_start.pk).status == "initializing"
        later = timezone.now() + timedelta(seconds=settings.WORKFLOW_STUCK_AFTER + 1)
        assert engine.sweep(later) == 2
        lost_start, begun = finished(lost_start), finished(begun)
    finally:
        worker.stop()
    assert lost_start.outcome == "success" and begun.outcome == "success"


THREE = f"""
apiVersion: v1
steps:
- name: a
  image: {NOOP}
- name: b
  image: {NOOP}
  dependsOn: a
- name: c
  image: {NOOP}
  dependsOn: b
"""


def test_a_chain_runs_in_line_in_one_task(broker, owner, tmp_path):
    worker = EngineWorker(tmp_path / "worker.log", pool="solo")
    try:
        run = finished(run_of(owner, THREE))
    finally:
        worker.stop()
    assert run.outcome == "success"
    # start_run's message, then one start_step: b and c were started by the worker that ended
    # the step before them, without a message.
    assert worker.log().count("Task workflows.tasks.start_step[") == 2  # one task: received, succeeded


def test_a_step_to_start_in_line_survives_its_worker_dying_first(broker, owner, tmp_path):
    run = run_of(owner, THREE)
    engine.start_run(run.pk)
    clear_queues(broker)  # start_run's message for `a`: this process is that worker
    steps = steps_of(run)
    assert engine.start_step(str(steps["a"].pk), inline=True) == str(steps["b"].pk)
    # The worker dies here, before starting `b`: no message for it anywhere, its start on record.
    assert broker.llen(queue_key()) == 0
    b = StepRun.objects.get(pk=steps["b"].pk)
    assert b.status == "pending" and b.queued_at is not None
    worker = EngineWorker(tmp_path / "worker.log", pool="solo")
    try:
        assert engine.sweep() == 0
        assert engine.sweep(timezone.now() + timedelta(seconds=settings.WORKFLOW_STUCK_AFTER + 1)) == 1
        run = finished(run)
    finally:
        worker.stop()
    assert run.outcome == "success" and statuses(run) == {"a": "success", "b": "success", "c": "success"}
