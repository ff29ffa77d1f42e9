"""The engine's Celery tasks: thin, they take ids and call workflows.engine.

Retry policy: a database error retries the task after 1, 2, 4 … seconds (5 times); every
task is idempotent (compare-and-set transitions), so a retry or a duplicated message does
nothing twice. A handler's own exception is the engine's business (it releases the step and
tries again later, WORKFLOW_STEP_MAX_ATTEMPTS times in all). Whatever is lost anyway (a
worker killed, a broker that drops a message) the beat's sweep sends again.
"""

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError

from workflows import engine, services

RETRY = {"autoretry_for": (DatabaseError,), "retry_backoff": 1, "max_retries": 5, "acks_late": True}
# A handler may not run past its lease: past it, the sweeper gives the step to another worker.
STEP_TASK = {**RETRY, "soft_time_limit": max(settings.WORKFLOW_STEP_LEASE - 10, 1)}


@shared_task(**RETRY)
def start_run(run_id: str) -> None:
    engine.start_run(run_id)


@shared_task(**RETRY)
def advance_run(run_id: str, requeue: bool = False) -> None:
    engine.advance(run_id, requeue)


@shared_task(**STEP_TASK)
def start_step(step_id: str) -> None:
    engine.follow(engine.start_step, step_id)


@shared_task(**STEP_TASK)
def resume_step(step_id: str) -> None:
    engine.follow(engine.resume_step, step_id)


@shared_task(**RETRY)
def start_run_for_event(event_id: str) -> None:
    """A workflow trigger's matched event: its run, once (queued when the event is recorded;
    triggers.tasks.requeue_stuck_events sends it again if that message was lost). An error
    that is not the database's would come back at every requeue: the event starts no run,
    and says why."""
    try:
        services.start_run_for_event(event_id)
    except DatabaseError:
        raise
    except Exception as exc:
        services.give_up_workflow_start(event_id, exc)


@shared_task(acks_late=True)
def sweep_workflow_runs() -> int:
    return engine.sweep()


@shared_task(acks_late=True)
def start_due_schedules() -> int:
    """From beat, every SCHEDULE_TICK_INTERVAL seconds: a run for each schedule trigger that
    is due (workflows.services.start_due_schedules). No retry: the next tick does the work
    of one that failed, and two ticks at once start nothing twice."""
    return services.start_due_schedules()
