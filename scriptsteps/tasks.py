"""The `steps` queue's task (routed by name: CELERY_TASK_ROUTES), so that scripts, which may
take minutes, never hold the engine's workers.

Acked when received, not after: a script is not run twice (it may have done things outside),
so a worker that dies mid-script loses the message on purpose; the step then ends through its
check (services.follow: `lost` after STEP_LOST_AFTER seconds, or sent again, a bounded number
of times, if it was never taken)."""

from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup

from scriptsteps import leftovers, services


@shared_task(acks_late=False, ignore_result=True)
def run_script(step_run_id: str) -> None:
    services.execute(step_run_id)


@celeryd_after_setup.connect
def remove_leftovers(sender: str, instance: Any, **kwargs: Any) -> None:
    """A steps worker, as it starts, removes what this machine's steps workers that are gone
    left behind (scriptsteps.leftovers)."""
    if "steps" in (instance.app.amqp.queues.consume_from or {}):
        leftovers.clean()
