"""Dry-run evidence from PuppetDB: what each node's Puppet run changed, or in noop would
change, read from the run's reports in PuppetDB rather than from the nodes.

PE's orchestrator job API says how each node's run ended, not what it changed: PE keeps that
in PuppetDB. Each node item of the job carries the `transaction_uuid` of its Puppet run; the
report with that transaction (and the node's certname) is the node's, and its resource
events (by the report's hash) are what it changed. On open source (SSH, Bolt) the agent runs
with `--job-id <run id>` (Puppet has no option that sets the transaction uuid), which Puppet
writes into the report it sends: the run's reports are those with its job id, one per node,
and the nodes no longer print theirs after Puppet.

PuppetDB stores reports asynchronously (its command queue), so a report can appear after
the run has ended: the bridge asks again every POLL_SECONDS, up to `puppetdb_report_wait`
seconds, while the run worker heartbeats as usual. The asking runs in a thread of its own
that the job stops waiting for at that limit whatever PuppetDB does, so a slow PuppetDB
cannot hold the run: it completes with its outcome, and each node whose report was not read
says `report_error: "not available: <reason>"`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relay_bridge import reports, trust
from relay_bridge.backends import Backend, Job, Wrapping
from relay_bridge.puppetdb import PuppetDB, PuppetDBError

POLL_SECONDS = 1.0
REPORT_BATCH = 100  # transaction uuids or certnames per reports query
EVENT_BATCH = 10  # reports per events query: a first run can have thousands of events each
EVENT_PAGE = 5_000  # event rows per answer (about 2 MB): read page by page
# A node's changed events read at most: past it its evidence says so instead (a first run of a
# large catalog), so neither PuppetDB's answers nor what is kept grow with the report.
EVENTS_PER_NODE = 50_000
UNREACHABLE = 255  # the SSH client's exit code when Puppet never ran
REPORT_FIELDS = [
    "hash",
    "certname",
    "transaction_uuid",
    "job_id",
    "status",
    "noop",
    "noop_pending",
    "configuration_version",
    "environment",
    "receive_time",
]
EVENT_FIELDS = [
    "report",
    "resource_type",
    "resource_title",
    "property",
    "old_value",
    "new_value",
    "status",
    "message",
    "timestamp",
]


class Evidence(Wrapping):
    """A backend whose Puppet runs' evidence comes from PuppetDB: by each node's
    transaction uuid (`by="transaction_uuid"`: the PE orchestrator's node items name it) or
    by the run's job id (`by="job_id"`: SSH and Bolt run the agent with `--job-id`)."""

    def __init__(self, backend: Backend, puppetdb: PuppetDB, limit: float, by: str) -> None:
        super().__init__(backend)
        self.puppetdb, self.limit, self.by = puppetdb, limit, by

    def start(self, run: dict[str, Any], workdir: Path) -> Job:
        job = self.backend.start(run, workdir)
        if (run.get("type") or "run") != "run":
            return job  # tasks and plans leave no Puppet report
        if self.by == "job_id" and not trust.run_id_ok(run.get("id")):
            return job  # no --job-id: no report can be told to be this run's
        return EvidenceJob(job, self, str(run["id"]) if self.by == "job_id" else "")

    def attach(self, handle: dict[str, Any], workdir: Path) -> Job:
        evidence = handle.get("evidence")
        job = self.backend.attach({k: v for k, v in handle.items() if k != "evidence"}, workdir)
        if not isinstance(evidence, dict) or not isinstance(evidence.get("job_id"), str):
            return job
        return EvidenceJob(job, self, evidence["job_id"])


class EvidenceJob:
    """A backend's job, then (once Puppet is done everywhere) the reading of its nodes'
    reports from PuppetDB, bounded by the bridge's `puppetdb_report_wait`."""

    def __init__(self, job: Job, source: Evidence, run_job_id: str) -> None:
        self.job, self.source, self.run_job_id = job, source, run_job_id
        self.job_id = job.job_id
        self._result: tuple[str, Any] | None = None
        self._reading: Reading | None = None
        self._stopped = False

    def handle(self) -> dict[str, Any]:
        return {**self.job.handle(), "evidence": {"job_id": self.run_job_id}}

    def wait(self, timeout: float) -> bool:
        began = time.monotonic()
        if self._reading is None:
            if not self.job.wait(timeout):
                return False
            self._result = self.job.result()
            wanted = wanted_reports(self._result[1], self.source.by)
            if self._stopped:
                wanted = {}  # a cancelled run's nodes are not waited for
            self._reading = Reading(self.source, wanted, self.run_job_id)
        return self._reading.wait(max(0.0, timeout - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stopped = True
        self.job.stop()
        if self._reading is not None:
            self._reading.stop()

    def result(self) -> tuple[str, Any]:
        outcome, results = self._result or self.job.result()
        if self._reading is not None:
            self._reading.add_to(results)
        return outcome, results


def wanted_reports(results: Any, by: str) -> dict[str, str]:
    """The nodes whose reports are read: {certname: transaction uuid (or the certname)}.
    Nodes where Puppet ran and whose evidence the backend did not already give (a run
    started before PuppetDB was configured read its reports from the nodes)."""
    nodes = results.get("nodes") if isinstance(results, dict) else None
    wanted: dict[str, str] = {}
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict) or not isinstance(node.get("name"), str) or "changes_pending" in node:
            continue
        if by == "transaction_uuid":
            uuid = node.get("transaction_uuid")
            if isinstance(uuid, str) and uuid and node.get("state") in ("finished", "failed"):
                wanted[node["name"]] = uuid
        elif isinstance(node.get("exit_code"), int) and node["exit_code"] != UNREACHABLE:
            wanted[node["name"]] = node["name"]
    return wanted


class Reading:
    """The reports of `wanted` nodes, asked of PuppetDB in a thread until all are there,
    the limit has passed, or the job is stopped."""

    def __init__(self, source: Evidence, wanted: dict[str, str], run_job_id: str) -> None:
        self.puppetdb, self.by, self.limit = source.puppetdb, source.by, source.limit
        self.wanted, self.run_job_id = wanted, run_job_id
        self.deadline = time.monotonic() + self.limit
        self.found: dict[str, dict[str, Any]] = {}
        self.error = ""  # PuppetDB's last error, for the nodes still without a report
        self.stopped = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._wake = threading.Event()
        if wanted:
            threading.Thread(target=self._run, name="puppetdb-reports", daemon=True).start()
        else:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        left = self.deadline - time.monotonic()
        return self._done.wait(max(0.0, min(timeout, left))) or left <= timeout

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()
        self._done.set()

    def add_to(self, results: Any) -> None:
        """The evidence read so far into the results' node items; the rest not available."""
        with self._lock:
            found, error = dict(self.found), self.error
        if self.stopped:
            reason = "the run was stopped before its reports were read from PuppetDB"
        elif error:
            reason = error
        else:
            reason = f"PuppetDB had no report of this run for the node after {self.limit:g} s"
        for node in results.get("nodes") or [] if isinstance(results, dict) else []:
            if isinstance(node, dict) and node.get("name") in self.wanted:
                node.update(
                    found.get(node["name"])
                    or {"changes_pending": None, "report_error": f"not available: {reason}"}
                )

    def _run(self) -> None:
        try:
            while not self.stopped:
                missing = {node: key for node, key in self.wanted.items() if node not in self.found}
                if not missing:
                    return
                try:
                    self._read(missing)
                    with self._lock:
                        self.error = ""
                except PuppetDBError as exc:
                    with self._lock:
                        self.error = str(exc)
                left = self.deadline - time.monotonic()
                if len(self.found) == len(self.wanted) or left <= 0:
                    return
                self._wake.wait(min(POLL_SECONDS, left))
        finally:
            self._done.set()

    def _events(self, match: list[Any]) -> Iterator[dict[str, Any]]:
        """The events `match` names, EVENT_PAGE rows an answer, in a stable order (offset
        paging needs one)."""
        order = [{"field": f} for f in ("report", "timestamp", "resource_type", "resource_title", "property")]
        offset = 0
        while True:
            page = self.puppetdb.query(
                ["extract", EVENT_FIELDS, match],
                "events",
                timeout=self._timeout(),
                order_by=order,
                limit=EVENT_PAGE,
                offset=offset,
            )
            yield from page
            if len(page) < EVENT_PAGE:
                return
            offset += EVENT_PAGE

    def _timeout(self) -> float:
        return max(1.0, min(self.puppetdb.timeout, self.deadline - time.monotonic() + 1))

    def _read(self, missing: dict[str, str]) -> None:
        keys = list(missing.values())
        rows: list[dict[str, Any]] = []
        for start in range(0, len(keys), REPORT_BATCH):
            batch = ["array", keys[start : start + REPORT_BATCH]]
            if self.by == "transaction_uuid":
                match: list[Any] = ["in", "transaction_uuid", batch]
            else:
                match = ["and", ["=", "job_id", self.run_job_id], ["in", "certname", batch]]
            rows += self.puppetdb.query(["extract", REPORT_FIELDS, match], "reports", timeout=self._timeout())
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:
            node = row.get("certname") if isinstance(row, dict) else None
            # The node's own report only: the one its transaction uuid (or the run's job id) names.
            if node not in missing or (
                self.by == "transaction_uuid" and row.get("transaction_uuid") != missing[node]
            ):
                continue
            if node not in latest or str(row.get("receive_time")) > str(latest[node].get("receive_time")):
                latest[node] = row
        # Each batch's nodes are summarized as soon as their events are read, so what is held
        # is EVENT_BATCH nodes' events at most, whatever the run's size.
        nodes = list(latest)
        for start in range(0, len(nodes), EVENT_BATCH):
            batch = nodes[start : start + EVENT_BATCH]
            hashes = {str(latest[node].get("hash")): node for node in batch}
            events: dict[str, list[dict[str, Any]]] = {node: [] for node in batch}
            too_many: set[str] = set()
            match = [
                "and",
                ["in", "report", ["array", list(hashes)]],
                ["in", "status", ["array", list(reports.CHANGE_STATUSES)]],
            ]
            for event in self._events(match):
                node = hashes.get(str(event.get("report"))) if isinstance(event, dict) else None
                if not node or node in too_many:
                    continue
                if len(events[node]) >= EVENTS_PER_NODE:
                    too_many.add(node)
                    events[node] = []
                    continue
                events[node].append(event)
            for node in batch:
                if node in too_many:
                    summary = {
                        "changes_pending": None,
                        "report_error": f"not available: the report has more than {EVENTS_PER_NODE} "
                        "changed or failed events; not read",
                    }
                else:
                    try:
                        summary = reports.changes_of(reports.from_puppetdb(latest[node], events.pop(node)))
                    except reports.ReportError as exc:
                        summary = {"changes_pending": None, "report_error": str(exc)}
                with self._lock:
                    self.found[node] = summary
