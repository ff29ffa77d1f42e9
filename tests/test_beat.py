"""The beat's scheduler (relay.beat) against the tests' Redis: one beat holds the lock; a beat
that finds its lock gone (it expired while the beat was paused, or Redis was away) does not
exit but waits, and takes the lock again once the beat that took it over is gone.

Each beat is driven from a thread of its own, as a beat process runs (redis-py keeps a lock's
token per thread)."""

import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import redis
from django.conf import settings
from redbeat.schedulers import acquire_distributed_beat_lock

from relay.beat import Scheduler
from relay.celery import app

pytestmark = pytest.mark.django_db  # (the session's fixtures; the beat itself reads no table)


class Beat:
    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(max_workers=1)
        self.scheduler: Scheduler = self.thread.submit(self._start).result()

    def _start(self) -> Scheduler:
        scheduler = Scheduler(app=app, max_interval=0.2)
        acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=scheduler))
        return scheduler

    def owns(self) -> bool:
        return self.thread.submit(self.scheduler.lock.owned).result()

    def close(self) -> None:
        self.thread.submit(self.scheduler.close).result()
        self.thread.shutdown()


def test_a_beat_that_lost_its_lock_waits_for_it_and_takes_it_back_when_the_other_beat_goes():
    assert settings.CELERY_BEAT_SCHEDULER == "relay.beat:Scheduler"
    client = redis.Redis.from_url(settings.REDIS_URL)
    first = Beat()
    assert first.owns()
    assert first.thread.submit(first.scheduler.tick).result() <= 0.2  # holds it: ticks as usual

    client.delete(first.scheduler.lock_key)  # expired (the beat was paused longer than its timeout)
    second = Beat()
    assert second.owns()

    tick = first.thread.submit(first.scheduler.tick)
    time.sleep(1)
    assert not tick.done()  # it neither exited nor sends anything: it waits for the lock
    second.close()  # the other beat stops (or dies, and its lock runs out)
    assert tick.result(timeout=5) == 0.0
    assert first.owns()
    assert first.thread.submit(first.scheduler.tick).result() <= 0.2
    first.close()
    assert client.get(first.scheduler.lock_key) is None
