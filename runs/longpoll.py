"""The long-poll's wait, before Django sees the request.

`GET /_puppet/runs?wait=N` waits here, in the ASGI application (relay.asgi), as a coroutine
of the server's loop: no thread and no Django request exist while it waits. Once the
connection has a pending run, or N seconds have passed, or its connection's waiters are at
RUN_LONG_POLL_MAX_WAITERS in this process, the request goes on to Django, marked as waited
(scope["relay.waited"]), and the runs API answers it at once with what there is, as always.

This code never answers a request itself: every answer, including a 400 for a bad `wait`
and a 401 for a bad token, is Django's. When anything here is unsure (no PostgreSQL, a
parameter the list would refuse, an unknown token, a body), it hands the request on without
waiting, and the runs API then waits the synchronous way (runs.notify.wait_for_runs) or
answers the error.
"""

import asyncio
import heapq
import itertools
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from rest_framework import exceptions

from puppet_connection.fast import connection_for
from relay import adb
from relay.api.authentication import token_from_header
from relay.api.params import is_whole_number
from runs.models import OPEN_STATES, Run, Status
from runs.notify import listener

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)
RUNS_PATH = "/_puppet/runs"
# Waiting long-polls per connection in this process (the cap).
waiters: Counter[uuid.UUID] = Counter()


def wanted_wait(scope: Scope) -> float:
    """Seconds this request asks to wait, when it is a long-poll that the list would accept
    as it stands; else 0."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != RUNS_PATH:
        return 0
    query = parse_qs(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    if "cursor" in query or any(len(values) != 1 for values in query.values()):
        return 0
    wait = query.get("wait", [""])[0]
    status, limit = query.get("status"), query.get("limit")
    if not is_whole_number(wait) or not 0 < int(wait) <= settings.RUN_LONG_POLL_MAX:
        return 0
    if status is not None and status[0] not in OPEN_STATES:
        return 0
    if limit is not None and not (is_whole_number(limit[0]) and int(limit[0]) >= 1):
        return 0
    for name, value in scope["headers"]:
        if name in (b"content-length", b"transfer-encoding") and value not in (b"0",):
            return 0  # a long-poll has no body; one that has goes to Django unheld
    return int(wait)


def _authorization(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return ""


async def _pending_exists(connection_id: uuid.UUID) -> bool:
    pool = adb.pool()
    assert pool is not None
    async with pool.connection() as conn:
        cursor = await conn.execute(_PENDING_SQL, (connection_id, Status.PENDING))
        return (await cursor.fetchone()) is not None


_PENDING_SQL = f"SELECT 1 FROM {Run._meta.db_table} WHERE connection_id = %s AND status = %s LIMIT 1"  # noqa: S608


class Deadlines:
    """The ends of the waits on one loop, with one timer for them all: a timer per waiter
    (loop.call_later) costs about 550 bytes, an entry here about 100."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, asyncio.Future]] = []
        self.order = itertools.count()  # ties never compare the futures
        self.timer: asyncio.TimerHandle | None = None

    def add(self, when: float, future: asyncio.Future) -> None:
        """Resolve `future` (if nothing else has) at loop time `when`."""
        heapq.heappush(self.heap, (when, next(self.order), future))
        if self.heap[0][2] is future:
            self._arm()

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(self.heap[0][0], self._expire) if self.heap else None

    def _expire(self) -> None:
        # A loop may fire a timer up to its clock's resolution early (uvloop: a millisecond):
        # what is due within it is due now, or the timer would be armed again and again.
        now = self.loop.time() + 0.001
        while self.heap and self.heap[0][0] <= now:
            future = heapq.heappop(self.heap)[2]
            if not future.done():
                future.set_result(False)
        self._arm()


_deadlines: Deadlines | None = None


def deadlines() -> Deadlines:
    """The running loop's Deadlines (one server loop per process; the tests start others)."""
    global _deadlines
    loop = asyncio.get_running_loop()
    if _deadlines is None or _deadlines.loop is not loop:
        _deadlines = Deadlines(loop)
    return _deadlines


async def hold(scope: Scope, seconds: float) -> None:
    """Wait until the request's connection has a pending run or `seconds` pass, and mark the
    request waited; return at once, unmarked, when this cannot tell whose request it is."""
    try:
        token = token_from_header(_authorization(scope))
    except exceptions.AuthenticationFailed:
        return
    holder = await connection_for(token, cached=False)
    if holder is None:
        return
    scope["relay.waited"] = True
    key = holder.id
    del token, holder  # what a waiter keeps is what 10,000 of them cost
    if waiters[key] >= settings.RUN_LONG_POLL_MAX_WAITERS:
        return  # the cap: answered at once with what there is
    waiters[key] += 1
    name = str(key)
    loop = asyncio.get_running_loop()
    try:
        await listener.astart()
        deadline = loop.time() + seconds
        while True:
            # A future, resolved by the listener (a run for this connection), by the
            # deadline, or cancelled with the request: no Event, no timer, no task of its own.
            woken = loop.create_future()
            listener.add(name, woken)
            try:
                if loop.time() >= deadline or await _pending_exists(key):
                    return
                deadlines().add(deadline, woken)
                await woken
            finally:
                listener.remove(name, woken)
    finally:
        waiters[key] -= 1
        if not waiters[key]:
            del waiters[key]


async def waiting_then(app: App, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve the request with `app` after its long-poll's wait, if it is one. A client that
    goes away while waiting ends it: nothing is sent, and Django never sees the request."""
    seconds = wanted_wait(scope)
    if not seconds or adb.pool() is None:
        await app(scope, receive, send)
        return

    async def wait() -> None:
        await hold(scope, seconds)

    await held_then(app, scope, receive, send, wait)


async def held_then(
    app: App,
    scope: Scope,
    receive: Receive,
    send: Send,
    wait: Callable[[], Awaitable[Callable[[Send], Awaitable[None]] | None]],
) -> None:
    """Await `wait()` before Django sees the request (no thread held), then serve it with
    `app`; or, when `wait()` returns an answer, send that instead (answer(send)). A client
    that goes away while waiting ends it: nothing is sent. The long-poll above, and an open
    run page's (pages.live)."""
    first = await receive()  # the (empty) body: the request is whole before it waits
    if first["type"] != "http.request":
        return
    this = asyncio.current_task()
    assert this is not None
    # The client going away cancels this request's task, waiting or not. The server says
    # so itself (relay.server: it calls and drops the scope's callbacks; no task); under
    # another server a task waits for it.
    callbacks = scope.get("relay.on_disconnect")
    watch: asyncio.Future | None = None
    if callbacks is not None:
        callbacks.append(this.cancel)
    else:
        watch = asyncio.ensure_future(receive())
        on_watch = _cancelling(this)
        watch.add_done_callback(on_watch)
    answer = None
    try:
        answer = await wait()
    except asyncio.CancelledError:
        if _gone(scope, watch):
            this.uncancel()  # our own cancel: the client went away
            return
        if watch is not None:
            watch.cancel()
        raise
    except Exception as exc:
        # The database failed us: Django answers at once, meeting the failure itself (a 503).
        log.warning("long-poll wait failed: %r", exc)
        scope["relay.waited"] = True
    if _gone(scope, watch):
        return
    if callbacks is not None:
        callbacks.remove(this.cancel)
        receive_next = receive
    else:
        assert watch is not None
        watch.remove_done_callback(on_watch)
        receive_next = _awaiting(watch)
    if answer is not None:
        if watch is not None:
            watch.cancel()  # nothing more is read of this request
        await answer(send)
        return
    replay: list[Message] = [first]

    async def replayed() -> Message:
        return replay.pop() if replay else await receive_next()

    await app(scope, replayed, send)


def _gone(scope: Scope, watch: asyncio.Future | None) -> bool:
    """Whether the client has gone away (relay.server drops the callbacks when it has)."""
    return watch.done() if watch is not None else "relay.on_disconnect" not in scope


def _cancelling(task: asyncio.Task) -> Callable[[object], None]:
    def cancel(_: object) -> None:
        task.cancel()

    return cancel


def _awaiting(watch: asyncio.Future) -> Receive:
    async def received() -> Message:
        return await watch

    return received
