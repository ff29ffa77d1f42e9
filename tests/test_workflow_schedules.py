"""Schedule triggers: a row per trigger made, changed and deleted with the workflow's
revisions; the due-task against PostgreSQL starts a run on time, once for a schedule missed
while the service was down, never twice for one slot however many run at once; real Celery
beat and worker start one on their own; an invalid cron is a 400 at its place."""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from tests.conftest import client_for, run_concurrently
from tests.events_helpers import ChildProcess
from tests.test_connection_api import assert_problem
from tests.workflow_helpers import NOOP, EngineWorker, finished, steps_of, wait_until
from triggers.models import Schedule
from workflows import services
from workflows.dialect import cron
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent

NIGHTLY = f"""\
apiVersion: v1
parameters:
  mode: {{default: quick}}
triggers:
- name: nightly
  source:
    type: schedule
    schedule: '*/5 * * * *'
  binding:
    parameters:
      mode: thorough
steps:
- name: tell
  image: {NOOP}
  spec:
    outputs:
      mode: !Parameter mode
"""


@pytest.fixture
def ops(db) -> User:
    return User.objects.create_user("ops")


@pytest.fixture
def api(ops: User) -> APIClient:
    return client_for(ops)


def create(api: APIClient, source: str, name: str = "nightly") -> dict:
    response = api.post("/api/workflows/", {"name": name, "source": source}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def save(api: APIClient, source: str, name: str = "nightly") -> dict:
    response = api.put(f"/api/workflows/{name}/", {"source": source}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def due_at(moment: datetime) -> Schedule:
    """The one schedule, made due at `moment` (as if its time had come)."""
    Schedule.objects.update(next_due=moment)
    return Schedule.objects.get()


# Made with the revisions ------------------------------------------------------------------------


def test_a_schedule_is_made_with_the_workflow_and_is_next_due_at_its_next_time(api):
    before = timezone.now()
    body = create(api, NIGHTLY)
    schedule = Schedule.objects.get()
    assert (schedule.name, schedule.schedule) == ("nightly", "*/5 * * * *")
    assert before < schedule.next_due <= before + timedelta(minutes=5)
    assert schedule.next_due.minute % 5 == 0 and schedule.next_due.second == 0
    assert body["triggers"] == [] and body["push_triggers"] == []  # no token: nothing to show
    [shown] = body["schedule_triggers"]
    assert shown["name"] == "nightly" and shown["schedule"] == "*/5 * * * *" and shown["last_due"] is None


def test_revisions_keep_change_and_delete_the_schedule(api):
    create(api, NIGHTLY)
    first = Schedule.objects.get()
    # Same schedule, other steps: the same row and the same next time.
    save(api, NIGHTLY.replace("name: tell", "name: say"))
    kept = Schedule.objects.get()
    assert (kept.pk, kept.next_due) == (first.pk, first.next_due)
    # Another schedule: the same row, due at its own next time (a daily 03:17).
    save(api, NIGHTLY.replace("'*/5 * * * *'", "'17 3 * * *'"))
    changed = Schedule.objects.get()
    assert changed.pk == first.pk and changed.schedule == "17 3 * * *"
    assert (changed.next_due.hour, changed.next_due.minute) == (3, 17)
    # A push trigger instead: the schedule goes.
    save(api, NIGHTLY.replace("type: schedule\n    schedule: '*/5 * * * *'", "type: push"))
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("schedule", "detail"),
    [
        ("61 * * * *", "Not a valid cron schedule: Bad minute."),
        ("* * * *", "A cron schedule has 5 fields (minute hour day-of-month month day-of-week), not 4."),
        ("0 * * * * *", "A cron schedule has 5 fields (minute hour day-of-month month day-of-week), not 6."),
        ("0 0 30 2 *", "Not a valid cron schedule: Bad day-of-month."),
        ("@fortnightly", "Unknown descriptor '@fortnightly'"),
        ("@every 10s", "@every is at least 60 seconds here."),
        ("@every soon", "@every takes a duration such as 90s, 5m or 1h30m, not 'soon'."),
        ("CRON_TZ=Mars/Olympus 0 3 * * *", "Unknown time zone 'Mars/Olympus' in 'CRON_TZ=Mars/Olympus'."),
        ("", "The schedule is empty"),
    ],
)
def test_an_invalid_cron_is_refused_at_its_place_when_the_workflow_is_saved(api, schedule, detail):
    source = NIGHTLY.replace("'*/5 * * * *'", repr(schedule))
    response = api.post("/api/workflows/", {"name": "nightly", "source": source}, format="json")
    body = assert_problem(response, 400)
    [error] = body["errors"]
    assert error["pointer"] == "#/triggers/0/source/schedule"
    assert error["detail"].startswith(detail), error["detail"]
    assert (error["line"], error["column"]) == (8, 15)
    assert not Schedule.objects.exists()


def test_the_cron_dialect_is_robfig_s_standard_one_in_utc():
    moment = at("2026-03-28T12:34:56")
    assert cron.parse("7-57/10 * * * *").next_after(moment) == at("2026-03-28T12:37:00")
    assert cron.parse("@hourly").next_after(moment) == at("2026-03-28T13:00:00")
    assert cron.parse("@daily").next_after(moment) == at("2026-03-29T00:00:00")
    assert cron.parse("0 9 ? * mon-fri").next_after(moment) == at("2026-03-30T09:00:00")  # a Saturday now
    assert cron.parse("@every 1h30m").next_after(moment) == at("2026-03-28T14:04:56")
    # In a zone: 02:30 Paris is 01:30 UTC on the 28th; on the 29th the clocks skip 02:00-03:00.
    paris = cron.parse("CRON_TZ=Europe/Paris 30 2 * * *")
    assert paris.next_after(at("2026-03-28T00:00:00")) == at("2026-03-28T01:30:00")
    assert paris.next_after(at("2026-03-28T02:00:00")) == at("2026-03-29T01:00:00")


# The due-task against PostgreSQL ----------------------------------------------------------------


def test_a_due_schedule_starts_one_run_on_time_with_its_binding(api, ops):
    create(api, NIGHTLY)
    slot = at("2026-05-01T10:05:00")
    due_at(slot)
    assert services.start_due_schedules(slot - timedelta(seconds=1)) == 0  # not yet
    assert not WorkflowRun.objects.exists()

    assert services.start_due_schedules(slot + timedelta(seconds=2)) == 1
    run = WorkflowRun.objects.get()
    assert (run.scheduled_for, run.schedule, run.event) == (slot, Schedule.objects.get(), None)
    assert run.parameters == {"mode": "thorough"}  # the binding's constant
    schedule = Schedule.objects.get()
    assert (schedule.last_due, schedule.next_due) == (slot, at("2026-05-01T10:10:00"))
    assert schedule.last_note == f"Started run {run.pk}."
    # The same tick again, or one a little later: nothing more until 10:10.
    assert services.start_due_schedules(slot + timedelta(seconds=3)) == 0
    assert services.start_due_schedules(at("2026-05-01T10:09:59")) == 0
    assert services.start_due_schedules(at("2026-05-01T10:10:01")) == 1
    assert WorkflowRun.objects.count() == 2


def test_a_schedule_missed_while_the_service_was_down_runs_once_then_keeps_its_times(api):
    create(api, NIGHTLY)
    # Down from 07:00 to 10:02: 37 slots of */5 missed.
    due_at(at("2026-05-01T07:00:00"))
    back = at("2026-05-01T10:02:30")
    assert services.start_due_schedules(back) == 1
    assert services.start_due_schedules(back + timedelta(seconds=5)) == 0
    [run] = WorkflowRun.objects.all()
    assert run.scheduled_for == at("2026-05-01T07:00:00")  # the first slot it missed
    assert Schedule.objects.get().next_due == at("2026-05-01T10:05:00")  # then on time again


def test_many_ticks_at_once_start_one_run_per_slot(api, ops):
    create(api, NIGHTLY)
    create(api, NIGHTLY, name="other")
    slot = at("2026-05-01T10:05:00")
    Schedule.objects.update(next_due=slot)
    # Twelve beats/workers at the same instant, each with its own database connection.
    results = run_concurrently(12, lambda i: services.start_due_schedules(slot + timedelta(seconds=1)))
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(results) == 2
    assert sorted(WorkflowRun.objects.values_list("workflow__name", flat=True)) == ["nightly", "other"]
    assert set(WorkflowRun.objects.values_list("scheduled_for", flat=True)) == {slot}
    # And the database holds one run per slot whoever writes it.
    run = WorkflowRun.objects.filter(workflow__name="nightly").get()
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkflowRun.objects.create(
            workflow=run.workflow, revision=run.revision, schedule=run.schedule, scheduled_for=slot
        )


def test_a_when_that_is_false_starts_no_run_and_the_schedule_says_why(api):
    create(api, NIGHTLY.replace("  binding:\n", "  when: !Fn.equals [1, 2]\n  binding:\n"))
    due_at(at("2026-05-01T10:05:00"))
    assert services.start_due_schedules(at("2026-05-01T10:05:01")) == 0
    assert not WorkflowRun.objects.exists()
    schedule = Schedule.objects.get()
    assert schedule.last_note == "The trigger's `when` is false: no workflow run."
    assert schedule.next_due == at("2026-05-01T10:10:00")  # the slot is spent


def test_a_schedule_has_no_event_so_a_binding_from_event_data_fails_the_run_saying_which(api):
    create(api, NIGHTLY.replace("mode: thorough", "mode: !Data mode"))
    due_at(at("2026-05-01T10:05:00"))
    assert services.start_due_schedules(at("2026-05-01T10:05:01")) == 1
    run = WorkflowRun.objects.get()
    assert (run.status, run.outcome) == ("complete", "failure")
    assert run.message.startswith("The trigger's binding of 'mode' failed:")
    assert "unknown key mode" in run.message


# Real beat and worker ---------------------------------------------------------------------------


class Beat(ChildProcess):
    """`celery beat` in its own process, ticking the schedules every second."""

    def __init__(self, log_path: Path, schedule_file: Path) -> None:
        db = connection.settings_dict
        self.log_path = log_path
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "relay",
                "beat",
                "--schedule",
                str(schedule_file),
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
                "SCHEDULE_TICK_INTERVAL": "1",
            },
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )


def test_celery_beat_and_a_worker_start_the_run_when_it_is_due(api, tmp_path):
    create(api, NIGHTLY)
    worker = EngineWorker(tmp_path / "worker.log", concurrency=2)
    beat = Beat(tmp_path / "beat.log", tmp_path / "celerybeat-schedule")
    try:
        slot = (timezone.now() + timedelta(seconds=3)).replace(microsecond=0)
        due_at(slot)
        wait_until(lambda: WorkflowRun.objects.exists(), 30)
        run = WorkflowRun.objects.get()
        assert run.scheduled_for == slot and run.created_at >= slot
        assert run.created_at - slot < timedelta(seconds=5), run.created_at - slot  # on time
        run = finished(run)
        assert run.outcome == "success", run.message
        assert steps_of(run)["tell"].outputs == {"mode": "thorough"}
        assert Schedule.objects.get().next_due == cron.parse("*/5 * * * *").next_after(run.created_at)
        assert WorkflowRun.objects.count() == 1
    finally:
        beat.stop()
        worker.stop()
