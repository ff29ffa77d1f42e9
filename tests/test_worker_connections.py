"""Celery workers keep their PostgreSQL connections between tasks by Django's rule
(relay.celery.KeptConnections): CONN_MAX_AGE holds in them as in the web, and a connection
the database dropped costs one retry, not the run."""

import pytest
from django.db import connection

from tests.workflow_helpers import NOOP, EngineWorker, finished, run_of, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

CHAIN = f"""
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


def worker(tmp_path, **env: str) -> EngineWorker:
    """A solo worker whose sessions are named (other tests' servers may hold sessions too)."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}?application_name={NAME}"
    return EngineWorker(tmp_path / "worker.log", pool="solo", DATABASE_URL=url, **env)


NAME = "relay-kept-connections-test"


def worker_backends() -> list[tuple[int, object]]:
    """(pid, backend_start) of the worker's sessions."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = %s", [NAME])
        return cursor.fetchall()


def test_a_worker_keeps_its_connection_from_task_to_task(owner, tmp_path):
    process = worker(tmp_path, WORKFLOW_INLINE_SECONDS="0")
    try:
        run = finished(run_of(owner, CHAIN))
        assert run.outcome == "success"
        backends = worker_backends()
        # One session, opened before the first of its 4 tasks (start_run, a, b, c) ended.
        assert len(backends) == 1, backends
        assert backends[0][1] < steps_of(run)["a"].ended_at

        # The database drops it: the next task fails once, closes it, and its retry connects again.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [backends[0][0]])
        again = finished(run_of(owner, CHAIN, name="wf2"))
        assert again.outcome == "success"
        assert [pid for pid, _ in worker_backends()] != [backends[0][0]]
    finally:
        process.stop()


def test_conn_max_age_0_still_closes_after_each_task(owner, tmp_path):
    process = worker(tmp_path, CONN_MAX_AGE="0")
    try:
        assert finished(run_of(owner, CHAIN)).outcome == "success"
        assert worker_backends() == []
    finally:
        process.stop()
