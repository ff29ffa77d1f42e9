"""Per-trigger budgets on POST /api/events: 429 with Retry-After and a problem body, counted in
Redis (the tests' own db), or in the process when there is no Redis."""

import socket
import time
from urllib.parse import urlparse

import pytest

from tests.events_helpers import gz, post
from tests.test_connection_api import assert_problem
from triggers import ratelimit
from triggers.models import Event, Trigger


@pytest.fixture(autouse=True)
def fresh_counters(monkeypatch):
    """Each test starts with Redis thought up, and no counts kept in this process."""
    monkeypatch.setattr(ratelimit, "counters", ratelimit.Counters())


@pytest.fixture
def make_trigger(alice):
    def make(name: str) -> str:
        _, token = Trigger.create_with_token(owner=alice, name=name)
        return str(token)

    return make


def clear_of_the_window_edge(seconds: int, margin: float = 5.0) -> None:
    """Fixed windows: a test that spans the end of one would start counting again."""
    left = seconds - time.time() % seconds
    if left < margin:
        time.sleep(left + 0.1)


def report(i: int, size: int = 0) -> bytes:
    return f"host: node{i}.example.com\nstatus: changed\n".encode() + b"#" * size + b"\n"


def assert_throttled(response, most: int) -> dict:
    body = assert_problem(response, 429)
    assert body["type"] == "urn:relay:problem:throttled"
    assert 1 <= int(response["Retry-After"]) <= most
    return body


def test_over_the_reports_a_minute_is_429_and_another_trigger_is_unaffected(make_trigger, settings):
    settings.EVENTS_RATE_LIMIT_PER_MINUTE = 3
    clear_of_the_window_edge(60)
    noisy, quiet = make_trigger("noisy"), make_trigger("quiet")
    for i in range(3):
        assert post(noisy, report(i)).status_code == 202
    body = assert_throttled(post(noisy, report(3)), 60)
    assert "3 reports a minute" in body["detail"]
    assert Event.objects.count() == 3  # the fourth was not stored

    assert post(quiet, report(3)).status_code == 202
    assert post(quiet, report(4), basic=False).status_code == 202

    settings.EVENTS_RATE_LIMIT_PER_MINUTE = 0  # off
    assert post(noisy, report(5)).status_code == 202


def test_over_the_bytes_an_hour_is_429_counting_what_gzip_expands_to(make_trigger, settings):
    settings.EVENTS_RATE_LIMIT_BYTES_PER_HOUR = 30_000
    clear_of_the_window_edge(3600)
    token = make_trigger("big")
    assert post(token, report(0, 10_000)).status_code == 202
    assert post(token, report(1, 10_000)).status_code == 202
    body = assert_throttled(post(token, report(2, 10_000)), 3600)  # 30,000 would be over
    assert "30000 bytes an hour" in body["detail"]
    assert post(token, report(3, 5_000)).status_code == 202  # a refused report did not count

    other = make_trigger("gzipped")
    compressed = gz(report(4, 31_000))
    assert len(compressed) < 1_000  # what is counted before reading
    assert post(other, compressed, HTTP_CONTENT_ENCODING="gzip").status_code == 202
    assert_throttled(post(other, report(5)), 3600)  # what was stored counts

    settings.EVENTS_RATE_LIMIT_BYTES_PER_HOUR = 0  # off
    assert post(token, report(2, 10_000)).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_the_budget_is_checked_before_the_body_is_read(live_server, make_trigger, settings):
    settings.EVENTS_RATE_LIMIT_PER_MINUTE = 1
    clear_of_the_window_edge(60)
    token = make_trigger("flood")
    assert post(token, report(0)).status_code == 202
    address = urlparse(live_server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        # A large body (within EVENTS_MAX_BODY_BYTES) announced and never sent: the answer comes anyway.
        sock.sendall(
            f"POST /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/x-yaml\r\nContent-Length: 30000000\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    assert (
        b"\r\nretry-after: " in answer.lower()
    )  # header names are case-insensitive (uvicorn sends them lowercase)


def test_without_redis_each_process_keeps_the_budget(make_trigger, settings, caplog):
    settings.REDIS_URL = "redis://:redis-password@127.0.0.1:1/0"  # nothing listens there
    settings.EVENTS_RATE_LIMIT_PER_MINUTE = 2
    clear_of_the_window_edge(60)
    token = make_trigger("alone")
    started = time.monotonic()
    assert post(token, report(0)).status_code == 202
    assert post(token, report(1)).status_code == 202
    assert_throttled(post(token, report(2)), 60)
    assert time.monotonic() - started < 5
    assert "Redis unavailable" in caplog.text
    assert "redis-password" not in caplog.text
