"""Working one run, as the RFC's bridge does: accept it (409: another bridge has it, leave
quietly), start Puppet, report `in-progress` with `next_update_before = now + 3 x heartbeat`,
heartbeat until Puppet is done, then `complete` with the outcome and a result per node.

Everything the bridge holds is in the run's RunRecord on disk, so a bridge killed at any
moment is resumed by the next one (`resume`): it re-attaches to Puppet's work if that is
still there, and delivers a final state that was spooled but not yet taken.

The service being down never stops Puppet: failed heartbeats are logged and tried again
next tick, and the final state, spooled first, is retried (capped, jittered backoff) until
the service takes it. A `cancel_requested` answer stops Puppet and completes `cancelled`."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from relay_bridge import metrics
from relay_bridge.api import ApiError, RelayClient
from relay_bridge.backends import Backend, Job, RunError
from relay_bridge.logs import RunLog
from relay_bridge.state import RunRecord

MISSED_BEATS = 3  # the promise: the next update comes within 3 heartbeat intervals


class RunLost(Exception):
    """The service says the run is not ours any more (completed by expiry, deleted, or held
    under another lease): stop working it."""


class RunWorker:
    def __init__(
        self,
        client: RelayClient,
        backend: Backend,
        run: dict[str, Any],
        state_dir: Path,
        heartbeat: float = 15.0,
        shutdown: threading.Event | None = None,
        stop_timeout: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client, self.backend, self.run = client, backend, run
        self.run_id: str = run["id"]
        self.record = RunRecord(state_dir, self.run_id)
        self.workdir = self.record.dir / "work"
        self.heartbeat = heartbeat
        self.shutdown = shutdown or threading.Event()
        self.stop_timeout = stop_timeout
        self.sleep = sleep
        self.log = RunLog(self.run_id)
        self.lease: str | None = None

    def work(self) -> str | None:
        """Accept and work a pending run. The outcome this bridge completed it with, or
        None when it did not (another bridge has it, or the final state waits on disk)."""
        if not self.record.lock():
            self.log.info("another bridge process on this host is working this run")
            return None
        try:
            try:
                self.lease = self.client.accept(self.run_id)
            except ApiError as exc:
                self.log.warning("could not accept the run", error=str(exc))
                self.record.remove()
                return None
            if self.lease is None:
                self.log.info("another bridge accepted the run; leaving it")
                self.record.remove()
                return None
            self.record.save(run=self.run, lease=self.lease, backend=self.backend.name)
            metrics.held(+1)
            self.log.info("accepted", lease=self.lease, backend=self.backend.name)
            try:
                return self._start_and_watch()
            finally:
                metrics.held(-1)
        finally:
            self.record.unlock()

    def resume(self) -> str | None:
        """Go on with a run this host held when its bridge died (None when another process
        of this host got to it first)."""
        if not self.record.lock():
            return None
        document = self.record.load()
        self.lease = document.get("lease")
        metrics.held(+1)
        try:
            if document.get("final"):
                self.log.info("resuming: delivering the spooled final state")
                return self._deliver(document["final"])
            handle = document.get("handle")
            if not handle:
                # Killed between the accept and Puppet's start: nothing runs yet.
                self.log.info("resuming: Puppet was not started yet; starting it")
                return self._start_and_watch()
            try:
                job = self.backend.attach(handle, self.workdir)
            except RunError as exc:
                self.log.error("resuming: Puppet's work is gone", reason=str(exc))
                msg = f"The bridge restarted and could not find Puppet's work again: {exc}"
                return self._complete("error", {"result": {"msg": msg}})
            self.log.info("resuming: re-attached to Puppet's work", job=handle)
            return self._watch_and_complete(job)
        finally:
            metrics.held(-1)
            self.record.unlock()

    def _start_and_watch(self) -> str | None:
        try:
            job = self.backend.start(self.run, self.workdir)
        except RunError as exc:
            self.log.error("the run cannot be done", reason=str(exc))
            return self._complete("error", exc.results)
        except OSError as exc:
            self.log.error("could not start Puppet", exc_info=True)
            return self._complete("error", {"result": {"msg": f"The bridge could not start Puppet: {exc}"}})
        self.record.save(handle=job.handle())
        self.log.info("Puppet started", job_id=job.job_id or None)
        return self._watch_and_complete(job)

    def _watch_and_complete(self, job: Job) -> str | None:
        try:
            outcome, results = self._watch(job)
        except RunLost as exc:
            self.log.error("the service no longer has this run for us; stopping Puppet", reason=str(exc))
            job.stop()
            job.wait(30)
            self.record.remove()
            return None
        return self._complete(outcome, results, job.job_id)

    def _watch(self, job: Job) -> tuple[str, Any]:
        """Heartbeat around the job until it is over; its outcome and results."""
        stopped_because: str | None = None
        deadline: float | None = None
        # The job id goes with every state: a first heartbeat that is lost must not lose it.
        in_progress = {"status": "in-progress", **({"job_id": job.job_id} if job.job_id else {})}
        self._beat(in_progress)
        while not job.wait(self.heartbeat):
            state = self._beat(in_progress)
            if stopped_because:
                continue
            if state and state.get("cancel_requested"):
                self.log.info("cancel requested; stopping Puppet")
                stopped_because = "cancelled"
                job.stop()
            elif self.shutdown.is_set():
                deadline = deadline or time.monotonic() + self.stop_timeout
                if time.monotonic() >= deadline:
                    self.log.warning("the bridge is stopping and Puppet has not finished; stopping Puppet")
                    stopped_because = "shutdown"
                    job.stop()
        outcome, results = job.result()
        if stopped_because == "cancelled":
            return "cancelled", results
        if stopped_because == "shutdown":
            msg = "The bridge was stopped before Puppet finished; Puppet was stopped."
            return "error", {**results, "result": {"msg": msg}}
        return outcome, results

    def _beat(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """One state PUT while Puppet runs: the service's answer, or None when it could not
        be reached (Puppet goes on; the next tick tries again)."""
        due = datetime.now(timezone.utc) + timedelta(seconds=MISSED_BEATS * self.heartbeat)
        body = {**state, "next_update_before": due.isoformat()}
        try:
            # Two short tries only: the next heartbeat is never more than one interval away,
            # and a link that swallows packets must not hold the heartbeats up.
            timeout = min(30.0, max(5.0, self.heartbeat))
            answer = self.client.put_state(self.run_id, body, self.lease, attempts=2, timeout=timeout)
        except ApiError as exc:
            if exc.status in (404, 409):
                raise RunLost(str(exc)) from None
            self.log.warning("heartbeat not delivered; Puppet goes on", error=str(exc))
            return None
        status = answer.get("status", state["status"])
        if self.record.load().get("last_state") != status:  # written when it changes, not each beat
            self.record.save(last_state=status)
        return answer

    def _complete(self, outcome: str, results: Any, job_id: str = "") -> str | None:
        """Spool the final state on disk, then deliver it."""
        body = {"status": "complete", "outcome": outcome, "run_results": results}
        if job_id:
            body["job_id"] = job_id
        self.record.save(final=body)
        return self._deliver(body)

    def _deliver(self, body: dict[str, Any]) -> str | None:
        """Deliver the final state, retried until the service takes it. A bridge that is
        stopping leaves it spooled: the next start delivers it."""
        outcome = body.get("outcome", "")
        delay = 1.0
        while True:
            try:
                self.client.put_state(
                    self.run_id, body, self.lease, attempts=2 if self.shutdown.is_set() else None
                )
            except ApiError as exc:
                if exc.status in (400, 404, 409):
                    self.log.error("the service refused the final state", outcome=outcome, error=str(exc))
                    self.record.remove()
                    return None
                if self.shutdown.is_set():
                    self.log.warning("stopping with the final state spooled; the next start delivers it")
                    return None
                self.log.warning("final state not delivered yet; retrying", outcome=outcome, error=str(exc))
                self.sleep(random.uniform(delay / 2, delay))  # noqa: S311
                delay = min(delay * 2, 60.0)
                continue
            self.log.info("completed", outcome=outcome)
            metrics.completed(outcome)
            self.record.remove()
            return outcome
