"""Queueing a Celery task by its name: the seam between a service and the tasks that call it.

A tasks module imports its services and wraps them (ids in, the service does the work); a
service that must queue further work names the task instead of importing its module, so
imports run one way (tasks → services, never back), and an app lower down can ask for a task
of an app above it (a matched event starting a workflow run) without importing that app.
The name is the task's Celery name: its module path, `triggers.tasks.notify_slack`."""

import logging
import threading
from typing import Any

from celery import current_app

log = logging.getLogger(__name__)
_importing = threading.Lock()


def publish(name: str, *args: Any, countdown: float | None = None) -> None:
    """Queue task `name` with `args` (as eager as the app is configured: tests run some tasks
    where they are queued). Raises what the broker raises, and KeyError for a name that is no
    registered task (a typo shows in the first test that takes the path)."""
    tasks = current_app.tasks
    if name not in tasks:
        # Celery discovers the tasks modules as a worker starts; a web process has imported
        # them only if something did: import them all, once, one thread at a time (threads
        # importing them side by side see each other's half-imported modules: a burst of
        # requests into a new web process got NotRegistered for all but one).
        with _importing:
            if name not in tasks:
                current_app.loader.import_default_modules()
    tasks[name].apply_async(args=args, countdown=countdown)


def publish_or_log(name: str, *args: Any, what: str, countdown: float | None = None) -> bool:
    """publish(), for work a periodic sweep queues again when its message is lost (a broker
    that is down loses nothing): a failure is logged as `could not queue <what>`, not raised.
    Returns whether it was queued."""
    try:
        publish(name, *args, countdown=countdown)
    except Exception:
        log.warning("could not queue %s", what)
        return False
    return True
