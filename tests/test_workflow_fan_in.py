"""Fan-in exactly once: the last steps of a run ending at once, each in its own worker's
transaction (real PostgreSQL, one connection a thread), complete the run once and send the
step that waits for them once."""

import pytest
import redis
from django.conf import settings

from tests.conftest import run_concurrently
from tests.events_helpers import clear_queues, queue_key
from tests.workflow_helpers import NOOP, run_of, steps_of
from workflows import engine
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

WIDTH = 6
RUNS = 8

# WIDTH independent steps, a `join` after all of them.
FAN_IN = "apiVersion: v1\nsteps:\n" + "".join(f"- name: s{i}\n  image: {NOOP}\n" for i in range(WIDTH))
JOIN = FAN_IN + f"- name: join\n  image: {NOOP}\n  dependsOn: [{', '.join(f's{i}' for i in range(WIDTH))}]\n"


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    clear_queues(client)
    yield client
    clear_queues(client)


def started_runs(owner, source: str) -> list[WorkflowRun]:
    runs = [run_of(owner, source, name=f"wf{i}") for i in range(RUNS)]
    for run in runs:
        engine.start_run(run.pk)
    return runs


def end_all_at_once(step_ids: list[str]) -> None:
    # Each thread starts (claims, runs, records) one step: the steps of a run end together.
    results = run_concurrently(len(step_ids), lambda i: engine.start_step(step_ids[i]))
    assert not [r for r in results if isinstance(r, Exception)], results


def test_the_last_steps_ending_together_complete_the_run_once(broker, owner, caplog):
    runs = started_runs(owner, FAN_IN)
    ids = [str(step.pk) for run in runs for step in steps_of(run).values()]
    caplog.set_level("INFO", logger="workflows.engine")
    end_all_at_once(ids)
    for run in runs:
        run.refresh_from_db()
        # No sweeper here: a completion both last transactions missed would leave it in progress.
        assert (run.status, run.outcome) == ("complete", "success"), run.pk
        assert caplog.text.count(f"workflow run {run.pk} complete") == 1


def test_a_step_after_all_others_is_sent_once_when_they_end_together(broker, owner):
    runs = started_runs(owner, JOIN)
    broker.delete(queue_key())  # the starts start_run sent: the threads start those steps
    ids = [str(step.pk) for run in runs for name, step in steps_of(run).items() if name != "join"]
    end_all_at_once(ids)
    messages = [m.decode() for m in broker.lrange(queue_key(), 0, -1)]
    for run in runs:
        join = steps_of(run)["join"]
        assert join.status == "pending" and join.queued_at is not None, run.pk
        assert sum(str(join.pk) in m for m in messages) == 1, run.pk
        assert WorkflowRun.objects.get(pk=run.pk).status == "in-progress"
