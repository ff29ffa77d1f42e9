"""Recognising a connection's token on the asynchronous paths (the long-poll's wait, the
heartbeat), without the ORM and without a thread.

This only recognises: it never answers. A token it does not recognise sends the request to
the ordinary path (relay.api.authentication), which answers 401. The digest is compared
with hmac.compare_digest, as DigestToken.for_token does.

The heartbeat asks with cached=True: the connection's row is kept in this process, keyed by
the token's lookup part, so a heartbeat costs one statement. The long-poll asks with
cached=False, and its answer is not kept: the cache holds the bridges that send heartbeats,
those with runs in flight, not every bridge waiting. That is safe because the
heartbeat's UPDATE repeats every condition against the row as it is then (same digest, same
pepper, owner active; runs.models.heartbeat_sql): a token regenerated or an owner
deactivated a moment ago finds no row there, and the ordinary path answers.
"""

import hmac
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model

from puppet_connection.models import PuppetConnection
from relay import adb, tokens

CACHE_MAX = 100_000


@dataclass(frozen=True, slots=True)
class KnownConnection:
    id: uuid.UUID
    token_lookup: str
    token_digest: str
    token_pepper_id: int
    reported_platform: str
    reported_backend: str

    @property
    def token_prefix(self) -> str:
        return f"{PuppetConnection.TOKEN_PREFIX}_{self.token_lookup}"


_cache: dict[str, KnownConnection] = {}

_SQL = (
    "SELECT c.id, c.token_lookup, c.token_digest, c.token_pepper_id, c.reported_platform, c.reported_backend"  # noqa: S608
    f" FROM {PuppetConnection._meta.db_table} c JOIN {get_user_model()._meta.db_table} u"
    " ON u.id = c.owner_id WHERE c.token_lookup = %s AND u.is_active"
)


def _matches(known: KnownConnection, token: str) -> bool:
    if known.token_pepper_id not in settings.TOKEN_PEPPERS:
        return False
    return hmac.compare_digest(tokens.digest(token, known.token_pepper_id), known.token_digest)


async def connection_for(token: str, cached: bool) -> KnownConnection | None:
    """The active connection this token belongs to, or None."""
    lookup = PuppetConnection.lookup_of(token)
    if lookup is None:
        return None
    known = _cache.get(lookup) if cached else None
    if known is not None and _matches(known, token):
        return known
    pool = adb.pool()
    if pool is None:
        return None
    async with pool.connection() as conn:
        cursor = await conn.execute(_SQL, (lookup,))
        row = await cursor.fetchone()
    if row is None:
        _cache.pop(lookup, None)
        return None
    known = KnownConnection(*row)
    if not _matches(known, token):
        return None
    if not cached:
        return known  # the long-poll's: its bridges need not all be kept (10,000 of them)
    if len(_cache) >= CACHE_MAX:
        _cache.clear()  # crude, and rare: a process that has seen 100,000 bridges
    _cache[lookup] = known
    return known
