import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connections

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.conftest import bridge


@pytest.fixture
def conn_and_token(transactional_db):
    owner = User.objects.create_user("alice")
    conn, token = PuppetConnection.create_with_token(owner=owner, name="prod")
    return conn, str(token)


def test_a_waiting_bridge_wakes_well_under_a_second_after_a_run_is_created(conn_and_token):
    conn, token = conn_and_token
    answer: dict = {}

    def wait() -> None:
        started = time.monotonic()
        answer["response"] = bridge(token).get("/_puppet/runs", {"wait": 10})
        answer["returned_at"] = time.monotonic()
        answer["waited"] = answer["returned_at"] - started
        connections.close_all()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # the bridge is waiting
    assert waiter.is_alive()
    created_at = time.monotonic()
    run = Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    waiter.join(timeout=10)
    assert answer["response"].status_code == 200
    assert [r["id"] for r in answer["response"].json()["runs"]] == [str(run.id)]
    assert answer["returned_at"] - created_at < 0.5
    assert answer["waited"] < 2


def test_a_pending_run_answers_at_once(conn_and_token):
    conn, token = conn_and_token
    Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    started = time.monotonic()
    assert len(bridge(token).get("/_puppet/runs", {"wait": 30}).json()["runs"]) == 1
    assert time.monotonic() - started < 1


def test_another_connections_run_does_not_wake_the_bridge(conn_and_token):
    conn, token = conn_and_token
    other, _ = PuppetConnection.create_with_token(owner=conn.owner, name="other")
    threading.Timer(
        0.3, lambda: (Run.create_for(other, {"scope": {"nodes": ["a"]}}), connections.close_all())
    ).start()
    started = time.monotonic()
    assert bridge(token).get("/_puppet/runs", {"wait": 2}).json()["runs"] == []
    assert time.monotonic() - started >= 2


@pytest.mark.parametrize("wait", ["61", "-1", "soon", "1.5"])
def test_a_bad_wait_is_400(conn_and_token, wait):
    _, token = conn_and_token
    response = bridge(token).get("/_puppet/runs", {"wait": wait})
    assert response.status_code == 400 and response.json()["errors"][0]["pointer"] == "#/wait"
