"""Expiry with a controllable clock: expire_runs(now) is given the time; nothing sleeps."""

from datetime import timedelta

from django.utils import timezone

from runs.models import Run, expire_runs
from tests.runs_helpers import accept, create_run, put_state, soon


def test_an_overdue_heartbeat_times_the_run_out_after_the_grace(connection, settings):
    _, token = connection
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon(45)})
    due = Run.objects.get(pk=run["id"]).next_update_before
    grace = timedelta(seconds=settings.RUN_HEARTBEAT_GRACE)

    assert expire_runs(due + grace - timedelta(seconds=1)) == 0
    assert Run.objects.get(pk=run["id"]).status == "in-progress"
    assert expire_runs(due + grace + timedelta(seconds=1)) == 1
    expired = Run.objects.get(pk=run["id"])
    assert (expired.status, expired.outcome) == ("complete", "timed-out")
    assert "No heartbeat" in expired.run_results["reason"]
    assert expired.transitions.last().token_prefix == "system"
    # A bridge that comes back late finds the run final.
    assert (
        put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()}).status_code
        == 409
    )


def test_a_heartbeat_in_time_keeps_the_run_alive(connection, settings):
    _, token = connection
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon(45)})
    first_due = Run.objects.get(pk=run["id"]).next_update_before
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon(600)})
    assert expire_runs(first_due + timedelta(seconds=settings.RUN_HEARTBEAT_GRACE + 1)) == 0


def test_a_pending_run_nobody_accepts_times_out(connection, settings):
    _, token = connection
    run = create_run(token)
    created = Run.objects.get(pk=run["id"]).created_at
    limit = timedelta(seconds=settings.RUN_PENDING_TIMEOUT)
    assert expire_runs(created + limit - timedelta(seconds=1)) == 0
    assert expire_runs(created + limit + timedelta(seconds=1)) == 1
    expired = Run.objects.get(pk=run["id"])
    assert expired.outcome == "timed-out" and "No bridge accepted" in expired.run_results["reason"]


def test_an_accepted_run_that_never_starts_times_out(connection, settings):
    _, token = connection
    run = create_run(token)
    accept(token, run["id"])
    accepted = Run.objects.get(pk=run["id"]).updated_at
    assert expire_runs(accepted + timedelta(seconds=settings.RUN_ACCEPTED_TIMEOUT + 1)) == 1
    assert Run.objects.get(pk=run["id"]).outcome == "timed-out"


def test_expiry_leaves_complete_runs_alone(connection):
    _, token = connection
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "complete"})
    assert expire_runs(timezone.now() + timedelta(days=30)) == 0
    assert Run.objects.get(pk=run["id"]).outcome == "finished"


def test_the_expiry_task_runs_on_the_real_clock(connection):
    from runs.tasks import expire_runs as task

    _, token = connection
    create_run(token)
    assert task.apply().get() == 0  # nothing is overdue yet
