"""The two ways to run the bridge.

`poll --once` is the RFC's flow for a systemd timer: list the pending runs, fork a
daemonized worker for each, and exit at once (the unit needs KillMode=process so systemd
lets the workers live on). `serve` is one long-running process: it waits on the service's
long-poll and works each run in a thread of its own, at most `max_concurrent` at a time,
and on SIGTERM stops taking runs and finishes (or stops and completes) what it holds."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from typing import Any

from relay_bridge import inventory, metrics
from relay_bridge.api import ApiError, RelayClient
from relay_bridge.backends import Backend
from relay_bridge.config import Config
from relay_bridge.logs import logger
from relay_bridge.puppetdb import connect
from relay_bridge.state import RunRecord
from relay_bridge.worker import RunWorker


def client_for(config: Config, backend: Backend) -> RelayClient:
    return RelayClient(
        config.relay_api_url,
        config.relay_connection_token,
        platform=backend.platform,
        backend=backend.name,
        proxy_url=config.proxy_url,
    )


def poll_once(config: Config, backend: Backend, heartbeat: float) -> int:
    """Fork a daemon for each run this host held when a bridge died (its lock is free), and
    for each pending run. Returns how many were forked, or -1 when the service could not be
    reached (the held runs were still resumed)."""
    forked = 0
    for _, run in RunRecord.orphans(config.state_dir):
        forked += _fork_worker(config, backend, run, heartbeat, resume=True)
    client = client_for(config, backend)
    try:
        runs = client.list_runs(status="pending", attempts=3)  # the timer comes again in 30 s
    except ApiError as exc:
        logger.error("could not list runs", extra={"fields": {"error": str(exc)}})
        return -1
    finally:
        client.close()  # never share a connection with the forked children
    for run in runs:
        forked += _fork_worker(config, backend, run, heartbeat, resume=False)
    logger.info("poll done", extra={"fields": {"pending": len(runs), "forked": forked}})
    if config.puppetdb_url:
        sync_inventory(config, backend)  # after the runs: they are not kept waiting on it
    return forked


def sync_inventory(config: Config, backend: Backend) -> inventory.Synced | None:
    """One inventory sync (`poll --once`, `relay-bridge inventory`); None when it failed
    (logged; the service keeps its time, so the next sync sends what this one did not)."""
    client = client_for(config, backend)
    puppetdb = connect(config)
    try:
        done = inventory.sync(client, puppetdb, config.inventory_facts)
        inventory.answer_queries(client, puppetdb, client.inventory_status())
        return done
    except ApiError as exc:
        if exc.status == 409:  # another sync of this connection is under way: it sends ours
            logger.info("inventory sync skipped", extra={"fields": {"reason": str(exc)}})
        else:
            logger.error("inventory sync failed", extra={"fields": {"error": str(exc)}})
        return None
    except inventory.InventoryError as exc:
        logger.error("inventory sync failed", extra={"fields": {"error": str(exc)}})
        return None
    finally:
        puppetdb.close()
        client.close()


def _fork_worker(
    config: Config, backend: Backend, run: dict[str, Any], heartbeat: float, resume: bool
) -> int:
    """1 in the caller; never returns in the daemon, which works the run and exits."""
    if _daemonize():
        return 1
    # In the daemonized grandchild: work the run, then leave without running the parent's
    # cleanup (atexit handlers, buffered output belong to the parent).
    code = 0
    try:
        worker = RunWorker(client_for(config, backend), backend, run, config.state_dir, heartbeat)
        if resume:
            worker.resume()
        else:
            worker.work()
    except BaseException:
        logger.exception("the run's worker crashed", extra={"run_id": run.get("id")})
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _daemonize() -> bool:
    """Fork twice so the worker is nobody's child and has no terminal: True in the
    caller, False in the daemon."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child:
        os.waitpid(child, 0)  # the middle process exits at once: no zombie
        return True
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # stdout/stderr stay: under systemd they are the journal
    os.close(devnull)
    return False


class Server:
    """`relay-bridge serve`."""

    def __init__(
        self,
        config: Config,
        backend: Backend,
        heartbeat: float = 15.0,
        max_concurrent: int = 10,
        wait: int = 30,
        stop_timeout: float = 60.0,
        metrics_port: int | None = None,
    ) -> None:
        self.config, self.backend = config, backend
        self.metrics_port = metrics_port
        self.heartbeat, self.max_concurrent, self.wait = heartbeat, max_concurrent, wait
        self.stop_timeout = stop_timeout
        self.stopping = threading.Event()
        self.workers: dict[str, threading.Thread] = {}
        self.slot_free = threading.Event()
        self.client = client_for(config, backend)

    def stop(self, *_: Any) -> None:
        self.stopping.set()
        self.slot_free.set()

    def serve(self) -> int:
        if self.metrics_port:
            try:
                metrics_server = metrics.serve(self.metrics_port)
            except OSError as exc:
                logger.error(
                    "cannot serve metrics", extra={"fields": {"port": self.metrics_port, "error": str(exc)}}
                )
                return 2
        logger.info(
            "serving",
            extra={"fields": {"backend": self.backend.name, "max_concurrent": self.max_concurrent}},
        )
        poller = threading.Thread(target=self._poll, name="poller", daemon=True)
        poller.start()
        if self.config.puppetdb_url:
            threading.Thread(target=self._inventory, name="inventory", daemon=True).start()
        self.stopping.wait()
        logger.info(
            "stopping: no new runs; finishing the runs held", extra={"fields": {"held": self._held()}}
        )
        for thread in list(self.workers.values()):
            thread.join(self.stop_timeout + 30)
        left = self._held()
        if left:
            logger.error("stopped with runs still held", extra={"fields": {"held": left}})
        self.client.close()
        if self.metrics_port:
            metrics_server.shutdown()
        return 0 if not left else 1

    def _held(self) -> int:
        return sum(1 for t in self.workers.values() if t.is_alive())

    def _poll(self) -> None:
        delay = 1.0
        while not self.stopping.is_set():
            self.workers = {rid: t for rid, t in self.workers.items() if t.is_alive()}
            self._resume_held()
            if len(self.workers) >= self.max_concurrent:
                self.slot_free.clear()
                self.slot_free.wait(1.0)
                continue
            asked = time.monotonic()
            try:
                # One try: this loop owns the backoff, so it can stop at once on SIGTERM.
                runs = self.client.list_runs(status="pending", wait=self.wait, attempts=1)
                delay = 1.0
            except ApiError as exc:
                logger.warning(
                    "could not list runs", extra={"fields": {"error": str(exc), "retry_in": delay}}
                )
                self.stopping.wait(random.uniform(delay / 2, delay))  # noqa: S311
                delay = min(delay * 2, 60.0)
                continue
            started = 0
            for run in runs:
                if self.stopping.is_set() or len(self.workers) >= self.max_concurrent:
                    break
                if run["id"] in self.workers:
                    continue
                thread = threading.Thread(
                    target=self._work, args=(run,), name=f"run-{run['id']}", daemon=True
                )
                self.workers[run["id"]] = thread
                thread.start()
                started += 1
            if not started and time.monotonic() - asked < 0.5:
                # Nothing new, answered at once: the long-poll does that while pending runs
                # are listed (ones we are already accepting, or ones refused), or with --wait
                # 0. Do not spin on it.
                self.stopping.wait(0.5)

    def _inventory(self) -> None:
        """Inventory syncs: at start, every inventory_interval seconds, and when the service
        asks (the timer asks it every minute). A client and a PuppetDB session of its own."""
        client = client_for(self.config, self.backend)
        puppetdb = connect(self.config)
        interval = self.config.inventory_interval or float("inf")
        timer = inventory.Timer(client, puppetdb, self.config.inventory_facts, interval)
        try:
            while not self.stopping.is_set():
                timer.tick()
                self.stopping.wait(min(timer.CHECK, interval))
        finally:
            puppetdb.close()
            client.close()

    def _resume_held(self) -> None:
        """Runs this host held when a bridge died: their lock is free. Worked like new ones."""
        for record, run in RunRecord.orphans(self.config.state_dir):
            if len(self.workers) >= self.max_concurrent:
                return
            if record.run_id in self.workers:
                continue  # its worker thread is just starting or ending
            thread = threading.Thread(
                target=self._work, args=(run, True), name=f"run-{record.run_id}", daemon=True
            )
            self.workers[record.run_id] = thread
            thread.start()

    def _work(self, run: dict[str, Any], resume: bool = False) -> None:
        client = client_for(self.config, self.backend)
        try:
            worker = RunWorker(
                client,
                self.backend,
                run,
                self.config.state_dir,
                self.heartbeat,
                shutdown=self.stopping,
                stop_timeout=self.stop_timeout,
            )
            if resume:
                worker.resume()
            else:
                worker.work()
        except Exception:
            logger.exception("the run's worker crashed", extra={"run_id": run.get("id")})
        finally:
            client.close()
            self.slot_free.set()


def install_signal_handlers(server: Server) -> None:
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
