"""Slow clients against the server as production runs it (relay.server, relay.asgi): headers
sent a byte at a time and bodies never finished hold a socket each, never a thread, and a
request that does not arrive whole in time is dropped."""

import socket
import threading
import time
import uuid
from urllib.parse import urlparse

import pytest
import requests

from relay import server


def _connect(live_server) -> socket.socket:
    address = urlparse(live_server.url)
    return socket.create_connection((address.hostname, address.port), timeout=10)


def _healthz_times(url: str, count: int) -> list[float]:
    times = []
    with requests.Session() as http:
        for _ in range(count):
            started = time.monotonic()
            assert http.get(f"{url}/healthz", timeout=5).status_code == 200
            times.append(time.monotonic() - started)
    return sorted(times)


@pytest.mark.django_db(transaction=True)
def test_200_slow_clients_leave_healthz_fast(live_server):
    baseline = _healthz_times(live_server.url, 20)
    # 100 send their headers a byte at a time; 100 send whole headers and 10 bytes of a
    # 1,000-byte body, and no more (to the runs API, and to the report door, which reads its
    # body as it comes).
    dripping = [_connect(live_server) for _ in range(100)]
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n\r\n"
    stalled = []
    for i in range(100):
        sock = _connect(live_server)
        path = f"/_puppet/runs/{uuid.uuid4()}/state" if i % 2 else "/api/events"
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f'Content-Length: 1000\r\n\r\n{{"status": '.encode()
        )
        stalled.append(sock)
    stop = threading.Event()

    def drip() -> None:
        for position in range(len(head) - 4):  # never the final CRLF CRLF
            for sock in dripping:
                sock.send(head[position : position + 1])
            if stop.wait(0.05):
                return

    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        time.sleep(0.5)
        threads_before = threading.active_count()
        slow = _healthz_times(live_server.url, 50)
        assert threading.active_count() <= threads_before + 1
    finally:
        stop.set()
        dripper.join()
        for sock in dripping + stalled:
            sock.close()
    # Unaffected: the median as fast as without them, within scheduling noise.
    assert slow[len(slow) // 2] < max(0.05, 3 * baseline[len(baseline) // 2]), (baseline, slow)
    assert slow[-1] < 0.5, slow


@pytest.mark.django_db(transaction=True)
def test_a_request_that_does_not_arrive_in_time_is_dropped(live_server, monkeypatch):
    monkeypatch.setattr(server, "REQUEST_READ_TIMEOUT", 1.0)
    sock = _connect(live_server)
    started = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and nothing more
    sock.settimeout(5)
    assert sock.recv(100) == b""  # closed by the server
    assert 0.9 < time.monotonic() - started < 3
    sock.close()
    # A client that sends in time is answered as ever.
    assert requests.get(f"{live_server.url}/healthz", timeout=5).status_code == 200


def _stalled_report(live_server, token: str) -> socket.socket:
    """A report whose headers arrive whole and whose body stops after 4 of its 100,000 bytes."""
    sock = _connect(live_server)
    sock.sendall(
        f"POST /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/x-yaml\r\nContent-Length: 100000\r\n\r\n---\n".encode()
    )
    return sock


def _closed_by_server(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


@pytest.mark.django_db(transaction=True)
def test_slow_report_bodies_hold_a_thread_each_only_with_a_valid_token_and_only_until_the_deadline(
    live_server, alice, monkeypatch
):
    """The report door's trade-off (relay.django_asgi.STREAMED_PATHS): its view reads the body
    as it comes, in one of Django's threads. A client with a wrong token holds none (401 at
    once); one with a valid trigger token holds a thread until REQUEST_READ_TIMEOUT; /healthz
    is answered on the loop all the while."""
    from relay.asgi import django_application
    from triggers.models import Trigger

    monkeypatch.setattr(server, "REQUEST_READ_TIMEOUT", 3.0)
    threads = django_application.threads._max_workers
    _, token = Trigger.create_with_token(owner=alice, name="reports")

    wrong = [_stalled_report(live_server, str(token)[:-1] + "x") for _ in range(threads)]
    for sock in wrong:
        assert _closed_by_server(sock).startswith(b"HTTP/1.1 401"), "a wrong token is refused at once"
        sock.close()
    started = time.monotonic()
    assert requests.get(f"{live_server.url}/nothing-here", timeout=10).status_code == 404
    assert time.monotonic() - started < 1, "no thread held by a client with a wrong token"

    opened = time.monotonic()
    stalled = [_stalled_report(live_server, str(token)) for _ in range(threads)]
    try:
        time.sleep(0.5)  # every one is in its view, reading
        times = _healthz_times(live_server.url, 20)
        assert times[-1] < 0.5, times  # on the loop: no thread needed
        response = requests.get(f"{live_server.url}/nothing-here", timeout=15)
        waited = time.monotonic() - opened
        assert response.status_code == 404
        # Django's requests wait for a thread until the deadline drops the stalled bodies.
        assert 2.5 < waited < 8, waited
        for sock in stalled:
            assert not _closed_by_server(sock).startswith(b"HTTP/1.1 2")  # nothing recorded
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.django_db(transaction=True)
def test_healthz_on_the_loop_answers_as_django_does(live_server, client):
    ours = requests.get(f"{live_server.url}/healthz", timeout=5)
    django = client.get("/healthz", HTTP_HOST="127.0.0.1")  # the test client: Django itself
    assert ours.status_code == django.status_code == 200
    assert ours.json() == django.json() == {"status": "ok"}
    for name in ("Content-Type", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy"):
        assert ours.headers[name] == django.headers[name], name
    # A Host not allowed is Django's 400, as for every other path.
    refused = requests.get(f"{live_server.url}/healthz", headers={"Host": "evil.example"}, timeout=5)
    assert refused.status_code == 400
