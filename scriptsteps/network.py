"""A sandboxed step's network: an empty network namespace of its own, and two doors out of it
that the worker running the sandbox keeps open for the step's lifetime (docs/script-steps.md "Script
steps", Network).

Inside (bubblewrap's --unshare-net: nothing but the sandbox's own loopback), WRAPPER runs
first: socat listening on 127.0.0.1:RUNTIME_PORT, and with STEP_NETWORK on 127.0.0.1:PROXY_PORT,
each passing its connections to a Unix socket in the step's own directory (bind-mounted
read-only at INSIDE_DIR); the step's program starts once they listen.

On the worker, StepNetwork (an asyncio loop in a thread of the worker process) serves them:
- runtime.sock: each connection carries one HTTP request to STEP_RUNTIME_URL's host and port
  and nowhere else, with STEP_RUNTIME_URL's Host (so the service's ALLOWED_HOSTS need not
  know 127.0.0.1), over TLS when STEP_RUNTIME_URL is https;
- proxy.sock: an HTTP proxy, CONNECT (https, or any TCP a client tunnels) and absolute-form
  plain http, to public addresses only: the destination is resolved once, refused (403) when
  any address it resolves to is not public (relay/egress.py's rule) or it is not in
  STEP_PROXY_ALLOW, and the connection is made to the address checked.
The service itself is reached wherever it is, but only with HTTP requests the door can read,
to the service's own paths (SERVICE_PATHS, under the URL's own path; no `.`/`..` segment in
any encoding), and nothing else: through the runtime door (STEP_RUNTIME_URL); through the
proxy, a plain `http://` request to RELAY_PUBLIC_URL's host (at its port, or naming none: a
puppet connection's relayAPIURL, which Relay's Puppet steps call), forwarded to RELAY_PUBLIC_URL
(over TLS, verified, when it is https), or to 127.0.0.1:RUNTIME_PORT, the runtime door's own
address (relay_sdk sends it through the proxy). A CONNECT tunnel to the service is treated as
any other destination (refused unless it is public), since what goes through it cannot be
checked.
Bounded, so that a step cannot exhaust its worker: STEP_NET_CONNECTIONS connections at once
(503 past them), a request head of at most HEAD_BYTES read within HEAD_SECONDS, little in
flight per connection (one CHUNK read each way, a write buffer of CHUNK), a connection with
no bytes either way for STEP_NET_IDLE_SECONDS closed; all of it closed when the step ends.
"""

import asyncio
import concurrent.futures
import contextlib
import fnmatch
import json
import os
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

from relay import egress
from relay.api.problems import PROBLEM_CONTENT_TYPE, problem
from scriptsteps import mounts

INSIDE_DIR = "/run/relay"
RUNTIME_SOCKET = "runtime.sock"
PROXY_SOCKET = "proxy.sock"
RUNTIME_PORT = 8000  # the runtime API inside: METADATA_API_URL is http://…@127.0.0.1:8000
PROXY_PORT = 3128
# The first segment of every path a step may ask the service for: the step runtime API's
# routes (stepruntime/urls.py), the API (/api/: webhooks, workflows, runs), the Puppet-facing
# API (/_puppet/, a puppet connection's relayAPIURL) and /healthz. Not the admin.
SERVICE_PATHS = frozenset(
    {
        "conditions",
        "decorators",
        "events",
        "environment",
        "logs",
        "outputs",
        "secrets",
        "spec",
        "status",
        "validate",
        "workflows",
        "api",
        "_puppet",
        "healthz",
    }
)
SOCAT = "/usr/bin/socat"
CHUNK = 16384
HEAD_BYTES = 32768
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 10.0
# Headers that belong to one hop (RFC 9110 7.6.1), never passed on; each request is the
# only one of its connection (Connection: close both ways), so one destination per connection.
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"upgrade",
    b"host",
}

# The sandbox's first process (dash): the listeners, then the program once they listen. In
# the sandbox's fresh network namespace, /proc/net/sockstat's "TCP: inuse" counts exactly its
# listening sockets until the program starts (a TCP socket counts once it listens or
# connects, and nothing else runs yet); it is a few counters, where /proc/net/tcp walks the
# kernel's socket tables on every read (dash reads a byte at a time: 10+ ms). A socat that
# ended (it could not listen) ends the sandbox with 125, "could not be set up". Once they
# listen, a byte on its stdin (a pipe's writing end, where dash's redirections reach only
# fds 0-9) tells the worker that the sandbox started; the program's stdin is /dev/null.
# $1: the runtime API's port, $2 the proxy's ("-" without one); then the program.
WRAPPER = f"""\
listen() {{
  {SOCAT} TCP-LISTEN:"$1",bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:{INSIDE_DIR}/"$2" \\
    </dev/null >/dev/null 2>&1 &
}}
listen "$1" {RUNTIME_SOCKET}; runtime=$! proxy= want=1
[ "$2" = - ] || {{ listen "$2" {PROXY_SOCKET}; proxy=$! want=2; }}
shift 2
while :; do
  while read -r kind _ count _; do [ "$kind" = TCP: ] && break; done < /proc/net/sockstat
  [ "$count" -ge "$want" ] && break
  if ! kill -0 "$runtime" 2>/dev/null || {{ [ -n "$proxy" ] && ! kill -0 "$proxy" 2>/dev/null; }}; then
    echo "relay: the step's network could not be set up (socat ended)" >&2
    exit 125
  fi
done
printf x >&0; exec </dev/null
exec "$@"
"""


def wrapper_argv(proxy: bool) -> list[str]:
    return ["/bin/sh", "-c", WRAPPER, "relay-net", str(RUNTIME_PORT), str(PROXY_PORT) if proxy else "-"]


def inside_env(proxy: bool) -> dict[str, str]:
    """The proxy variables curl, git, pip, requests and urllib honour (curl reads only the
    lowercase http_proxy). 127.0.0.1 goes through the proxy too: RELAY_PUBLIC_URL may be a
    loopback address of the worker's (a development setup), which only the proxy reaches;
    the runtime API's 127.0.0.1:RUNTIME_PORT the proxy takes to the runtime door's
    destination (relay_sdk, whose requests choose a proxy by its placeholder host `api`,
    sends it through the proxy whatever NO_PROXY says). `localhost` stays direct, for a
    step's own servers."""
    if not proxy:
        return {}
    url = f"http://127.0.0.1:{PROXY_PORT}"
    names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
    return {**dict.fromkeys(names, url), "NO_PROXY": "localhost", "no_proxy": "localhost"}


def runtime_url_inside() -> str:
    """STEP_RUNTIME_URL as a sandboxed step reaches it: its door on its own loopback, with
    STEP_RUNTIME_URL's path (the forwarder passes paths as they are)."""
    return f"http://127.0.0.1:{RUNTIME_PORT}{urlsplit(settings.STEP_RUNTIME_URL).path}"


@dataclass(frozen=True)
class Policy:
    """Where the proxy may connect, and how much a step's doors may hold."""

    allow: tuple[str, ...] = ()  # empty: any public destination; else "host", "*.domain[:port]", "*:443"
    loopback_ports: frozenset[int] = frozenset()  # tests only: their stand-ins listen on loopback
    service_url: str = ""  # RELAY_PUBLIC_URL: its paths (SERVICE_PATHS) reached wherever it is
    connections: int = 32
    idle_seconds: float = 120.0

    @classmethod
    def from_settings(cls) -> "Policy":
        return cls(
            allow=tuple(entry.strip().lower() for entry in settings.STEP_PROXY_ALLOW if entry.strip()),
            loopback_ports=frozenset(settings.STEP_PROXY_TEST_LOOPBACK_PORTS),
            service_url=settings.RELAY_PUBLIC_URL,
            connections=settings.STEP_NET_CONNECTIONS,
            idle_seconds=settings.STEP_NET_IDLE_SECONDS,
        )

    def allows(self, host: str, port: int) -> bool:
        if not self.allow:
            return True
        name = host.lower().rstrip(".")
        for entry in self.allow:
            pattern, colon, wanted = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
            if colon and wanted != str(port):
                continue
            if fnmatch.fnmatchcase(name, pattern.strip("[]")):
                return True
        return False


def service_path(target: bytes, base: str) -> bytes:
    """`target` (a path and query) when it names one of the service's own paths under `base`
    (the service URL's path); Refused (403) otherwise. Strict, so that no server in front of
    the service (a reverse proxy that normalizes) can read it as another path: as sent and
    percent-decoded alike, under `base` and with a first segment of SERVICE_PATHS, and with
    no `.` or `..` segment, empty segment, backslash or NUL."""
    text = target.decode("latin-1")
    path = text.split("?", 1)[0]
    try:
        decoded = unquote(path, errors="strict")
    except UnicodeDecodeError:
        decoded = ""  # not a path of the service's
    prefix = base.rstrip("/") + "/"
    if "#" in text or not all(_service_form(form, prefix) for form in (path, decoded)):
        raise Refused(
            403,
            "A step may ask the service only for the step runtime API, /api/, /_puppet/ and "
            f"/healthz (under {prefix}); not {text[:100]!r}.",
            "not-a-service-path",
        )
    return target


def _service_form(path: str, prefix: str) -> bool:
    if not path.startswith(prefix) or "\\" in path or "\x00" in path:
        return False
    segments = path[len(prefix) :].split("/")
    if any(segment in ("", ".", "..") for segment in segments[:-1]) or segments[-1] in (".", ".."):
        return False
    return segments[0] in SERVICE_PATHS and all(s not in (".", "..") for s in path.split("/"))


def _addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, once, unchecked (the service's own name)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def _has_port(entry: str) -> bool:
    # "host:443", "[::1]:443"; a bare IPv6 address has colons but no port.
    head, colon, tail = entry.rpartition(":")
    return bool(colon) and tail.isdigit() and (head.endswith("]") or ":" not in head)


class Refused(Exception):
    """An answer the door gives instead of connecting: status, detail, problem code."""

    def __init__(self, status: int, detail: str, code: str) -> None:
        super().__init__(detail)
        self.status, self.detail, self.code = status, detail, code


class _Closed(Exception):
    """The client went away before its request was whole: nothing to answer."""


@dataclass
class _Head:
    """A request's (method, target, version) or a response's (version, status, reason)."""

    first: tuple[bytes, bytes, bytes]
    headers: list[tuple[bytes, bytes]]

    @property
    def method(self) -> bytes:
        return self.first[0]

    @property
    def target(self) -> bytes:
        return self.first[1]

    @property
    def status(self) -> bytes:
        return self.first[1]

    def rewritten(self, target: bytes, host: bytes) -> bytes:
        """The head as sent on: `target`, the Host given, no hop-by-hop headers (nor those
        Connection names), and Connection: close."""
        named = {
            part.strip().lower()
            for name, value in self.headers
            if name.lower() == b"connection"
            for part in value.split(b",")
        }
        lines = [b"%s %s %s" % (self.method, target, self.first[2]), b"Host: " + host]
        lines += [
            name + b": " + value
            for name, value in self.headers
            if name.lower() not in HOP_BY_HOP and name.lower() not in named
        ]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


TOKEN = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def parse_head(head: bytes) -> _Head:
    """A request's or a response's head. Strict: folded lines, names that are not tokens and
    bare CRs or NULs are refused."""
    lines = head.removesuffix(b"\r\n\r\n").split(b"\r\n")
    first = lines[0].split(b" ", 2)
    if len(first) != 3 or b"\x00" in head or b"\r" in b"".join(lines) or b"\n" in b"".join(lines):
        raise Refused(400, "The request's first line or head is malformed.", "bad-request")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or not set(name) <= TOKEN:
            raise Refused(400, f"A header line is malformed: {line[:60]!r}.", "bad-request")
        headers.append((name, value.strip(b" \t")))
    return _Head((first[0], first[1], first[2]), headers)


def split_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """ "host:port", "[v6]:port" (or just the host, with a default port) -> (host, port)."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
        if not bracket:
            raise ValueError(text)
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not port_text:
        if default_port is None:
            raise ValueError(text)
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
        raise ValueError(text)
    return host, int(port_text)


class StepNetwork:
    """The worker's side of one step's doors, served from entering to leaving: a directory of
    its own (mode 0700, owned by the sandbox's uid when the worker gives it one, so that only
    that uid and root may connect), its sockets, and the thread with their loop."""

    def __init__(
        self, proxy: bool, uid: int | None = None, gid: int | None = None, policy: Policy | None = None
    ) -> None:
        self.proxy = proxy
        self.uid, self.gid = uid, gid
        self.policy = policy or Policy.from_settings()
        runtime = urlsplit(settings.STEP_RUNTIME_URL)
        self.runtime_tls = ssl.create_default_context() if runtime.scheme == "https" else None
        self.runtime_host = runtime.hostname or "127.0.0.1"
        self.runtime_port = runtime.port or (443 if self.runtime_tls else 80)
        self.runtime_netloc = runtime.netloc.rpartition("@")[2].encode()
        self.runtime_base = runtime.path
        public = urlsplit(self.policy.service_url)
        self.service_tls = ssl.create_default_context() if public.scheme == "https" else None
        self.service_host = (public.hostname or "").lower().rstrip(".")
        self.service_port = public.port or (443 if self.service_tls else 80)
        self.service_netloc = public.netloc.rpartition("@")[2].encode()
        self.service_base = public.path
        self.directory = Path()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._active: set[asyncio.Task] = set()

    def __enter__(self) -> "StepNetwork":
        # Under STEP_MOUNT_DIR: a directory every sandbox uid can reach (mounts.py).
        self.directory = mounts.private_dir("net-")
        try:
            if self.uid is not None:
                os.chown(self.directory, self.uid, self.gid if self.gid is not None else -1)
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._thread = threading.Thread(
                target=self._main, args=(ready,), name="step-network", daemon=True
            )
            self._thread.start()
            ready.result(timeout=10)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None and self._loop.is_running():
            with contextlib.suppress(RuntimeError):  # the loop ended already
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _main(self, ready: "concurrent.futures.Future[None]") -> None:
        loop = self._loop = asyncio.new_event_loop()
        # Lookups of the proxy's destinations: a few threads of its own, left behind (not
        # waited for) when the step ends, so a lookup that hangs never holds the worker.
        lookups = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="step-dns")
        loop.set_default_executor(lookups)
        try:
            loop.run_until_complete(self._serve(ready))
        finally:
            lookups.shutdown(wait=False, cancel_futures=True)
            loop.close()

    async def _serve(self, ready: "concurrent.futures.Future[None]") -> None:
        self._stop = asyncio.Event()
        servers = []
        try:
            doors = [(RUNTIME_SOCKET, self._runtime)] + (
                [(PROXY_SOCKET, self._proxied)] if self.proxy else []
            )
            for name, handler in doors:
                path = self.directory / name
                servers.append(
                    await asyncio.start_unix_server(
                        lambda r, w, h=handler: self._door(r, w, h), path, limit=HEAD_BYTES, backlog=16
                    )
                )
                # The directory decides who may connect (its mode and owner).
                os.chmod(path, 0o666)  # noqa: S103
        except Exception as exc:  # said to the thread that waits for the doors
            for server in servers:
                server.close()
            ready.set_exception(exc)
            return
        ready.set_result(None)
        await self._stop.wait()
        for server in servers:
            server.close()
        for task in list(self._active):
            task.cancel()
        await asyncio.gather(*self._active, return_exceptions=True)

    async def _door(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        writer.transport.set_write_buffer_limits(high=CHUNK)
        task = asyncio.current_task()
        assert task is not None
        self._active.add(task)
        try:
            if len(self._active) > self.policy.connections:
                raise Refused(
                    503,
                    f"The step has {self.policy.connections} connections open already "
                    "(STEP_NET_CONNECTIONS).",
                    "too-many-connections",
                )
            await handler(reader, writer)
        except Refused as refused:
            await _answer(writer, refused)
        except (_Closed, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The step ended. Not raised on: asyncio's server would log a cancelled
            # connection's task as an error.
            pass
        finally:
            self._active.discard(task)
            writer.close()

    # The runtime API's door ------------------------------------------------------------

    async def _runtime(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _read_head(reader)
        if not head.target.startswith(b"/"):
            raise Refused(400, "The runtime API takes paths (/spec), not URLs.", "bad-request")
        await self._to_runtime(reader, writer, head, head.target)

    async def _to_runtime(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: _Head, target: bytes
    ) -> None:
        service_path(target, self.runtime_base)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.runtime_host,
                    self.runtime_port,
                    ssl=self.runtime_tls,
                    limit=HEAD_BYTES,
                ),
                CONNECT_SECONDS,
            )
        except (OSError, TimeoutError) as exc:
            raise Refused(
                502, f"The step runtime API (STEP_RUNTIME_URL) cannot be reached: {exc}", "bad-gateway"
            ) from exc
        up_writer.write(head.rewritten(target, self.runtime_netloc))
        await self._exchange(reader, writer, up_reader, up_writer)

    # The proxy's door ------------------------------------------------------------------

    async def _proxied(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _read_head(reader)
        if head.method == b"CONNECT":
            host, port = _destination(head.target.decode("latin-1"), None)
            try:
                up_reader, up_writer = await self._connect(host, port)
            except Refused as refused:
                if refused.status == 403 and self._is_service(host, port, True):
                    raise Refused(
                        403,
                        f"{refused.detail} The service (RELAY_PUBLIC_URL) is no exception to a "
                        "CONNECT tunnel, whose contents cannot be checked: ask for "
                        f"http://{host}/… through this proxy instead, which takes the service's "
                        "own paths to it (over TLS when RELAY_PUBLIC_URL is https).",
                        refused.code,
                    ) from None
                raise
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._relay(reader, writer, up_reader, up_writer)
            return
        url = urlsplit(head.target.decode("latin-1"))
        if url.scheme != "http" or not url.netloc:
            raise Refused(
                400,
                "The proxy takes CONNECT host:port (https) or an absolute http:// URL.",
                "bad-request",
            )
        authority = url.netloc.rpartition("@")[2]
        host, port = _destination(authority, 80)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        if (host, port) == ("127.0.0.1", RUNTIME_PORT):  # the runtime door's address
            await self._to_runtime(reader, writer, head, target.encode("latin-1"))
            return
        if self._is_service(host, port, _has_port(authority)):
            path = service_path(target.encode("latin-1"), self.service_base)
            await self._to_service(reader, writer, head, path)
            return
        up_reader, up_writer = await self._connect(host, port)
        up_writer.write(head.rewritten(target.encode("latin-1"), authority.encode("latin-1")))
        await self._exchange(reader, writer, up_reader, up_writer)

    def _is_service(self, host: str, port: int, port_named: bool) -> bool:
        """RELAY_PUBLIC_URL's host, at its port (or at none: `http://relay.example.com/` for
        an https RELAY_PUBLIC_URL)."""
        if not self.service_host or host.lower().rstrip(".") != self.service_host:
            return False
        return port == self.service_port or not port_named

    async def _to_service(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: _Head, target: bytes
    ) -> None:
        """A request for one of the service's own paths, to RELAY_PUBLIC_URL: where its
        operator put it (a private network, often), so its addresses are not checked."""
        loop = asyncio.get_running_loop()
        try:
            lookup = loop.run_in_executor(None, _addresses, self.service_host, self.service_port)
            addresses = await asyncio.wait_for(lookup, CONNECT_SECONDS)
        except (OSError, UnicodeError, TimeoutError) as exc:
            raise Refused(502, f"{self.service_host} could not be resolved ({exc}).", "bad-gateway") from exc
        error: BaseException | None = None
        for address in addresses:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        address,
                        self.service_port,
                        ssl=self.service_tls,
                        server_hostname=self.service_host if self.service_tls else None,
                        limit=HEAD_BYTES,
                    ),
                    CONNECT_SECONDS,
                )
            except (OSError, TimeoutError) as exc:
                error = exc
                continue
            up_writer.write(head.rewritten(target, self.service_netloc))
            await self._exchange(reader, writer, up_reader, up_writer)
            return
        raise Refused(502, f"The service (RELAY_PUBLIC_URL) could not be reached ({error}).", "bad-gateway")

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not self.policy.allows(host, port):
            raise Refused(403, f"{host}:{port} is not in STEP_PROXY_ALLOW.", "destination-not-allowed")
        loop = asyncio.get_running_loop()
        try:
            allow_loopback = port in self.policy.loopback_ports
            lookup = loop.run_in_executor(None, egress.public_addresses, host, port, allow_loopback)
            addresses = await asyncio.wait_for(lookup, CONNECT_SECONDS)
        except egress.ForbiddenAddress as exc:
            raise Refused(
                403,
                f"{exc}: a step may reach public addresses only, through this proxy.",
                "destination-not-public",
            ) from exc
        except (OSError, UnicodeError, TimeoutError) as exc:
            raise Refused(502, f"{host} could not be resolved ({exc}).", "bad-gateway") from exc
        error: BaseException | None = None
        for address in addresses:  # the checked addresses, never the name again
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=HEAD_BYTES), CONNECT_SECONDS
                )
            except (OSError, TimeoutError) as exc:
                error = exc
        raise Refused(502, f"{host}:{port} could not be reached ({error}).", "bad-gateway")

    # Both doors ------------------------------------------------------------------------

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """One HTTP request whose head was sent: its body and the answer, with Connection:
        close in the answer's head (the client opens a new connection for its next request,
        which may go elsewhere)."""
        up_writer.transport.set_write_buffer_limits(high=CHUNK)
        clock = _Clock()
        body = asyncio.ensure_future(_pipe(reader, up_writer, clock))
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), self.policy.idle_seconds)
                except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    raise Refused(502, "The destination gave no valid answer.", "bad-gateway") from exc
                answer = parse_head(raw)
                if not answer.status.startswith(b"1") or answer.status == b"101":
                    break
                writer.write(raw)  # 100 Continue and the like: the final answer follows
            rewritten = [b" ".join(answer.first)]
            rewritten += [
                name + b": " + value
                for name, value in answer.headers
                if name.lower() not in (b"connection", b"keep-alive", b"proxy-connection")
            ]
            writer.write(b"\r\n".join([*rewritten, b"Connection: close"]) + b"\r\n\r\n")
            await self._relay(None, writer, up_reader, up_writer, clock, body)
        finally:
            body.cancel()
            up_writer.close()

    async def _relay(
        self,
        reader: asyncio.StreamReader | None,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        clock: "_Clock | None" = None,
        outgoing: "asyncio.Future[None] | None" = None,
    ) -> None:
        """Bytes both ways until the destination's side ends (or, with nothing in flight,
        both), or neither end has sent a byte for idle_seconds."""
        up_writer.transport.set_write_buffer_limits(high=CHUNK)
        clock = clock or _Clock()
        pipes = [asyncio.ensure_future(_pipe(up_reader, writer, clock))]
        if outgoing is None:
            assert reader is not None
            outgoing = asyncio.ensure_future(_pipe(reader, up_writer, clock))
        pipes.append(outgoing)
        try:
            while not pipes[0].done():
                # The client's end alone ends nothing: the answer may still be coming.
                await asyncio.wait(pipes[:1] if pipes[1].done() else pipes, timeout=self.policy.idle_seconds)
                if clock.idle() >= self.policy.idle_seconds:
                    break
        finally:
            for pipe in pipes:
                pipe.cancel()
            up_writer.close()


class _Clock:
    """When a connection last carried a byte, either way."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def tick(self) -> None:
        self.last = time.monotonic()

    def idle(self) -> float:
        return time.monotonic() - self.last


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, clock: _Clock) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(CHUNK):
            clock.tick()
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


def _destination(authority: str, default_port: int | None) -> tuple[str, int]:
    try:
        return split_authority(authority, default_port)
    except ValueError:
        raise Refused(400, f"Not a host and port: {authority[:100]!r}.", "bad-request") from None


async def _read_head(reader: asyncio.StreamReader) -> _Head:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
    except asyncio.LimitOverrunError:
        raise Refused(
            431, f"The request's head is longer than {HEAD_BYTES} bytes.", "request-header-fields-too-large"
        ) from None
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed from None
        raise Refused(400, "The request ended before its head did.", "bad-request") from None
    except TimeoutError:
        raise Refused(
            408, f"No whole request head within {HEAD_SECONDS:g} seconds.", "request-timeout"
        ) from None
    return parse_head(raw)


async def _answer(writer: asyncio.StreamWriter, refused: Refused) -> None:
    body = json.dumps(problem(refused.status, refused.detail, refused.code)).encode()
    head = (
        f"HTTP/1.1 {refused.status} {HTTPStatus(refused.status).phrase}\r\n"
        f"Content-Type: {PROBLEM_CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(head.encode() + body)
        await writer.drain()
