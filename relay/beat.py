"""The beat's scheduler (CELERY_BEAT_SCHEDULER): celery-redbeat's, which lets a beat run on
every node with one of them active, the one holding a lock in Redis (relay/settings.py).

RedBeat's own beat exits when a tick finds its lock gone or Redis unreachable (the lock's
extension raises), and nothing starts it again inside `worker --beat`: after a Redis restart
every node would be left without a beat. Here such a beat goes back to waiting for the lock,
as a beat does at its start, so every node keeps one ready. Two beats may then send the same
periodic task for one tick at most (the old one's tick that found the lock gone sent nothing:
the lock is extended first); every periodic task is safe to run twice, and schedules start
each slot once by a compare-and-set (workflows.schedules)."""

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from celery import Celery
from celery.utils.log import get_task_logger
from redbeat.schedulers import RedBeatConfig, RedBeatScheduler, acquire_distributed_beat_lock
from redis.exceptions import LockError, RedisError

logger = get_task_logger(__name__)


class Config(RedBeatConfig):
    """RedBeat's settings, which Django's settings give under the CELERY_ namespace
    (CELERY_REDBEAT_REDIS_URL …): RedBeat looks for its own names alone to tell a setting
    given from one it may fall back for (the broker's URL and transport options)."""

    def is_key_in_conf(self, name: str) -> bool:
        return bool(super().is_key_in_conf(name) or super().is_key_in_conf(f"celery_{name}"))


class Scheduler(RedBeatScheduler):
    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        app.redbeat_conf = Config(app)  # before RedBeat makes its own
        super().__init__(app, *args, **kwargs)

    def tick(self, min: Callable = min, **kwargs: Any) -> float:  # Celery's signature
        if self.lock_key and self.lock is None:  # Redis was unreachable when the beat started
            self._wait_for_lock()
        try:
            return super().tick(min=min, **kwargs)
        except (LockError, RedisError) as exc:
            logger.warning("beat: lost its lock or Redis (%s); waiting to take the lock again", exc)
        self._wait_for_lock()
        return 0.0

    def _wait_for_lock(self) -> None:
        """Block until this beat holds the lock (RedBeat tries every max_interval seconds)."""
        while True:
            try:
                if self.lock is not None and self.lock.owned():
                    return
                self.lock = None
                acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=self))
                if self.lock is not None:
                    return
            except RedisError as exc:
                logger.warning("beat: Redis unreachable (%s); trying again", exc)
            time.sleep(self.max_interval)
