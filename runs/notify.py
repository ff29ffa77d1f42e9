"""Wake long-polling bridges when a run is created for their connection, and open run pages
when their workflow run changes (WORKFLOW_RUNS_NOTIFY_CHANNEL, pages.live).

One background thread per web process holds a PostgreSQL connection that LISTENs on
RUNS_NOTIFY_CHANNEL; runs.models.notify_new_run() NOTIFYs with the connection id inside the
creating transaction, so the wake-up arrives only once the run is visible. Waiting requests
register an event per connection id and sleep on it: no database polling while they wait.

Under the ASGI server the waiters are coroutines (runs.longpoll: an asyncio.Future each,
resolved from this thread through its loop); a synchronous request (the test client, a WSGI
server) waits on a threading.Event. The one thread serves every loop of the process alike,
which a listener living on one loop could not.

Without PostgreSQL (the SQLite default of `make run`) there is no LISTEN: waiters then look
again every SQLITE_RECHECK seconds, which is fine for one machine.
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from django.conf import settings
from django.db import connection as db_connection

log = logging.getLogger(__name__)
SQLITE_RECHECK = 0.5


# A synchronous request's threading.Event, or a coroutine's asyncio.Future (the smallest
# thing a coroutine can wait on: 10,000 idle long-polls wait at once).
Waiter = threading.Event | asyncio.Future


def _wake(waiter: Waiter) -> None:
    if isinstance(waiter, threading.Event):
        waiter.set()
        return
    try:
        waiter.get_loop().call_soon_threadsafe(_resolve, waiter)
    except RuntimeError:  # the loop has closed: nobody waits any more
        pass


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(True)


class Listener:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A list per connection id: most have one waiter, and a set costs four times as much.
        self._waiters: dict[str, list[Waiter]] = {}
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                params = db_connection.get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                self._thread = threading.Thread(
                    target=self._run, args=(params,), name="runs-listener", daemon=True
                )
                self._thread.start()
        # A waiter must not look for runs before LISTEN is in place, or it could miss one.
        self._listening.wait(timeout=5)

    def stop(self) -> None:
        """End the thread and its database connection (tests; process exit does it anyway)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
        self._listening.clear()
        self._stopping.clear()

    def _run(self, params: dict) -> None:
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {settings.RUNS_NOTIFY_CHANNEL}")
                    conn.execute(f"LISTEN {settings.WORKFLOW_RUNS_NOTIFY_CHANNEL}")
                    self._listening.set()
                    self._wake_all()  # anything sent while we were reconnecting
                    while not self._stopping.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._wake(key_of(notice.channel, notice.payload))
            except psycopg.Error as exc:
                self._listening.clear()
                log.warning("runs listener lost its database connection (%s); reconnecting", exc)
                self._wake_all()  # waiters look again themselves
                time.sleep(1)

    def _wake(self, key: str) -> None:
        with self._lock:
            for waiter in self._waiters.get(key, ()):
                _wake(waiter)

    def _wake_all(self) -> None:
        with self._lock:
            for waiters in self._waiters.values():
                for waiter in waiters:
                    _wake(waiter)

    def add(self, key: str, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.setdefault(key, []).append(waiter)

    def remove(self, key: str, waiter: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(key, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(key, None)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self._waiters.values())

    @contextmanager
    def subscribe(self, key: str) -> Iterator[threading.Event]:
        """An Event set when a run is created for `key` (a connection id). Subscribe first,
        then look for runs, then wait: nothing created in between is missed."""
        event = threading.Event()
        self._ensure_started()
        self.add(key, event)
        try:
            yield event
        finally:
            self.remove(key, event)

    def listening(self) -> bool:
        return self._listening.is_set() and self._thread is not None and self._thread.is_alive()

    async def astart(self) -> None:
        """Start listening, for a coroutine: starting waits for LISTEN (a connection, well
        under a second), in a thread, not on the loop. A coroutine then adds its future
        (add, remove) as subscribe() does its Event."""
        if not self.listening():
            await asyncio.get_running_loop().run_in_executor(None, self._ensure_started)


listener = Listener()


def key_of(channel: str, payload: str) -> str:
    """What waiters wait on: a connection's id (a new run for it: bridges' long-polls), or
    "workflow-run:<id>" (a change to that workflow run: open run pages, pages.live)."""
    return payload if channel == settings.RUNS_NOTIFY_CHANNEL else f"workflow-run:{payload}"


def wait_for_runs(key: str, seconds: float, look: Callable[[], bool]) -> bool:
    """Call look() until it is true or `seconds` pass, waking on notifications for `key`."""
    deadline = time.monotonic() + seconds
    while True:
        if db_connection.vendor != "postgresql":
            found = look()
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            time.sleep(min(remaining, SQLITE_RECHECK))
            continue
        with listener.subscribe(key) as event:
            found = look()
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            event.wait(remaining)
