"""An open run page's live part, cheaply: what it shows of a run has a version (a keyed hash
of the run's and its steps' shown fields, read in one query), and the page asks again with
the version it has (`X-Live-Version`).

Under the ASGI server (relay.asgi) the request waits here, on the loop, before Django sees it,
as the bridges' long-poll does (runs.longpoll): no thread, one query to read the version,
then nothing until a change to this run is notified (workflows.models.notify_run_changed,
through runs.notify's listener) or PAGES_LIVE_WAIT seconds pass. Changed: Django renders the
live part (pages.views.run_live), with the session and permissions checked as on any page.
Unchanged at the end of the wait: a 204 from here, with no Django, no session and no thread.
That 204 tells nothing to whoever holds no version: the version is keyed with SECRET_KEY, so
only a page that was shown the run can present one that matches.

The pages of one run waiting in one process share one Watch: one subscription, one query
when the first page comes and one after each change, however many pages wait. So open pages
of a quiet run cost no query at all while they wait and ask again; a change costs one query
in each process, then one rendering (Django: session, user, run, steps) per page.

Without the server's loop (the test client, `runserver`, SQLite), Django answers at once,
204 or the new part, and the page asks again a second later (pages/static/pages/run.js).
"""

import asyncio
import functools
import logging
import re
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from pages.versions import TICKET_PLACEHOLDER, shown_rows, ticket_rights, version_of
from pages.views import live_part
from relay import adb
from runs.longpoll import App, Receive, Scope, Send, deadlines, held_then
from runs.notify import listener

PATH = re.compile(r"^/app/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/live/$")
VERSION = re.compile(r"^[0-9a-f]{16}$")
log = logging.getLogger(__name__)


@functools.cache
def _sql() -> tuple[str, tuple[Any, ...], int]:
    """shown_rows as PostgreSQL SQL, its parameters (a JSON key among them), and where the
    run's id goes among them."""
    sentinel = uuid.UUID(int=0)
    sql, params = shown_rows(sentinel).query.get_compiler(connection=connection).as_sql()
    return sql, tuple(params), list(params).index(sentinel)


async def _read_version(run_id: uuid.UUID) -> str:
    sql, params, at = _sql()
    bound = list(params)
    bound[at] = run_id
    pool = adb.pool()
    assert pool is not None
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, bound)
        return version_of(await cursor.fetchall())


reads = 0  # versions read on the loop (the tests and the bench read it)


class Watch:
    """One run's waiting pages in this process, and the run's version as last read: one
    subscription to the run's notifications and one read per change, whatever the number of
    pages. Each page waits on a future of its own, resolved True when the version is not the
    one the page has, or False at the page's deadline."""

    def __init__(self, run_id: uuid.UUID) -> None:
        self.run_id = run_id
        self.version: str | None = None  # None while it is being read
        self.waiters: dict[asyncio.Future, str] = {}
        self.task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        global reads
        loop = asyncio.get_running_loop()
        key = f"workflow-run:{self.run_id}"
        try:
            while True:
                woken = loop.create_future()
                listener.add(key, woken)  # before the read: a change after it wakes this
                try:
                    self.version = None
                    self.version = await _read_version(self.run_id)
                    reads += 1
                    self._wake(lambda have: have != self.version)
                    await woken
                finally:
                    listener.remove(key, woken)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The database failed us: Django answers each page at once, meeting it itself.
            log.warning("a run page's watch failed: %r", exc)
            self._wake(lambda have: True)
            if _watches.get(self.run_id) is self:
                del _watches[self.run_id]

    def _wake(self, changed: Callable[[str], bool]) -> None:
        for future, have in self.waiters.items():
            if not future.done() and changed(have):
                future.set_result(True)

    def stop(self) -> None:
        if _watches.get(self.run_id) is self:
            del _watches[self.run_id]
        self.task.cancel()


_watches: dict[uuid.UUID, Watch] = {}


Answer = Callable[[Send], Awaitable[None]]


def wanted(scope: Scope) -> tuple[uuid.UUID, str, str, str] | None:
    """(run id, version the page has, its ticket, the session's key) when this is an open
    run page asking; else None."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    match = PATH.match(scope["path"])
    if match is None:
        return None
    version, ticket, cookies = "", "", ""
    for name, value in scope["headers"]:
        if name == b"x-live-version":
            version = value.decode("latin-1")
        elif name == b"x-live-ticket":
            ticket = value.decode("latin-1")
        elif name == b"cookie":
            cookies = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding") and value != b"0":
            return None
    if not VERSION.match(version):
        return None
    session = SimpleCookie()
    try:
        session.load(cookies)
    except Exception:  # a cookie header the standard library cannot read: Django's then
        return None
    morsel = session.get(settings.SESSION_COOKIE_NAME)
    return uuid.UUID(match[1]), version, ticket, morsel.value if morsel is not None else ""


async def wait_for_change(run_id: uuid.UUID, version: str, seconds: float) -> str | None:
    """The run's version once it is not `version`; None when it still is after `seconds`.
    "" at once when this process has PAGES_LIVE_MAX_WAITERS pages waiting (Django answers
    then: 204, and the page asks again a second later)."""
    if sum(len(watch.waiters) for watch in _watches.values()) >= settings.PAGES_LIVE_MAX_WAITERS:
        return ""
    await listener.astart()
    loop = asyncio.get_running_loop()
    watch = _watches.get(run_id)
    if watch is None or watch.task.get_loop() is not loop:
        watch = _watches[run_id] = Watch(run_id)
    future = loop.create_future()
    watch.waiters[future] = version
    try:
        if watch.version is not None and watch.version != version:
            return watch.version
        deadlines().add(loop.time() + seconds, future)
        if not await future:
            return None
        return watch.version or ""
    finally:
        del watch.waiters[future]
        if not watch.waiters:
            watch.stop()


async def unchanged(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [(b"cache-control", b"no-store"), (b"x-live-waited", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": b""})


# The live part as rendered for the pages of one run, version and rights: once per change in
# each process, however many pages it goes to (a render is also a few queries).
_parts: OrderedDict[tuple, asyncio.Future] = OrderedDict()
PARTS_KEPT = 64
rendered = 0  # parts rendered for the loop (the tests read it)


async def shared_part(run_id: uuid.UUID, version: str, rights: tuple[bool, bool], app: App) -> str | None:
    global rendered
    key = (run_id, version, rights)
    future = _parts.get(key)
    if future is None or future.get_loop() is not asyncio.get_running_loop():
        loop = asyncio.get_running_loop()
        # In Django's threads (relay.django_asgi), as its views: the ORM is synchronous.
        threads = getattr(app, "threads", None)
        future = _parts[key] = loop.run_in_executor(threads, _render, run_id, version, rights)
        rendered += 1
        while len(_parts) > PARTS_KEPT:
            _parts.popitem(last=False)
    try:
        return await asyncio.shield(future)
    except Exception as exc:
        _parts.pop(key, None)
        log.warning("a run page's live part could not be rendered: %r", exc)
        return None


def _render(run_id: uuid.UUID, version: str, rights: tuple[bool, bool]) -> str | None:
    close_old_connections()  # as a request's start and end do for Django's views
    try:
        return live_part(run_id, version, *rights)
    finally:
        close_old_connections()


def sending(part: str, ticket: str) -> Answer:
    body = part.replace(TICKET_PLACEHOLDER, ticket).encode()

    async def send_part(send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return send_part


async def waiting_then(app: App, scope: Scope, receive: Receive, send: Send) -> bool:
    """Serve an open run page's ask after its wait and return True; False (nothing done)
    when the request is not one, or there is no loop's pool to wait with."""
    asking = wanted(scope)
    if asking is None or adb.pool() is None:
        return False
    run_id, version, ticket, session_key = asking

    async def wait() -> Answer | None:
        now = await wait_for_change(run_id, version, settings.PAGES_LIVE_WAIT)
        if now is None:
            return unchanged
        rights = ticket_rights(ticket, run_id, session_key) if now else None
        if rights is None:
            return None  # Django's: it checks the session and the user, and gives a new ticket
        part = await shared_part(run_id, now, rights, app)
        return sending(part, ticket) if part is not None else None

    await held_then(app, scope, receive, send, wait)
    return True
