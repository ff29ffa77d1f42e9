"""Headless Chromium for the pages' browser tests: Debian's /usr/bin/chromium driven by
Playwright's sync API, never a browser Playwright downloads.

Playwright's sync API runs an asyncio loop in the thread that started it, and Django refuses
its ORM in a thread with a running loop (SynchronousOnlyOperation). So the browser lives in a
thread of its own, and a test hands it the browser part as a function (`browser.run(journey)`),
keeping the ORM, pytest-django's flushes and the workers in the test's thread, as always."""

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = "/usr/bin/chromium"

T = TypeVar("T")


class BrowserThread:
    """One Chromium for the session, in its own thread; `run(fn)` calls fn(browser) there and
    returns what it returns (or raises what it raised)."""

    def __init__(self) -> None:
        self._work: queue.Queue[tuple[Callable[[Browser], Any], Future] | None] = queue.Queue()
        started: Future = Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="chromium", daemon=True)
        self._thread.start()
        started.result(timeout=60)

    def _serve(self, started: Future) -> None:
        try:
            playwright = sync_playwright().start()
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        while (item := self._work.get()) is not None:
            fn, done = item
            try:
                done.set_result(fn(browser))
            except BaseException as exc:
                done.set_exception(exc)
        browser.close()
        playwright.stop()

    def run(self, fn: Callable[[Browser], T], timeout: float = 120) -> T:
        done: Future = Future()
        self._work.put((fn, done))
        return done.result(timeout=timeout)

    def stop(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=30)
