"""The PE orchestrator backend (integration contract §4): a job per run, through
`POST /command/deploy` (or `/command/task`, `/command/plan_run`), watched each heartbeat
with `GET /jobs/{name}` until it is `stopped`, `finished` or `failed` (all three are final;
the shipped agent forgot `stopped` and heartbeated for ever), then its nodes, every page.

An orchestrator 4xx is the user's error: the run completes `error` with its `kind` and
`msg`. A 5xx or a network error is retried with backoff; while a job runs, a poll that
fails is simply tried again at the next heartbeat."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import requests

from relay_bridge.backends import RunError, check_certnames, environment_of, scope_of, target_objects
from relay_bridge.backends.options import Options
from relay_bridge.config import ConfigError
from relay_bridge.logs import logger

OPTIONS = {
    "api_url": None,  # default https://<this host's certname>:8143/orchestrator/v1
    "token": None,
    "token_file": "~/.puppetlabs/token",  # where `puppet access login` puts it
    "cacert": "/etc/puppetlabs/puppet/ssl/certs/ca.pem",  # the agent's copy of the Puppet CA
    "concurrency": None,
    "timeout": 30,
    "page_size": 100,
}
SCOPES = ("nodes", "query", "node_group", "application")
TASK_SCOPES = ("nodes", "query", "node_group")  # command/task takes no application
FINAL = ("stopped", "finished", "failed")
PLAN_FINAL = ("success", "failure")


def this_certname() -> str:
    for puppet in ("/opt/puppetlabs/bin/puppet", shutil.which("puppet")):
        if puppet and Path(puppet).exists():
            try:
                done = subprocess.run(
                    [puppet, "config", "print", "certname"], capture_output=True, text=True, timeout=60
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
    return socket.getfqdn()


class OrchestratorBackend:
    name = "orchestrator"
    platform = "pe"

    def __init__(self, options: dict[str, Any], attempts: int = 5, backoff: float = 1.0) -> None:
        o = Options("orchestrator", OPTIONS, options)
        self.api_url = (o.string("api_url") or f"https://{this_certname()}:8143/orchestrator/v1").rstrip("/")
        token, token_file = o.string("token"), o.string("token_file")
        if not token:
            path = Path(str(token_file)).expanduser()
            try:
                token = path.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    "backend_orchestrator_token_file", f"cannot be read ({exc.strerror}); or give the token"
                ) from None
        if not token:
            raise ConfigError("backend_orchestrator_token", "is empty")
        self.cacert = o.string("cacert")
        if self.cacert and not Path(self.cacert).exists():
            raise ConfigError("backend_orchestrator_cacert", f"{self.cacert} does not exist")
        self.concurrency = o.integer("concurrency", 1)
        self.timeout = o.integer("timeout", 1) or 30
        self.page_size = o.integer("page_size", 1) or 100
        self.attempts, self.backoff = attempts, backoff
        self.session = requests.Session()
        self.session.headers.update({"X-Authentication": token, "Content-Type": "application/json"})
        # Passed on every request: a session's own `verify` loses to REQUESTS_CA_BUNDLE.
        self.verify: str | bool = self.cacert or True

    def __repr__(self) -> str:
        return f"OrchestratorBackend({self.api_url!r})"  # never the RBAC token

    def call(
        self, method: str, path: str, body: Any = None, attempts: int | None = None, **params: Any
    ) -> Any:
        """The orchestrator's JSON answer; RunError for a 4xx (its kind and msg) and after
        the retries for 5xx and network errors."""
        last = ""
        attempts = attempts or self.attempts
        for attempt in range(attempts):
            if attempt:
                delay = min(30.0, self.backoff * 2**attempt)
                time.sleep(random.uniform(delay / 2, delay))  # noqa: S311
            try:
                answer = self.session.request(
                    method,
                    f"{self.api_url}/{path}",
                    json=body,
                    params=params or None,
                    timeout=self.timeout,
                    verify=self.verify,
                )
            except requests.ConnectionError as exc:  # never reached it: safe to send again
                last = f"cannot reach the orchestrator: {exc}"
                logger.warning(
                    "orchestrator call failed; retrying", extra={"fields": {"call": path, "error": last}}
                )
                continue
            except requests.RequestException as exc:
                raise RunError(f"The orchestrator did not answer {method} {path}: {exc}") from None
            if answer.status_code >= 500:
                last = f"{answer.status_code} {answer.text[:200]}"
                logger.warning(
                    "orchestrator call failed; retrying", extra={"fields": {"call": path, "error": last}}
                )
                continue
            try:
                document = answer.json()
            except ValueError:
                document = None
            if answer.status_code >= 400:
                error = document if isinstance(document, dict) else {}
                msg = str(error.get("msg") or answer.text[:500] or f"HTTP {answer.status_code}")
                raise RunError(
                    f"The orchestrator refused {method} {path}: {msg}",
                    kind=error.get("kind", ""),
                    status=answer.status_code,
                    details=error.get("details"),
                )
            if document is None:
                raise RunError(f"The orchestrator's answer to {method} {path} is not JSON")
            return document
        raise RunError(f"The orchestrator could not be reached ({method} {path}): {last}")

    def deploy_body(self, run: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "environment": environment_of(run) or "production",
            "scope": _scope(run, SCOPES),
            "description": f"Relay run {run['id']}",
        }
        # noop or no_noop, never both: no_noop makes agents whose puppet.conf says noop enforce.
        body["noop" if run.get("noop") else "no_noop"] = True
        for flag in ("debug", "trace", "evaltrace"):
            if run.get(flag):
                body[flag] = True
        if self.concurrency:
            body["concurrency"] = self.concurrency
        return body

    def task_body(self, run: dict[str, Any]) -> dict[str, Any]:
        """`command/task` as the shipped agent sends it: the run's scope, task, params, noop
        and its Bolt target objects (PE's `targets`, for nodes reached through Bolt server)."""
        return {
            "environment": environment_of(run) or "production",
            "scope": _scope(run, TASK_SCOPES),
            "task": run.get("name"),
            "params": run.get("params") or {},
            "noop": bool(run.get("noop")),
            "targets": target_objects(run),
            "description": f"Relay run {run['id']}",
        }

    def start(self, run: dict[str, Any], workdir: Path) -> OrchestratorJob:
        kind = run.get("type") or "run"
        description = f"Relay run {run['id']}"
        if kind == "run":
            answer = self.call("POST", "command/deploy", self.deploy_body(run))
            return OrchestratorJob(self, _job_name(answer), plan=False)
        if kind == "task-run":
            answer = self.call("POST", "command/task", self.task_body(run))
            return OrchestratorJob(self, _job_name(answer), plan=False)
        if kind == "plan-run":
            body = {
                "plan_name": run.get("name"),
                "params": run.get("params") or {},
                "environment": environment_of(run) or "production",
                "description": description,
            }
            answer = self.call("POST", "command/plan_run", body)
            name = answer.get("name") if isinstance(answer, dict) else None
            if not isinstance(name, str) or not name:
                raise RunError("The orchestrator's answer to the plan run names no job.")
            return OrchestratorJob(self, name, plan=True)
        raise RunError(f"The orchestrator backend cannot do runs of type {kind}.")

    def attach(self, handle: dict[str, Any], workdir: Path) -> OrchestratorJob:
        """The job of a run this bridge held before it restarted: it lives in PE."""
        if handle.get("kind") != "orchestrator" or not handle.get("job"):
            raise RunError("The bridge's record of this run's orchestrator job is unreadable.")
        return OrchestratorJob(self, str(handle["job"]), bool(handle.get("plan")))


def _scope(run: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, Any]:
    """The run's scope for the orchestrator: exactly one of `kinds`, nodes as certnames."""
    scope = scope_of(run)
    present = [k for k in kinds if k in scope]
    if len(present) != 1 or set(scope) - set(kinds):
        raise RunError(f"The run's scope must have exactly one of {', '.join(kinds)}.")
    value = scope[present[0]]
    if present[0] == "nodes":
        if not isinstance(value, list) or not value:
            raise RunError("The run names no nodes.")
        value = check_certnames(value)
    return {present[0]: value}


def _job_name(answer: Any) -> str:
    job = answer.get("job") if isinstance(answer, dict) else None
    name = job.get("name") if isinstance(job, dict) else None
    if not isinstance(name, str) or not name:
        raise RunError("The orchestrator's answer names no job.")
    return name


class OrchestratorJob:
    def __init__(self, backend: OrchestratorBackend, name: str, plan: bool) -> None:
        self.backend, self.job_id, self.plan = backend, name, plan
        self.state = "new"
        self.document: dict[str, Any] = {}
        self.nodes: list[Any] = []
        self.stop_requested = False
        self._wake = threading.Event()
        self._done = False

    def handle(self) -> dict[str, Any]:
        return {"kind": "orchestrator", "job": self.job_id, "plan": self.plan}

    def wait(self, timeout: float) -> bool:
        """Sleep one heartbeat, then ask the orchestrator how the job is."""
        if self._done:
            return True
        self._wake.wait(timeout)
        self._wake.clear()
        try:
            self._poll()
        except RunError as exc:
            logger.warning(
                "could not poll the orchestrator job",
                extra={"fields": {"job": self.job_id, "error": str(exc)}},
            )
        return self._done

    def _poll(self) -> None:
        path = f"plan_jobs/{self.job_id}" if self.plan else f"jobs/{self.job_id}"
        document = self.backend.call("GET", path, attempts=2)
        self.document = document if isinstance(document, dict) else {}
        self.state = str(self.document.get("state", "unknown"))
        if self.state in (PLAN_FINAL if self.plan else FINAL):
            if not self.plan:
                self.nodes = self._all_nodes()
            self._done = True

    def _all_nodes(self) -> list[Any]:
        items: list[Any] = []
        size = self.backend.page_size
        while True:
            page = self.backend.call("GET", f"jobs/{self.job_id}/nodes", limit=size, offset=len(items))
            batch = page.get("items") if isinstance(page, dict) else None
            if not isinstance(batch, list):
                raise RunError("The orchestrator's node list has no items.")
            items += batch
            total = (page.get("pagination") or {}).get("total") if isinstance(page, dict) else None
            if (
                not batch
                or (isinstance(total, int) and len(items) >= total)
                or (total is None and len(batch) < size)
            ):
                return items

    def stop(self) -> None:
        self.stop_requested = True
        try:
            if self.plan:
                self.backend.call("POST", "command/stop_plan", {"plan_job": self.job_id})
            else:
                self.backend.call("POST", "command/stop", {"job": self.job_id})
        except RunError as exc:
            logger.warning(
                "could not stop the orchestrator job",
                extra={"fields": {"job": self.job_id, "error": str(exc)}},
            )
        self._wake.set()

    def result(self) -> tuple[str, Any]:
        if self.plan:
            outcome = "success" if self.state == "success" else "failure"
            return outcome, {
                "plan_job": self.job_id,
                "state": self.state,
                "result": self.document.get("result"),
            }
        results: dict[str, Any] = {"job": {"name": self.job_id, "state": self.state}, "nodes": self.nodes}
        if self.state == "finished":
            return "finished", results
        if self.state == "stopped":
            results["result"] = {"msg": f"The orchestrator job {self.job_id} was stopped."}
        return "failed", results
