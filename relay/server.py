"""The web server: uvicorn's event loop, one per gunicorn worker process (relay/gunicorn_conf.py),
serving relay.asgi. A waiting long-poll costs a socket and a coroutine, not a thread.

Beyond uvicorn's defaults:

- A request the HTTP parser refuses is answered with a problem document (RFC 9457), as
  every other bad request is, not uvicorn's plain text.
- A body the client stops sending (it shuts down its side) ends the request short, and the
  application answers it (a 400), as under a WSGI server; uvicorn would drop it.
- A request must arrive whole within REQUEST_READ_TIMEOUT seconds of its first byte (or of
  the connection's opening). uvicorn has no such limit: a client sending its headers a byte
  at a time, or a body it never finishes, would hold its socket forever. It holds no thread
  either way (the tests show /healthz unaffected by 200 of them), but without a deadline an
  attacker could collect sockets until the file-descriptor limit.
- The file-descriptor limit is raised to its hard limit at start: every idle bridge is one
  socket, and the usual soft limit of 1,024 would cap a box at about a thousand bridges.
- Memory per idle connection (10,000 idle long-polls are the design point): the two
  asyncio.Events uvicorn keeps per connection and request keep their waiters in a list
  (LeanEvent), its queue of pipelined requests is a list (Pipeline), and the application can
  be told when the client goes away without a task of its own waiting for it
  (scope["relay.on_disconnect"], a list of callbacks; runs.longpoll uses it). Together with
  runs.longpoll's own economies this took an idle long-poll from 15.5 to under 9 KB.

The tests run the same protocol and configuration in a thread (`serve_in_thread`).
"""

import asyncio
import json
import os
import resource
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from uvicorn import Config, Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

REQUEST_READ_TIMEOUT = float(os.environ.get("REQUEST_READ_TIMEOUT", "30"))
KEEPALIVE = 30  # bridges and steps keep their connections between calls


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = hard if hard != resource.RLIM_INFINITY else 1_048_576
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    return soft


class LeanEvent(asyncio.Event):
    """asyncio.Event with its waiters in a list: the standard library's deque takes about
    600 bytes even when empty, and uvicorn keeps two events per connection (its flow control,
    the request's message event), every idle long-poll's included. asyncio.Event only
    appends to, removes from and iterates over _waiters, which a list does alike."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future] = []  # type: ignore[assignment]


class Pipeline(list):
    """uvicorn's queue of pipelined requests (it calls appendleft, pop and bool only) as a
    list: an empty deque takes about 700 bytes, an empty list 56, on every connection. A
    client pipelines a few requests at most, so inserting at the front costs nothing."""

    def appendleft(self, item: object) -> None:
        self.insert(0, item)


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline for reading each request, lean events
    and disconnect callbacks (see above)."""

    # No attribute beyond this one: past 30 attributes an instance's __dict__ is no longer
    # shared-key and costs 1.6 KB instead of 300 bytes (per idle connection).
    _read_deadline: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline = Pipeline()  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        writable = LeanEvent()
        writable.set()
        self.flow._is_writable_event = writable
        self._arm_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read_deadline()
        super().connection_lost(exc)
        callbacks: list[Callable[[], object]] = (self.scope or {}).pop("relay.on_disconnect", [])
        for callback in callbacks:
            callback()

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a new request (not an upgrade), its task not started yet
            self.cycle.message_event = LeanEvent()
            self.scope["relay.on_disconnect"] = []  # type: ignore[typeddict-unknown-key]

    def send_400_response(self, msg: str) -> None:
        # A request the HTTP parser refuses (a control character in a header, say) never
        # reaches Django: answer it as the API answers every bad request, with a problem.
        # The shape of relay.api.problems.problem(), which this module (loaded by gunicorn's
        # configuration, before Django is set up) cannot import.
        body = json.dumps(
            {
                "type": "urn:relay:problem:malformed-request",
                "title": "Bad Request",
                "status": 400,
                "detail": msg,
            }
        ).encode()
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
        )
        self.transport.close()

    def eof_received(self) -> bool | None:
        # The client has shut down its sending side. A request whose body was still coming
        # ends here, short: the application gets the body as it is and refuses it (a 400
        # that says where it ended), as it did under a WSGI server; the answer still goes
        # out on the half-open socket, which then closes.
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            self._disarm_read_deadline()
            cycle.more_body = False
            cycle.keep_alive = False
            cycle.message_event.set()
            return True
        return None  # nothing in flight: the transport closes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_read_deadline()

    def on_message_complete(self) -> None:
        self._disarm_read_deadline()
        super().on_message_complete()

    def _arm_read_deadline(self) -> None:
        self._disarm_read_deadline()
        self._read_deadline = self.loop.call_later(REQUEST_READ_TIMEOUT, self._read_too_slow)

    def _disarm_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_too_slow(self) -> None:
        # Closing the socket ends the request: an application still reading the body gets
        # http.disconnect (Django then drops the request without calling the view).
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def config_kwargs() -> dict[str, Any]:
    """What production's workers and the tests' in-process server share."""
    return {
        "http": DeadlineProtocol,
        "loop": "uvloop",
        "lifespan": "on",
        "timeout_keep_alive": KEEPALIVE,
        "backlog": 4096,
        "log_config": None,
    }


class RelayWorker(UvicornWorker):
    """gunicorn's worker class: `worker_class = "relay.server.RelayWorker"`."""

    CONFIG_KWARGS = config_kwargs()

    def init_process(self) -> None:
        raise_fd_limit()
        super().init_process()


class ThreadedServer:
    """The application served in a thread of this process, as production serves it (the
    tests' live server: they share its settings and database)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = Config("relay.asgi:application", **config_kwargs())
        self.server = Server(config)
        self.thread = threading.Thread(target=self._run, name="live-server", daemon=True)

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> "ThreadedServer":
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the live server did not start")
            threading.Event().wait(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@contextmanager
def serve_in_thread() -> Iterator[ThreadedServer]:
    server = ThreadedServer().start()
    try:
        yield server
    finally:
        server.stop()
