"""Per-trigger budgets on POST /api/events, so that one token (leaked, or a runaway script)
cannot fill the disk. Checked after authentication and before a byte of the body is read.

Two fixed windows per trigger: EVENTS_RATE_LIMIT_PER_MINUTE reports a clock minute and
EVENTS_RATE_LIMIT_BYTES_PER_HOUR bytes a clock hour, as stored (the Content-Length is counted
before reading; what gunzipping adds, after). Over either is a 429 with Retry-After: the
seconds to the end of that window. 0 turns a budget off.

The counters live in Redis (REDIS_URL), shared by every web process; a key per trigger and
window, expiring after it. Without Redis (`make run` where none runs), or while it does not
answer, each web process counts on its own, so the budgets hold per process; Redis is tried
again every REDIS_RETRY seconds.
"""

import logging
import math
import threading
import time

import redis
from django.conf import settings
from rest_framework import exceptions

from triggers.models import Trigger

log = logging.getLogger(__name__)
REDIS_RETRY = 30.0
REDIS_TIMEOUT = 0.5  # seconds: a report waits no longer than this for a Redis that hangs


class Counters:
    """Fixed-window counters: in Redis when it answers, in this process otherwise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local: dict[str, tuple[float, int]] = {}  # key: (expires, value)
        self._redis: tuple[str, redis.Redis] | None = None
        self._redis_down_until = 0.0

    def add(self, key: str, amount: int, ttl: int) -> int:
        """Add `amount` to the counter `key` (made, expiring in `ttl` seconds, if absent);
        returns the new value."""
        if time.monotonic() >= self._redis_down_until:
            try:
                pipe = self._client().pipeline()  # MULTI … EXEC
                pipe.incrby(key, amount)
                pipe.expire(key, ttl)
                return int(pipe.execute()[0])
            except redis.RedisError as exc:
                # Not the URL: it may hold a password.
                log.warning("rate limits: Redis unavailable (%s); counting in this process", exc)
                self._redis_down_until = time.monotonic() + REDIS_RETRY
        return self._add_local(key, amount, ttl)

    def _client(self) -> redis.Redis:
        url = settings.REDIS_URL
        if self._redis is None or self._redis[0] != url:
            client = redis.Redis.from_url(
                url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT
            )
            self._redis = (url, client)
        return self._redis[1]

    def _add_local(self, key: str, amount: int, ttl: int) -> int:
        now = time.monotonic()
        with self._lock:
            expires, value = self._local.get(key, (now + ttl, 0))
            if expires <= now:
                expires, value = now + ttl, 0
            self._local[key] = (expires, value + amount)
            if len(self._local) > 10_000:
                self._local = {k: v for k, v in self._local.items() if v[0] > now}
            return value + amount


counters = Counters()


def _window(seconds: int) -> tuple[int, int]:
    """(the current window's number, seconds until it ends, at least 1)."""
    now = time.time()
    number = int(now // seconds)
    return number, max(1, math.ceil((number + 1) * seconds - now))


def admit(trigger: Trigger, length: int) -> None:
    """Count a report of `length` bytes against the trigger's budgets; raises Throttled (429
    with Retry-After) when it is over one."""
    per_minute = settings.EVENTS_RATE_LIMIT_PER_MINUTE
    if per_minute:
        minute, left = _window(60)
        if counters.add(f"relay:events-rate:{trigger.pk}:requests:{minute}", 1, 120) > per_minute:
            raise exceptions.Throttled(
                left, f"This trigger may send {per_minute} reports a minute; it has sent more."
            )
    per_hour = settings.EVENTS_RATE_LIMIT_BYTES_PER_HOUR
    if per_hour:
        hour, left = _window(3600)
        key = f"relay:events-rate:{trigger.pk}:bytes:{hour}"
        if counters.add(key, length, 7200) > per_hour:
            counters.add(key, -length, 7200)  # not stored: it does not count
            raise exceptions.Throttled(
                left, f"This trigger may send {per_hour} bytes an hour; this report would exceed it."
            )


def count_bytes(trigger: Trigger, extra: int) -> None:
    """Bytes stored beyond what admit() counted (a gzipped body's expansion): they count
    against the next report."""
    if settings.EVENTS_RATE_LIMIT_BYTES_PER_HOUR:
        hour, _ = _window(3600)
        counters.add(f"relay:events-rate:{trigger.pk}:bytes:{hour}", extra, 7200)
