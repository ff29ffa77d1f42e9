import os
from typing import Any

from celery import Celery, states
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup
from django import db

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")


class KeptConnections(DjangoWorkerFixup):
    """Celery's Django fixup, but with Django's rule for database connections: around each
    task, close only the unusable or obsolete ones (`close_old_connections`, what Django does
    around each request), so CONN_MAX_AGE and CONN_HEALTH_CHECKS hold in the workers as in
    the web. Celery's own closes every connection before and after every task: a new
    PostgreSQL connection per task, 2.6-3.6 ms plus a cold backend, most of a workflow hop.

    A task that did not succeed (an exception, a retry, a time limit) closes its connections
    outright: an exception raised while a query was in flight (a soft time limit's
    SoftTimeLimitExceeded) can leave a connection Django still thinks usable (Django ticket
    30646, why Celery went back to closing after every task). Forks still close what they
    inherited (the base class's on_worker_process_init)."""

    def on_task_prerun(self, sender: Any, **kwargs: Any) -> None:
        if not getattr(sender.request, "is_eager", False):
            db.close_old_connections()

    def on_task_postrun(self, sender: Any, state: str | None = None, **kwargs: Any) -> None:
        if getattr(sender.request, "is_eager", False):
            return
        if state == states.SUCCESS:
            db.close_old_connections()
        else:
            self._close_database()
        self.close_cache()


class RelayDjangoFixup(DjangoFixup):
    @property
    def worker_fixup(self) -> DjangoWorkerFixup:
        if self._worker_fixup is None:
            self._worker_fixup = KeptConnections(self.app)
        return self._worker_fixup


def django_fixup(app: Celery) -> DjangoFixup:
    return RelayDjangoFixup(app).install()


# `fixups` replaces Celery's built-in Django fixup (celery.fixups.django:fixup) with this one.
app = Celery("relay", fixups=["relay.celery:django_fixup"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
