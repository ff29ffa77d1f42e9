"""Backends start Puppet for a run and watch it: SSH here; Bolt and the PE orchestrator
follow the same shape. A backend's `start` returns a Job the worker heartbeats around."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from relay_bridge import trust
from relay_bridge.config import Config

# What `puppet agent -t` exit codes mean (integration contract §6; -t implies
# --detailed-exitcodes). 0 and 2 are a good run.
EXIT_MEANINGS = {
    0: "no changes",
    1: "the run failed, or another run was already in progress",
    2: "changes applied",
    4: "some resources failed",
    6: "changes applied and some resources failed",
}
GOOD_EXITS = (0, 2)


class RunError(Exception):
    """The run cannot be done at all (e.g. a scope the backend cannot reach): it completes
    with outcome `error`, and run_results `{"result": {"msg": ..., **details}}`."""

    def __init__(self, msg: str, **details: Any) -> None:
        super().__init__(msg)
        self.details = details

    @property
    def results(self) -> dict[str, Any]:
        return {"result": {"msg": str(self), **self.details}}


@dataclass
class NodeResult:
    name: str
    state: str  # finished | failed | skipped
    exit_code: int | None = None
    meaning: str = ""
    duration: float = 0.0
    output: str = ""  # the tail of what the node printed
    details: dict[str, Any] = field(default_factory=dict)
    changes: dict[str, Any] = field(default_factory=dict)  # from its last run report (reports.py)

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "state": self.state, "duration": round(self.duration, 3)}
        if self.exit_code is not None:
            doc["exit_code"] = self.exit_code
        if self.meaning:
            doc["meaning"] = self.meaning
        doc.update(self.changes)
        if self.output:
            doc["output"] = self.output
        if self.details:
            doc["details"] = self.details
        return doc


def process_alive(pid: int | None, marker: bytes) -> bool:
    """Whether `pid` still runs and is the process we started (its command line holds
    `marker`), not a pid since reused by something else. For work that outlived a bridge."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return marker in cmdline and ") Z " not in status


def meaning_of(exit_code: int) -> str:
    return EXIT_MEANINGS.get(exit_code, f"unexpected exit code {exit_code}")


def outcome_of(nodes: list[NodeResult]) -> str:
    """`finished` when every node ran Puppet to a good end, else `failed`."""
    return "finished" if nodes and all(n.state == "finished" for n in nodes) else "failed"


class Job(Protocol):
    job_id: str  # what the service shows as the run's job_id

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True once the job is over."""

    def stop(self) -> None:
        """Stop Puppet everywhere it still runs; `wait` then returns True soon."""

    def result(self) -> tuple[str, Any]:
        """(outcome, run_results), once `wait` returned True."""

    def handle(self) -> dict[str, Any]:
        """What finds this job again after the bridge restarts (kept in its RunRecord)."""


class Backend(Protocol):
    name: str
    platform: str  # `pe` or `oss`, for X-Relay-Platform

    def start(self, run: dict[str, Any], workdir: Path) -> Job:
        """Start Puppet for the run; raises RunError when it cannot."""

    def attach(self, handle: dict[str, Any], workdir: Path) -> Job:
        """The job `handle` names, after a restart; RunError when it cannot be found."""


class Wrapping:
    """A backend around another (query.QueryScoped resolves a query first, evidence.Evidence
    reads the reports after): the inner one's name, and its platform read and set through."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name

    @property
    def platform(self) -> str:
        return self.backend.platform

    @platform.setter
    def platform(self, value: str) -> None:
        self.backend.platform = value


def environment_of(run: dict[str, Any]) -> str | None:
    """The run's Puppet environment, if it names one; RunError when it is not a valid name."""
    environment = run.get("environment")
    if environment in (None, ""):
        return None
    if not trust.environment_ok(environment):
        raise RunError(f"The run's environment is not a valid environment name: {trust.shown(environment)}.")
    return str(environment)


def check_certnames(names: list[Any], what: str = "node") -> list[str]:
    """`names`, once each in the order given; RunError naming the first that is not a
    certname (by the service's rule): nothing is run then."""
    for name in names:
        if not trust.certname_ok(name):
            raise RunError(f"The run names a {what} that is not a valid certname: {trust.shown(name)}.")
    return list(dict.fromkeys(names))


def puppet_flags(run: dict[str, Any]) -> list[str]:
    """`puppet agent -t` flags for a run. Always --noop or --no-noop, so a node whose
    puppet.conf says `noop = true` still does what the workflow asked. `--job-id` is the
    run's id: Puppet sends it with the catalog request and writes it into the run's report,
    which is how the bridge knows the node's last run report is this run's."""
    flags = ["--noop" if run.get("noop") else "--no-noop"]
    flags += [f"--{name}" for name in ("debug", "trace", "evaltrace") if run.get(name)]
    environment = environment_of(run)
    if environment:
        flags += ["--environment", environment]
    if trust.run_id_ok(run.get("id")):
        flags += ["--job-id", run["id"]]
    return flags


# What each kind of run needs beyond `puppet agent`, for the refusals' messages.
NEEDS = {"task-run": "the Bolt or PE orchestrator backend", "plan-run": "the PE orchestrator backend"}


def scope_of(run: dict[str, Any]) -> dict[str, Any]:
    """The run's scope. A task run the service made before task runs had a scope carries
    its nodes as certname `targets` and no scope: those are its nodes."""
    scope = run.get("scope")
    if run.get("type") == "task-run" and not scope and isinstance(run.get("targets"), list):
        return {"nodes": run["targets"]}
    return scope if isinstance(scope, dict) else {}


def target_objects(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A task run's `targets` as published: Bolt target objects (none for the old shape)."""
    targets = run.get("targets") if run.get("scope") else None
    return [t for t in targets if isinstance(t, dict)] if isinstance(targets, list) else []


def nodes_of(run: dict[str, Any], backend: str, kinds: tuple[str, ...] = ("run",)) -> list[str]:
    """The run's node list, or RunError when the backend cannot do what it asks: a kind of
    run not in `kinds`, or a scope other than a list of nodes (a PuppetDB query or a node
    group needs PuppetDB or the classifier, which only the PE orchestrator asks)."""
    kind = run.get("type") or "run"
    if kind not in kinds:
        raise RunError(f"The {backend} backend cannot do {kind}s; use {NEEDS.get(kind, 'another backend')}.")
    scope = scope_of(run)
    unsupported = sorted(set(scope) - {"nodes"})
    if unsupported:
        needs = "PuppetDB (the bridge's puppetdb_url)" if unsupported[0] == "query" else "the PE orchestrator"
        raise RunError(
            f"The {backend} backend can only run on a list of nodes (scope `nodes`), "
            f"not scope `{unsupported[0]}`: that needs {needs}."
        )
    nodes = scope.get("nodes")
    if not nodes or not isinstance(nodes, list):
        raise RunError("The run names no nodes.")
    return check_certnames(nodes)


PE_MARKER = Path("/opt/puppetlabs/server/pe_version")  # what a PE primary has and open source lacks


def is_pe(marker: Path = PE_MARKER) -> bool:
    return marker.exists()


def choose(config: Config, which: Any = shutil.which, pe: bool | None = None) -> str:
    """The RFC's rule: `backend` from configuration; else the orchestrator on a PE primary;
    else Bolt when `bolt` is in PATH; else SSH."""
    if config.backend:
        return config.backend
    if is_pe() if pe is None else pe:
        return "orchestrator"
    return "bolt" if which("bolt") else "ssh"


def make(config: Config, which: Any = shutil.which, pe: bool | None = None) -> Backend:
    pe = is_pe() if pe is None else pe
    name = choose(config, which, pe)
    # With PuppetDB, the runs' reports are read there (relay_bridge.backends.evidence): the
    # nodes no longer print theirs after Puppet.
    reports_from_puppetdb = bool(config.puppetdb_url and config.puppetdb_report_wait)
    node_reports = {"report_max_bytes": 0} if reports_from_puppetdb else {}
    if name == "ssh":
        from relay_bridge.backends.ssh import SshBackend

        backend: Backend = SshBackend({**config.options("ssh"), **node_reports})
    elif name == "bolt":
        from relay_bridge.backends.bolt import BoltBackend

        backend = BoltBackend({**config.options("bolt"), **node_reports})
    else:
        from relay_bridge.backends.orchestrator import OrchestratorBackend

        backend = OrchestratorBackend(config.options("orchestrator"))
    # The platform is what this host runs, whatever the backend (PE can be driven over SSH).
    backend.platform = "pe" if pe or name == "orchestrator" else "oss"
    if not config.puppetdb_url:
        return backend
    from relay_bridge.puppetdb import connect

    puppetdb = connect(config)
    if name != "orchestrator":  # the orchestrator resolves query scopes itself
        from relay_bridge.backends.query import QueryScoped

        backend = QueryScoped(backend, puppetdb)
    if reports_from_puppetdb:
        from relay_bridge.backends.evidence import Evidence

        by = "transaction_uuid" if name == "orchestrator" else "job_id"
        backend = Evidence(backend, puppetdb, config.puppetdb_report_wait, by)
    return backend
