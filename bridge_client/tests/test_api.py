"""The client's retry policy, against a local HTTP server that answers as scripted."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from relay_bridge.api import ApiError, RelayClient

TOKEN = "rlyp_" + "a" * 61
R1, R2 = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"


class Scripted:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict] | str] = []  # (status, body) or "drop"
        self.seen: list[dict] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                scripted.seen.append(
                    {"method": self.command, "path": self.path, "body": body, "headers": dict(self.headers)}
                )
                answer = scripted.answers.pop(0) if scripted.answers else (200, {"runs": []})
                if answer == "drop":  # the connection dies before an answer
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, payload = answer
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    scripted = Scripted()
    yield scripted
    scripted.server.shutdown()


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def client(server, sleeps):
    api = RelayClient(
        server.url,
        TOKEN,
        platform="oss",
        backend="ssh",
        attempts=4,
        backoff=0.5,
        backoff_cap=1.5,
        sleep=sleeps.append,
    )
    yield api
    api.close()


def test_every_call_says_who_it_is(client, server):
    client.list_runs(status="pending", wait=30)
    [call] = server.seen
    assert call["path"] == "/_puppet/runs?status=pending&wait=30"
    assert call["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert (call["headers"]["X-Relay-Platform"], call["headers"]["X-Relay-Backend"]) == ("oss", "ssh")
    assert TOKEN not in repr(client)


def test_5xx_and_dropped_connections_are_retried_with_capped_jittered_backoff(client, server, sleeps):
    server.answers = [(503, {}), "drop", (500, {}), (200, {"runs": [{"id": R1}]})]
    assert client.list_runs() == [{"id": R1}]
    assert len(server.seen) == 4 and len(sleeps) == 3
    for attempt, slept in enumerate(sleeps, start=1):
        assert 0 <= slept <= min(1.5, 0.5 * 2**attempt)


def test_it_gives_up_after_its_attempts(client, server, sleeps):
    server.answers = [(502, {})] * 4
    with pytest.raises(ApiError) as caught:
        client.get_run(R1)
    assert caught.value.status == 0 and "gave up after 4 tries" in str(caught.value)


def test_a_4xx_is_not_retried_and_carries_the_problem(client, server):
    server.answers = [(400, {"type": "urn:relay:problem:validation_error", "detail": "bad scope"})]
    with pytest.raises(ApiError) as caught:
        client.create_run({"scope": {}})
    assert caught.value.status == 400 and caught.value.problem["detail"] == "bad scope"
    assert len(server.seen) == 1


def test_a_run_is_never_created_twice_by_a_resend(client, server):
    server.answers = ["drop"]  # the service may have created it before the connection died
    with pytest.raises(ApiError):
        client.create_run({"scope": {"nodes": ["a"]}})
    assert len(server.seen) == 1


def test_accept_keeps_its_lease_across_retries_and_409_means_someone_else(client, server):
    server.answers = ["drop", (202, {"lease_id": "L"})]
    assert client.accept(R1) == "L"
    first, second = server.seen
    assert first["body"]["lease_id"] == second["body"]["lease_id"]  # a lost answer is not a lost race
    server.answers = [(409, {"detail": "accepted already"})]
    assert client.accept(R2) is None


def test_a_listed_run_whose_id_is_not_a_uuid_is_refused_with_a_log_line(client, server, caplog):
    """Its id would become a directory (`/etc`, `../..`) and a URL path: it never gets that far."""
    bad = ["/etc", "../../tmp/x", R1 + "/../x", "6F9619FF-8B86-D011-B42D-00C04FC964FF", "", None, 7]
    server.answers = [(200, {"runs": [*({"id": b} for b in bad), "not a run", {"id": R1}]})]
    assert client.list_runs() == [{"id": R1}]
    refused = [r for r in caplog.records if r.getMessage() == "refusing a listed run: its id is not a UUID"]
    assert [r.fields["id"] for r in refused] == [repr(b) for b in bad]
    caplog.clear()
    server.answers = [(200, {"runs": [{"id": "/etc"}, {"id": "/var"}]})]
    assert client.list_runs() == []
    assert [r.fields["id"] for r in caplog.records] == ["'/var'"]  # each refused id is logged once


@pytest.mark.parametrize("call", ["accept", "put_state", "get_run", "cancel"])
def test_no_request_is_built_from_a_run_id_that_is_not_a_uuid(client, server, call):
    method = getattr(client, call)
    with pytest.raises(ApiError, match="not a UUID"):
        method("../../api/connections", {}) if call == "put_state" else method("../../api/connections")
    assert server.seen == []


def test_the_configured_proxy_carries_every_call_whatever_the_environment_says(server, monkeypatch):
    """requests lets http_proxy in the environment win over a session's proxies: the module's
    proxy_host must not lose to it. Here `server` is the proxy, and the service is not even
    resolvable: only a proxy can answer."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "")
    proxy = server.url.replace("http://", "http://relay:p%40ss%3Aw%2Frd@")
    api = RelayClient("http://relay.invalid/", TOKEN, proxy_url=proxy, attempts=1)
    try:
        assert api.list_runs(status="pending") == []
    finally:
        api.close()
    [call] = server.seen
    assert call["path"] == "http://relay.invalid/_puppet/runs?status=pending"  # the proxy's absolute form
    assert call["headers"]["Proxy-Authorization"] == "Basic " + base64.b64encode(b"relay:p@ss:w/rd").decode()
