import socket
import threading
import time
from urllib.parse import urlparse

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connections

from puppet_connection.models import PuppetConnection
from runs import longpoll
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


# The same long-poll served as in production (relay.asgi: the wait before Django, on the loop).


def _threads() -> int:
    return threading.active_count()


def test_on_the_server_a_waiting_bridge_wakes_when_its_run_is_created(live_server, conn_and_token):
    conn, token = conn_and_token
    answer: dict = {}

    def wait() -> None:
        answer["response"] = requests.get(
            f"{live_server.url}/_puppet/runs", params={"wait": 10}, headers=_bearer(token), timeout=20
        )
        answer["at"] = time.monotonic()

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until(lambda: longpoll.waiters.get(conn.pk) == 1)
    created_at = time.monotonic()
    run = Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    waiter.join(timeout=10)
    assert answer["response"].status_code == 200
    assert [r["id"] for r in answer["response"].json()["runs"]] == [str(run.id)]
    assert answer["at"] - created_at < 0.5
    assert conn.pk not in longpoll.waiters


def test_waiting_bridges_hold_no_thread_and_the_cap_answers_at_once(live_server, conn_and_token, settings):
    conn, token = conn_and_token
    settings.RUN_LONG_POLL_MAX_WAITERS = 3
    before = _threads()
    url = f"{live_server.url}/_puppet/runs?wait=30"
    socks = [_raw_get(live_server, url, token) for _ in range(3)]
    _until(lambda: longpoll.waiters.get(conn.pk) == 3)
    assert _threads() <= before + 1  # at most the listener's thread, started by the first
    # A fourth is over the cap: answered at once, 200 with what there is (nothing).
    started = time.monotonic()
    response = requests.get(url, headers=_bearer(token), timeout=10)
    assert response.status_code == 200 and response.json() == {"runs": []}
    assert time.monotonic() - started < 1
    for sock in socks:  # bridges that go away end their waits
        sock.close()
    _until(lambda: conn.pk not in longpoll.waiters)


def test_on_the_server_a_bad_wait_or_token_is_answered_at_once(live_server, conn_and_token):
    _, token = conn_and_token
    started = time.monotonic()
    bad_wait = requests.get(f"{live_server.url}/_puppet/runs?wait=61", headers=_bearer(token), timeout=10)
    bad_token = requests.get(f"{live_server.url}/_puppet/runs?wait=5", headers=_bearer("rlyp_x"), timeout=10)
    assert bad_wait.status_code == 400 and bad_token.status_code == 401
    assert time.monotonic() - started < 1


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _raw_get(live_server, url: str, token: str) -> socket.socket:
    parts = urlparse(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    head = (
        f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def _until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_on_the_server_each_wait_ends_at_its_own_deadline(live_server, conn_and_token, settings):
    from runs.notify import listener

    _, token = conn_and_token
    settings.RUN_LONG_POLL_MAX_WAITERS = 10
    ended: dict[int, float] = {}

    def wait(seconds: int) -> None:
        response = requests.get(
            f"{live_server.url}/_puppet/runs", params={"wait": seconds}, headers=_bearer(token), timeout=20
        )
        assert response.status_code == 200 and response.json() == {"runs": []}
        ended[seconds] = time.monotonic() - started

    started = time.monotonic()
    # The longest first: one timer serves them all, re-armed for the earliest end.
    threads = [threading.Thread(target=wait, args=(seconds,)) for seconds in (3, 2, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    for seconds in (1, 2, 3):
        assert seconds - 0.05 < ended[seconds] < seconds + 0.6, ended
    assert listener.waiting() == 0
