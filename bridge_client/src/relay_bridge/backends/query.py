"""The `query` scope for the Bolt and SSH backends: the bridge resolves the query to
certnames through PuppetDB (relay_bridge.puppetdb), then the backend runs them as a node
list. (The PE orchestrator asks PuppetDB itself.)"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from relay_bridge.backends import Backend, Job, RunError, Wrapping, check_certnames, scope_of
from relay_bridge.puppetdb import PuppetDB, PuppetDBError


class ResolvedJob:
    """A backend's job for a run whose query scope was resolved: its results say which
    nodes the query named, and when."""

    def __init__(self, job: Job, resolved: dict[str, Any]) -> None:
        self.job, self.resolved = job, resolved
        self.job_id = job.job_id

    def wait(self, timeout: float) -> bool:
        return self.job.wait(timeout)

    def stop(self) -> None:
        self.job.stop()

    def result(self) -> tuple[str, Any]:
        outcome, results = self.job.result()
        return outcome, {"query": self.resolved, **(results if isinstance(results, dict) else {})}

    def handle(self) -> dict[str, Any]:
        return {**self.job.handle(), "resolved": self.resolved}


class QueryScoped(Wrapping):
    """A Bolt or SSH backend that also takes `query` scopes, resolved through PuppetDB to a
    node list first. A query that matches nothing or that PuppetDB refuses ends the run with
    an `error` outcome and PuppetDB's message (as PE's orchestrator's `empty-target`)."""

    def __init__(self, backend: Backend, puppetdb: PuppetDB) -> None:
        super().__init__(backend)
        self.puppetdb = puppetdb

    def start(self, run: dict[str, Any], workdir: Path) -> Job:
        scope = scope_of(run)
        if "query" not in scope:
            return self.backend.start(run, workdir)
        if set(scope) != {"query"}:
            raise RunError("A query scope names nothing else.")
        query = scope["query"]
        try:
            nodes = self.puppetdb.certnames(query)
        except PuppetDBError as exc:
            raise RunError(str(exc), query=query) from None
        if not nodes:
            raise RunError("The query matched no nodes.", query=query)
        try:
            nodes = check_certnames(nodes, "node, from PuppetDB,")
        except RunError as exc:
            raise RunError(str(exc), query=query) from None
        resolved = {
            "query": query,
            "nodes": nodes,
            "resolved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        job = self.backend.start({**run, "scope": {"nodes": nodes}}, workdir)
        return ResolvedJob(job, resolved)

    def attach(self, handle: dict[str, Any], workdir: Path) -> Job:
        resolved = handle.get("resolved")
        inner = {k: v for k, v in handle.items() if k != "resolved"}
        job = self.backend.attach(inner, workdir)
        return ResolvedJob(job, resolved) if isinstance(resolved, dict) else job
