import hashlib
import json
import zlib

import pytest
from django.core.files.storage import storages

from tests.events_helpers import fixture, gz, post
from tests.test_connection_api import assert_problem
from triggers.ingest import PEEK_WHOLE_JSON, body_name
from triggers.models import Event, Trigger

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def trigger(alice):
    trigger, token = Trigger.create_with_token(owner=alice, name="reports")
    return trigger, str(token)


def stored(event: Event) -> bytes:
    with storages["events"].open(body_name(event.body_sha256), "rb") as body:
        return body.read()


def test_a_yaml_report_with_basic_auth_is_stored_and_answered_202(trigger):
    t, token = trigger
    response = post(token, REPORT)  # as Puppet's http processor: Basic, application/x-yaml
    assert response.status_code == 202
    event = Event.objects.get(pk=response.json()["id"])
    assert (event.trigger_id, event.state, event.body_format) == (t.pk, "received", "yaml")
    assert event.body_sha256 == hashlib.sha256(REPORT).hexdigest() and event.body_size == len(REPORT)
    assert stored(event) == REPORT


def test_json_reports_and_push_bodies_with_bearer_and_gzip(trigger):
    _, token = trigger
    push = json.dumps({"data": {"host": "web1", "status": "changed"}, "key": "k1"}).encode()
    plain = post(token, push, "application/json", basic=False)
    zipped = post(
        token,
        gz(b'{"host": "web2", "status": "failed"}'),
        "application/json; charset=utf-8",
        basic=False,
        HTTP_CONTENT_ENCODING="gzip",
    )
    assert plain.status_code == zipped.status_code == 202
    event = Event.objects.get(pk=zipped.json()["id"])
    assert stored(event) == b'{"host": "web2", "status": "failed"}'  # stored decompressed
    assert event.body_format == "json"


def test_the_same_body_again_is_the_same_event(trigger):
    _, token = trigger
    first, again = post(token, REPORT), post(token, gz(REPORT), HTTP_CONTENT_ENCODING="gzip")
    assert first.json()["id"] == again.json()["id"]
    assert Event.objects.count() == 1


def test_content_length_is_required(trigger):
    _, token = trigger
    assert_problem(post(token, REPORT, CONTENT_LENGTH=""), 411)
    assert Event.objects.count() == 0


def test_a_body_over_the_limit_is_413_before_it_is_read(trigger, settings):
    _, token = trigger
    settings.EVENTS_MAX_BODY_BYTES = 1000
    assert_problem(post(token, REPORT), 413)
    assert Event.objects.count() == 0


def test_a_gzip_bomb_is_413(trigger, settings):
    _, token = trigger
    bomb = gz(b"\0" * (50 * 1024 * 1024))  # 50 MiB of zeros in about 50 KiB
    assert len(bomb) < 100_000
    assert "decompresses" in assert_problem(post(token, bomb, HTTP_CONTENT_ENCODING="gzip"), 413)["detail"]
    settings.EVENTS_MAX_GZIP_RATIO = 10_000
    settings.EVENTS_MAX_DECOMPRESSED_BYTES = 1024 * 1024
    assert "1048576" in assert_problem(post(token, bomb, HTTP_CONTENT_ENCODING="gzip"), 413)["detail"]
    assert Event.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "extra", "status"),
    [
        (gz(REPORT)[:-20], {"HTTP_CONTENT_ENCODING": "gzip"}, 400),  # truncated gzip
        (b"not gzip at all", {"HTTP_CONTENT_ENCODING": "gzip"}, 400),
        (zlib.compress(REPORT), {"HTTP_CONTENT_ENCODING": "deflate"}, 415),
        # (the test client sends neither header with an empty body; real clients do)
        (b"", {"CONTENT_TYPE": "application/x-yaml", "CONTENT_LENGTH": "0"}, 400),
    ],
)
def test_bad_bodies_are_4xx_at_the_door(trigger, body, extra, status):
    _, token = trigger
    assert_problem(post(token, body, **extra), status)
    assert Event.objects.count() == 0


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "", "multipart/form-data"])
def test_unknown_content_types_are_415(trigger, content_type):
    _, token = trigger
    assert_problem(post(token, REPORT, content_type), 415)


def test_wrong_tokens_are_401(trigger, connection):
    _, token = trigger
    _, connection_token = connection
    assert_problem(post(token[:-1] + "x", REPORT), 401)
    assert_problem(post(connection_token, REPORT), 401)  # a connection token is not a trigger's
    assert Event.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_body_shorter_than_its_content_length_is_400(live_server, alice):
    import socket
    from urllib.parse import urlparse

    _, token = Trigger.create_with_token(owner=alice, name="reports")
    address = urlparse(live_server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        head = (
            f"POST /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/x-yaml\r\nContent-Length: {len(REPORT) + 100}\r\n\r\n"
        )
        sock.sendall(head.encode() + REPORT)
        sock.shutdown(socket.SHUT_WR)  # the client gives up before sending it all
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"The body ended after" in answer
    assert Event.objects.count() == 0


def test_a_resend_of_the_same_run_is_the_same_event(trigger):
    _, token = trigger
    first = post(token, REPORT).json()["id"]
    # The same run (transaction_uuid), another body: answered with the first event's id.
    assert post(token, REPORT + b"# resent by a retrying processor\n").json()["id"] == first
    assert Event.objects.count() == 1


def test_a_push_body_resent_with_its_key_is_the_same_event(trigger):
    _, token = trigger
    body = {"data": {"host": "web1", "status": "changed"}, "key": "run-7"}
    first = post(token, json.dumps(body).encode(), "application/json").json()["id"]
    body["data"]["status"] = "failed"  # another body, the same key
    assert post(token, json.dumps(body).encode(), "application/json").json()["id"] == first
    body["key"] = "run-8"
    assert post(token, json.dumps(body).encode(), "application/json").json()["id"] != first
    assert Event.objects.count() == 2


def test_a_large_json_report_is_peeked_not_read_whole(trigger):
    _, token = trigger
    report = {
        "host": "h",
        "transaction_uuid": "6b7a1c3e-0000-4000-8000-00000000abcd",
        "status": "changed",
        "logs": [{"message": "x" * 100} for _ in range(5000)],
    }
    body = json.dumps(report).encode()
    assert len(body) > 256 * 1024
    first = post(token, body, "application/json").json()["id"]
    assert Event.objects.get(pk=first).transaction_uuid == report["transaction_uuid"]
    assert post(token, body + b" ", "application/json").json()["id"] == first


def test_a_failed_report_may_be_sent_again(trigger):
    _, token = trigger
    first = post(token, REPORT).json()["id"]
    Event.objects.filter(pk=first).update(state="failed")
    assert post(token, REPORT + b"# fixed\n").json()["id"] != first


def test_a_deeply_nested_json_body_is_a_400_at_the_door_or_stored_past_its_look(trigger):
    """Read whole at the door, it is refused with the worker's reason (it was stored, then
    `failed`); past what the door reads whole, it is stored and the worker says why."""
    _, token = trigger
    body = b'{"host": "deep", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    response = post(token, body, "application/json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"] == "The JSON is nested deeper than 64 levels; not read."
    assert not Event.objects.exists()
    larger = body + b" " * (PEEK_WHOLE_JSON - len(body) + 1)
    assert post(token, larger, "application/json").status_code == 202


def test_a_nul_in_a_push_key_or_run_id_is_202_and_kept_as_the_worker_keeps_it(trigger):
    _, token = trigger
    body = b'{"data": {"host": "h", "transaction_uuid": "run\\u0000x"}, "key": "a\\u0000b"}'
    response = post(token, body, "application/json")
    assert response.status_code == 202
    event = Event.objects.get(pk=response.json()["id"])
    assert (event.key, event.transaction_uuid) == ("a\ufffdb", "run\ufffdx")
    assert post(token, body + b" ", "application/json").json()["id"] == str(event.pk)


def test_a_lone_surrogate_in_a_push_key_or_run_id_is_202_and_kept_as_the_worker_keeps_it(trigger):
    """A push door stores first and reads later (a report may be large): what the database
    cannot keep of what it peeks at becomes U+FFFD, as a NUL does. It was a 500."""
    _, token = trigger
    body = b'{"data": {"host": "h", "transaction_uuid": "run\\ud800x"}, "key": "a\\udc00b"}'
    response = post(token, body, "application/json")
    assert response.status_code == 202, response.content
    event = Event.objects.get(pk=response.json()["id"])
    assert (event.key, event.transaction_uuid) == ("a\ufffdb", "run\ufffdx")
