"""A sandboxed step's network (scriptsteps/network.py): its own network namespace, the runtime
API through its worker's door, public HTTP(S) through its worker's proxy.

Through real workers and real bubblewrap sandboxes: a step reaches nothing of the host's
network directly (PostgreSQL, Redis, OpenBao, the service itself, the metadata address), yet
`ni` works; the proxy refuses loopback, private and link-local destinations with 403 and
carries plain http and https (CONNECT) to a destination it allows. The destination is a
stand-in on 127.0.0.2, which clients send through the proxy as they would any public
address, allowed by the test-only STEP_PROXY_TEST_LOOPBACK_PORTS for its two ports alone.
Then the doors themselves, served by StepNetwork in this process: the allow-list, the bounds
(connections, idle, head size), malformed requests, the runtime door's Host, and closing."""

import contextlib
import json
import socket
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from scriptsteps import network
from tests.script_helpers import STANDIN_HOST, StandIn
from tests.test_script_steps import log_of
from tests.workflow_helpers import finished, run_of, steps_of


def step_source(lines: list[str], image: str = "relaysh/core", env: dict | None = None) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "steps": [
                {"name": "s", "image": image, "spec": {"greeting": "hi"}, "env": env or {}, "input": lines}
            ],
        }
    )


def run_step(owner: User, lines: list[str], name: str = "wf", **kwargs) -> str:
    run = finished(run_of(owner, step_source(lines, **kwargs), name=name), timeout=60)
    log = log_of(run, "s")
    assert steps_of(run)["s"].status == "success", (steps_of(run)["s"].message, log)
    return log


def host_address() -> str | None:
    """This machine's address on its own network (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks a route
        except OSError:
            return None
        return probe.getsockname()[0]


# Through real workers and sandboxes ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_step_reaches_nothing_of_the_hosts_network_directly_yet_ni_works(
    proxied_workers, owner, bao, live_server, standin
):
    vault = bao.addr.split("//", 1)[1].rsplit(":", 1)
    destinations = [
        "127.0.0.1/5432",  # PostgreSQL (trust auth)
        "127.0.0.1/6379",  # Redis, the broker
        f"{vault[0]}/{vault[1]}",  # OpenBao
        f"127.0.0.1/{live_server.url.rsplit(':', 1)[1]}",  # the service itself
        f"{STANDIN_HOST}/{standin.port}",  # allowed through the proxy, never directly
        "169.254.169.254/80",  # cloud metadata
    ]
    address = host_address()
    if address:
        destinations.append(f"{address}/5432")
    log = run_step(
        owner,
        [
            "#!/bin/bash",
            f"for dest in {' '.join(destinations)}; do",
            '  if timeout 3 bash -c "exec 3<>/dev/tcp/$dest" 2>/dev/null; then echo "OPEN $dest";'
            ' else echo "closed $dest"; fi',
            "done",
            "echo \"interfaces $(grep -c ':' /proc/net/dev)\"",
            'echo "spec says $(ni get -p "{.greeting}")"',
            "ni output set -k reached -v yes",
        ],
    )
    for dest in destinations:
        assert f"closed {dest}\n" in log, log
    assert "OPEN" not in log
    assert "interfaces 1\n" in log  # its own loopback, nothing else
    assert "spec says hi\n" in log


@pytest.mark.django_db(transaction=True)
def test_the_proxy_refuses_what_is_not_public_with_403_and_says_why(
    proxied_workers, owner, live_server, standin
):
    live_port = live_server.url.rsplit(":", 1)[1]
    refused = {
        "http://127.0.0.1:5432/": "a loopback address",
        "http://localhost:6379/": "a loopback address",
        f"http://{STANDIN_HOST}:{live_port}/": "a loopback address",  # test-only ports, service's name
        "http://169.254.169.254/latest/meta-data/": "a link-local address",
        "http://10.0.0.1/": "a private address",
        "http://[::ffff:127.0.0.1]:5432/": "a loopback address",
    }
    lines = ["#!/bin/bash"]
    for url in refused:
        # --noproxy '': past NO_PROXY (127.0.0.1, localhost), as a step could do on purpose.
        lines.append(
            f"curl -sS --noproxy '' -o /work/body -w '%{{http_code}} {url} ' '{url}'; cat /work/body; echo"
        )
    lines.append(
        "curl -sS --noproxy '' -o /dev/null -w 'CONNECT %{http_connect}\\n' "
        "https://169.254.169.254/ 2>/dev/null"
    )
    lines.append("true")
    log = run_step(owner, lines)
    for url, reason in refused.items():
        line = next((line for line in log.splitlines() if f" {url} " in line), "")
        assert line.startswith(f"403 {url} "), log
        body = json.loads(line.split(f" {url} ", 1)[1])
        assert body["status"] == 403 and body["type"] == "urn:relay:problem:destination-not-public"
        assert reason in body["detail"] and "public addresses only" in body["detail"]
    assert "CONNECT 403\n" in log
    assert not [seen for seen in standin.received if seen["path"] == "/"]


@pytest.mark.django_db(transaction=True)
def test_http_and_https_go_through_the_proxy_to_a_destination_it_allows(
    proxied_workers, owner, standin, live_server
):
    standin.received.clear()
    ca = standin.ca.read_text()
    log = run_step(
        owner,
        [
            "#!/bin/bash",
            'printf "%s" "$CA" > /work/ca.pem',
            f"curl -sS http://{STANDIN_HOST}:{standin.port}/plain?via=curl",
            f"curl -sS --cacert /work/ca.pem https://{STANDIN_HOST}:{standin.tls_port}/tls?via=curl",
            # The service at RELAY_PUBLIC_URL (a puppet connection's relayAPIURL), loopback
            # here: the proxy takes it wherever it is.
            'curl -sS "$SERVICE/healthz"; echo',
        ],
        env={"CA": ca, "SERVICE": live_server.url},
    )
    assert "stand-in saw /plain?via=curl\nstand-in saw /tls?via=curl\n" + '{"status": "ok"}\n' == log
    plain = next(seen for seen in standin.received if seen["path"] == "/plain?via=curl")
    # The proxy's doing: the request's Host from its URL, one request per connection, and
    # nothing of the hop to the proxy.
    assert plain["headers"]["host"] == f"{STANDIN_HOST}:{standin.port}"
    assert plain["headers"]["connection"] == "close"
    assert "proxy-connection" not in plain["headers"]

    # requests and urllib (relay_sdk's and ni's) take the same way, from the same variables.
    python = [
        "#!/usr/bin/env python3",
        "import os, requests, urllib.request",
        "open('/work/ca.pem', 'w').write(os.environ['CA'])",
        f"print(requests.get('http://{STANDIN_HOST}:{standin.port}/py?via=requests').text, end='')",
        f"print(requests.get('https://{STANDIN_HOST}:{standin.tls_port}/py?via=requests-tls',"
        " verify='/work/ca.pem').text, end='')",
        f"print(urllib.request.urlopen('http://{STANDIN_HOST}:{standin.port}/py?via=urllib')"
        ".read().decode(), end='')",
        "from relay_sdk import Interface, Dynamic as D",
        "print('sdk', Interface().get(D.greeting))",
    ]
    log = run_step(owner, python, name="py", image="relaysh/core:latest-python", env={"CA": ca})
    assert log == (
        "stand-in saw /py?via=requests\nstand-in saw /py?via=requests-tls\n"
        "stand-in saw /py?via=urllib\nsdk hi\n"
    )


@pytest.mark.django_db(transaction=True)
def test_the_service_is_reached_only_with_http_requests_for_its_own_paths(
    proxied_workers, owner, live_server
):
    """RELAY_PUBLIC_URL (here the live server, on loopback) through the proxy, and
    STEP_RUNTIME_URL through the runtime door: its runtime and API paths, nothing else; and
    no CONNECT tunnel to it, whose contents the proxy could not check."""
    service = live_server.url
    runtime = f"http://127.0.0.1:{network.RUNTIME_PORT}"
    asked = {
        "health": f"{service}/healthz",
        "api": f"{service}/api/workflows/",
        "admin": f"{service}/admin/login/",
        "dotdot": f"{service}/api/../admin/login/",
        "encoded": f"{service}/api/%2e%2e/admin/login/",
        "schema-not-api": f"{service}/apix",
        "door-admin": f"{runtime}/admin/login/",
        "door-dotdot": f"{runtime}/spec/../admin/login/",
    }
    lines = ["#!/bin/bash"]
    for name, url in asked.items():
        lines.append(
            f"curl -sS --path-as-is -o /work/{name} -w '{name} %{{http_code}}\\n' '{url}'; "
            f"echo \"{name} body $(head -c 300 /work/{name} | tr -d '\\n')\""
        )
    # A CONNECT tunnel to the service (curl --proxytunnel), as an https client would open.
    lines.append(
        "curl -sS -p -o /dev/null -w 'tunnel %{http_code} %{http_connect}\\n' "
        f"'{service}/healthz' 2>&1 | tail -1"
    )
    lines.append('echo "spec says $(ni get -p "{.greeting}")"')
    log = run_step(owner, lines, name="service")
    seen = {}
    for line in log.splitlines():
        name, kind, *rest = line.split(" ", 2)
        if kind == "body":
            seen.setdefault(name, {})["body"] = rest[0] if rest else ""
        elif name in asked:
            seen.setdefault(name, {})["status"] = int(kind)
    assert seen["health"] == {"status": 200, "body": '{"status": "ok"}'}, log
    # The API answers for itself (no credential: 401/403), it is not the proxy that refuses.
    assert seen["api"]["status"] in (401, 403) and "not-a-service-path" not in seen["api"]["body"], log
    for name in ("admin", "dotdot", "encoded", "schema-not-api", "door-admin", "door-dotdot"):
        assert seen[name]["status"] == 403, (name, log)
        body = json.loads(seen[name]["body"])
        assert body["type"] == "urn:relay:problem:not-a-service-path", (name, body)
        assert "only for the step runtime API, /api/, /_puppet/ and /healthz" in body["detail"]
    assert "tunnel 000 403\n" in log or "tunnel 403 403\n" in log, log
    assert "spec says hi\n" in log


# The doors themselves, served in this process ------------------------------------------


def ask(path: Path, request: bytes, timeout: float = 5) -> bytes:
    """Send `request` on the Unix socket at `path`; everything answered until it closes
    (a door that refuses a connection before reading it closes with the request unread,
    which a Unix socket's peer sees as a reset after the answer)."""
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(timeout)
        client.connect(str(path))
        client.sendall(request)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(65536):
                answer += chunk
        return answer


def received_until(client: socket.socket, end: bytes) -> bytes:
    answer = b""
    while not answer.endswith(end):
        chunk = client.recv(65536)
        assert chunk, answer
        answer += chunk
    return answer


def problem_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"Content-Type: application/problem+json" in head
    return int(head.split(b" ")[1]), json.loads(body)


def loopback(standin: StandIn, **policy) -> network.Policy:
    return network.Policy(loopback_ports=frozenset({standin.port, standin.tls_port}), **policy)


def test_the_allow_list_is_the_only_way_out_when_set(standin):
    policy = loopback(standin, allow=(f"{STANDIN_HOST}:{standin.port}", "*.example.com:443"))
    assert policy.allows("api.example.com", 443) and not policy.allows("api.example.com", 80)
    assert not policy.allows("example.com", 443) and not policy.allows("evil.com", 443)
    with network.StepNetwork(True, policy=policy) as doors:
        proxy = doors.directory / network.PROXY_SOCKET
        answer = ask(
            proxy, f"GET http://{STANDIN_HOST}:{standin.port}/ok HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.0 200 ") or answer.startswith(b"HTTP/1.1 200 ")
        assert answer.endswith(b"stand-in saw /ok\n")
        status, body = problem_of(
            ask(proxy, f"CONNECT {STANDIN_HOST}:{standin.tls_port} HTTP/1.1\r\n\r\n".encode())
        )
        assert status == 403 and body["type"] == "urn:relay:problem:destination-not-allowed"
        assert body["detail"] == f"{STANDIN_HOST}:{standin.tls_port} is not in STEP_PROXY_ALLOW."


def test_malformed_requests_are_answered_400_and_a_huge_head_431(standin):
    with network.StepNetwork(True, policy=loopback(standin)) as doors:
        proxy = doors.directory / network.PROXY_SOCKET
        for request in (
            b"GARBAGE\r\n\r\n",
            b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n",  # a proxy takes absolute URLs
            f"GET https://{STANDIN_HOST}:{standin.tls_port}/ HTTP/1.1\r\n\r\n".encode(),  # https: CONNECT
            b"CONNECT nowhere HTTP/1.1\r\n\r\n",  # no port
            b"CONNECT host:99999 HTTP/1.1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\n folded: header\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
        ):
            status, body = problem_of(ask(proxy, request))
            assert status == 400 and body["type"] == "urn:relay:problem:bad-request", request
        status, _ = problem_of(ask(proxy, b"GET http://a/ HTTP/1.1\r\nX: " + b"a" * 40000 + b"\r\n\r\n"))
        assert status == 431
        runtime = doors.directory / network.RUNTIME_SOCKET
        status, body = problem_of(ask(runtime, b"GET http://elsewhere/spec HTTP/1.1\r\n\r\n"))
        assert status == 400 and body["detail"] == "The runtime API takes paths (/spec), not URLs."


def test_the_runtime_door_goes_to_step_runtime_url_only_with_its_host(standin, settings):
    settings.STEP_RUNTIME_URL = f"http://{STANDIN_HOST}:{standin.port}/base"
    assert network.runtime_url_inside() == f"http://127.0.0.1:{network.RUNTIME_PORT}/base"
    standin.received.clear()
    with network.StepNetwork(False) as doors:
        assert not (doors.directory / network.PROXY_SOCKET).exists()  # STEP_NETWORK off: no proxy
        answer = ask(
            doors.directory / network.RUNTIME_SOCKET,
            b"GET /base/spec HTTP/1.1\r\nHost: evil.example\r\nConnection: keep-alive, X-Drop\r\n"
            b"X-Drop: 1\r\nAuthorization: Basic cnRfeDo=\r\n\r\n",
        )
    head = answer.partition(b"\r\n\r\n")[0]
    assert b" 200 " in head.split(b"\r\n")[0] and b"Connection: close" in head.split(b"\r\n")
    [seen] = standin.received
    assert seen["path"] == "/base/spec"
    assert seen["headers"]["host"] == f"{STANDIN_HOST}:{standin.port}"
    assert seen["headers"]["connection"] == "close" and "x-drop" not in seen["headers"]
    assert seen["headers"]["authorization"] == "Basic cnRfeDo="
    # A client that sends even the runtime API's address through the proxy (relay_sdk does)
    # reaches the same place, and only there.
    with network.StepNetwork(True, policy=network.Policy()) as doors:
        answer = ask(
            doors.directory / network.PROXY_SOCKET,
            f"GET http://127.0.0.1:{network.RUNTIME_PORT}/base/outputs/x HTTP/1.1\r\n"
            "Proxy-Connection: keep-alive\r\n\r\n".encode(),
        )
        assert answer.endswith(b"stand-in saw /base/outputs/x\n")
        assert standin.received[-1]["headers"]["host"] == f"{STANDIN_HOST}:{standin.port}"
        status, _ = problem_of(
            ask(doors.directory / network.PROXY_SOCKET, b"GET http://127.0.0.1:8001/ HTTP/1.1\r\n\r\n")
        )
        assert status == 403


def test_a_step_holds_at_most_its_connections_and_an_idle_one_is_closed(standin):
    policy = loopback(standin, connections=2, idle_seconds=0.6)
    with network.StepNetwork(True, policy=policy) as doors:
        proxy = str(doors.directory / network.PROXY_SOCKET)
        tunnels = []
        for _ in range(2):
            tunnel = socket.socket(socket.AF_UNIX)
            tunnel.settimeout(5)
            tunnel.connect(proxy)
            tunnel.sendall(f"CONNECT {STANDIN_HOST}:{standin.port} HTTP/1.1\r\n\r\n".encode())
            assert tunnel.recv(100) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            tunnels.append(tunnel)
        status, body = problem_of(
            ask(proxy, f"CONNECT {STANDIN_HOST}:{standin.port} HTTP/1.1\r\n\r\n".encode())
        )
        assert status == 503
        assert body["detail"] == "The step has 2 connections open already (STEP_NET_CONNECTIONS)."
        # A tunnel in use stays open past the idle time; one left idle is closed after it.
        started = time.monotonic()
        tunnels[0].sendall(f"GET /busy HTTP/1.1\r\nHost: {STANDIN_HOST}\r\n\r\n".encode())
        assert received_until(tunnels[0], b"stand-in saw /busy\n")
        time.sleep(0.4)
        tunnels[0].sendall(f"GET /still HTTP/1.1\r\nHost: {STANDIN_HOST}\r\n\r\n".encode())
        assert received_until(tunnels[0], b"stand-in saw /still\n")
        assert tunnels[1].recv(100) == b""  # closed by the door, idle
        assert 0.5 < time.monotonic() - started < 3
        # Its place is free again.
        answer = ask(proxy, f"GET http://{STANDIN_HOST}:{standin.port}/again HTTP/1.1\r\n\r\n".encode())
        assert answer.endswith(b"stand-in saw /again\n")
        for tunnel in tunnels:
            tunnel.close()
        last = socket.socket(socket.AF_UNIX)
        last.settimeout(5)
        last.connect(proxy)
        last.sendall(f"CONNECT {STANDIN_HOST}:{standin.port} HTTP/1.1\r\n\r\n".encode())
        assert last.recv(100).startswith(b"HTTP/1.1 200 ")
        directory = doors.directory
        ended = time.monotonic()
    # The step ended: its open tunnel is closed at once (not when idle), its directory gone.
    assert last.recv(100) == b""
    assert time.monotonic() - ended < 0.4
    assert not directory.exists()
    last.close()


def test_an_https_step_runtime_url_is_reached_over_tls_verified(standin, settings, monkeypatch):
    settings.STEP_RUNTIME_URL = f"https://{STANDIN_HOST}:{standin.tls_port}"
    request = b"GET /spec HTTP/1.1\r\nHost: x\r\n\r\n"
    # Not trusted (the stand-in's CA is its own): the step hears why, as a 502.
    with network.StepNetwork(False) as doors:
        status, body = problem_of(ask(doors.directory / network.RUNTIME_SOCKET, request))
    assert status == 502 and "CERTIFICATE_VERIFY_FAILED" in body["detail"]
    monkeypatch.setenv("SSL_CERT_FILE", str(standin.ca))  # OpenSSL's default verify paths
    standin.received.clear()
    with network.StepNetwork(False) as doors:
        answer = ask(doors.directory / network.RUNTIME_SOCKET, request)
    assert answer.endswith(b"stand-in saw /spec\n")
    assert standin.received[0]["headers"]["host"] == f"{STANDIN_HOST}:{standin.tls_port}"


@pytest.mark.parametrize(
    ("target", "base", "allowed"),
    [
        (b"/spec", "", True),
        (b"/outputs/build/x?q=1", "", True),
        (b"/api/workflows/deploy/runs/", "", True),
        (b"/_puppet/runs", "", True),
        (b"/relay/spec", "/relay", True),
        (b"/relay/api/", "/relay/", True),
        (b"/spec", "/relay", False),
        (b"/admin/login/", "", False),
        (b"/", "", False),
        (b"/static/admin/css/base.css", "", False),
        (b"/api/../admin/", "", False),
        (b"/api/./x", "", False),
        (b"/api/%2e%2e/admin/", "", False),
        (b"/api%2F..%2Fadmin/", "", False),
        (b"/secrets/x%2F..%2F..%2Fadmin", "", False),
        (b"//admin/", "", False),
        (b"/api//x", "", False),
        (b"/api\\..\\admin", "", False),
        (b"/api/%00", "", False),
        (b"/api/%ff", "", False),
        (b"/ap%69/x", "", False),
        (b"/relay/../spec", "/relay", False),
        (b"http://elsewhere/spec", "", False),
    ],
)
def test_only_the_services_own_paths_pass(target, base, allowed):
    if allowed:
        assert network.service_path(target, base) == target
    else:
        with pytest.raises(network.Refused) as refused:
            network.service_path(target, base)
        assert (refused.value.status, refused.value.code) == (403, "not-a-service-path")


def test_every_step_runtime_route_is_a_service_path():
    from stepruntime.urls import urlpatterns

    assert {str(pattern.pattern).split("/")[0] for pattern in urlpatterns} <= network.SERVICE_PATHS
    assert "admin" not in network.SERVICE_PATHS


def test_an_https_service_is_reached_with_plain_http_through_the_proxy_over_tls(standin, monkeypatch):
    """RELAY_PUBLIC_URL https on a private address: the step asks for http://host/… (naming
    no port, or its port); the proxy checks the path and goes on over TLS, verified."""
    monkeypatch.setenv("SSL_CERT_FILE", str(standin.ca))
    policy = network.Policy(service_url=f"https://{STANDIN_HOST}:{standin.tls_port}/relay")
    standin.received.clear()
    with network.StepNetwork(True, policy=policy) as doors:
        proxy = doors.directory / network.PROXY_SOCKET
        for authority in (STANDIN_HOST, f"{STANDIN_HOST}:{standin.tls_port}"):
            answer = ask(proxy, f"GET http://{authority}/relay/api/x HTTP/1.1\r\nHost: h\r\n\r\n".encode())
            assert answer.endswith(b"stand-in saw /relay/api/x\n"), answer
        assert [seen["headers"]["host"] for seen in standin.received] == [
            f"{STANDIN_HOST}:{standin.tls_port}"
        ] * 2
        status, body = problem_of(ask(proxy, f"GET http://{STANDIN_HOST}/admin/ HTTP/1.1\r\n\r\n".encode()))
        assert (status, body["type"]) == (403, "urn:relay:problem:not-a-service-path")
        # Its address is not public: a tunnel to it is refused like any other, saying how to
        # reach it instead.
        status, body = problem_of(
            ask(proxy, f"CONNECT {STANDIN_HOST}:{standin.tls_port} HTTP/1.1\r\n\r\n".encode())
        )
        assert (status, body["type"]) == (403, "urn:relay:problem:destination-not-public")
        assert "is no exception to a CONNECT tunnel" in body["detail"]
        assert f"http://{STANDIN_HOST}/…" in body["detail"]
        # The same name at another port is not the service.
        status, body = problem_of(
            ask(proxy, f"GET http://{STANDIN_HOST}:{standin.port}/api/ HTTP/1.1\r\n\r\n".encode())
        )
        assert (status, body["type"]) == (403, "urn:relay:problem:destination-not-public")
    assert len(standin.received) == 2
