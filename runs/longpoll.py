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
import logging
import time
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
    if waiters[key] >= settings.RUN_LONG_POLL_MAX_WAITERS:
        return  # the cap: answered at once with what there is
    waiters[key] += 1
    try:
        deadline = time.monotonic() + seconds
        while True:
            async with listener.asubscribe(str(key)) as woken:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or await _pending_exists(key):
                    return
                # A timer that sets the event, not asyncio.wait_for: that would add a task
                # per waiter (memory is what 10,000 waiters cost).
                timer = asyncio.get_running_loop().call_later(remaining, woken.set)
                try:
                    await woken.wait()
                finally:
                    timer.cancel()
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
    first = await receive()  # the (empty) body: the request is whole before it waits
    if first["type"] != "http.request":
        return
    # The next message is the disconnect: it cancels this request's task, waiting or not.
    gone = asyncio.ensure_future(receive())
    this = asyncio.current_task()
    assert this is not None

    def on_gone(_: object) -> None:
        this.cancel()

    gone.add_done_callback(on_gone)
    try:
        await hold(scope, seconds)
    except asyncio.CancelledError:
        if gone.done():
            this.uncancel()  # our own cancel (on_gone): the client went away
            return
        gone.cancel()
        raise
    except Exception as exc:
        # The database failed us: Django answers at once, meeting the failure itself (a 503).
        log.warning("long-poll wait failed: %r", exc)
        scope["relay.waited"] = True
    if gone.done():
        return
    gone.remove_done_callback(on_gone)
    replay: list[Message] = [first]

    async def replayed() -> Message:
        return replay.pop() if replay else await gone

    await app(scope, replayed, send)
