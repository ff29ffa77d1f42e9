"""The web process's asynchronous PostgreSQL connections (psycopg 3's AsyncConnectionPool), for
the two paths that must not hold a thread or pay for the ORM: the long-poll's wait
(runs.longpoll) and the heartbeat (runs.api.fast).

The pool belongs to the event loop of the server that opened it in its lifespan
(relay.asgi). Code running on any other loop (Django's test client runs each async view on a
loop of its own) gets None from pool() and takes the ordinary synchronous path, which does
the same thing through the ORM.

Statements are sent with prepare_threshold=0: each connection prepares a statement the
first time it sees it, so the hot statements are parsed and planned once per connection.

The pool's connections commit asynchronously (synchronous_commit = off): PostgreSQL answers
a commit before its WAL is flushed to disk, and the WAL writer flushes it within
3 x wal_writer_delay (0.6 s by default). Half of PostgreSQL's cost per heartbeat was that
flush. It is safe here because the only statement this pool writes with is the plain
heartbeat (runs.models.heartbeat_sql): it changes no status, only moves the run's deadline,
updated_at and job_id forward. Losing one takes a crash of the database server or its host
(a clean shutdown flushes everything) within that 0.6 s, and leaves the run as the previous
heartbeat left it, consistent and still open: the bridge promises its next update within
three intervals and sends one every interval (relay_bridge.worker), so the next heartbeat
sets it again long before the previous deadline passes, exactly as when a heartbeat is lost
on the network. Every change of status, lease and outcome goes through Django's connections,
which commit synchronously; and a synchronous commit flushes the WAL up to itself, so no
earlier asynchronous heartbeat can be lost while a later transition is kept.
"""

import asyncio
import logging

from django.conf import settings
from django.db import connection as db_connection
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger(__name__)

_pool: AsyncConnectionPool | None = None
_loop: asyncio.AbstractEventLoop | None = None


def available() -> bool:
    return db_connection.vendor == "postgresql"


async def open_pool() -> None:
    """Open this loop's pool (the ASGI lifespan's startup); nothing on other databases."""
    global _pool, _loop
    if not available() or _pool is not None:
        return
    params = db_connection.get_connection_params()
    for name in ("cursor_factory", "context", "pool"):
        params.pop(name, None)
    pool = AsyncConnectionPool(
        kwargs={**params, "autocommit": True, "prepare_threshold": 0, "row_factory": tuple_row},
        min_size=1,
        max_size=settings.WEB_ASYNC_DB_CONNECTIONS,
        open=False,
        name="relay-async",
        configure=_configure,
    )
    await pool.open()
    _pool, _loop = pool, asyncio.get_running_loop()


async def _configure(conn: AsyncConnection) -> None:
    # See the module's docstring: only heartbeats write through this pool.
    await conn.execute("SET synchronous_commit = off")


async def close_pool() -> None:
    global _pool, _loop
    if _pool is not None:
        await _pool.close()
    _pool, _loop = None, None


def pool() -> AsyncConnectionPool | None:
    """The pool, when the caller runs on the server's loop; else None."""
    if _pool is None:
        return None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return _pool if running is _loop else None
