"""A model, in Python, of the shipped Ruby agent's loop: `puppet relay` of puppetlabs-relay
2.5.1 (lib/puppet/application/relay.rb, lib/puppet_x/relay/agent/{job,model}/*.rb,
lib/puppet_x/relay/util/http/{client,relay_api}.rb, and Puppet's own Puppet::Scheduler).
Written from reading that source (contract §1); none of it is copied. Each class names the
Ruby it stands for, and follows it step by step, quirks included:

- Dispatch, every poll interval (30 s): GET `_puppet/runs`, turn every run into its model
  (Run, TaskRun or PlanRun by `type`; unknown types dropped), keep those whose
  `state.status` is `pending`, and add an Exec job for each. It remembers nothing else: a
  run listed `pending` twice gets two jobs. Only Net::HTTPError (a 1xx answer) is rescued;
  a 4xx or 5xx from `resp.value`, or a model error (MissingScopeError, ...) ends the loop.
- Exec, every tick (15 s), per run: takes its stamp file (`state_dir/<run id>/stamp`, whose
  mtime is the run's `updated_at`) as proof of an accept it made earlier, else POSTs the
  accept, which is won only on 202; lost, it disables itself, and its `ensure` deletes the
  run's state directory (even one another job of this process uses). Won: runs the
  backend, and in an `ensure` PUTs whatever state the run then has (`pending` again when
  the backend raised and retries are left), taking the answer's body as the new state.
  Anything the PUT raises (any non-2xx: `resp.value`) leaves the scheduler: the process ends.
- The scheduler (Puppet::Scheduler::Scheduler#run_loop) runs every ready job in turn, one
  thread; nothing in it rescues, so an exception ends `puppet relay`. Here that is
  `Agent.exited`, and the loop stops.

Time is compressed by `speed` for the waits only: the intervals stay 30 s and 15 s in what
goes on the wire (next_update_before = last run + 3 x 15 s), as the real agent's promises.
The Ruby writes times with Time#iso8601 (whole seconds), so a compressed promise would
land in the past; that is why only the waits are compressed."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

POLL_INTERVAL = 30  # relay.rb: work.add(dispatch, 30)
EXEC_INTERVAL = 15  # Dispatch's exec_interval default


# --- errors (agent/error.rb, the models' own, Net::HTTP's) ---------------------------------


class AgentError(Exception):
    """PuppetX::Relay::Agent::Error (a StandardError)."""


class MissingScopeError(AgentError):
    """Model::Run::MissingScopeError and Model::TaskRun::MissingScopeError."""


class MissingNameError(AgentError):
    pass


class MissingStatusError(AgentError):
    pass


class InvalidTransitionError(AgentError):
    pass


class InvalidDefinitionError(AgentError):
    """Scope.from_h: not exactly one item."""


class ScopeNotFoundError(AgentError):
    pass


class RubyNoMethodError(Exception):
    """Ruby's NoMethodError (nil.length: a scope that is null)."""


class NetHTTPException(Exception):
    """What Net::HTTPResponse#value raises for a non-2xx answer."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"{response.status_code} {response.reason}: {response.text[:300]}")
        self.response = response


class NetHTTPError(NetHTTPException):
    """Net::HTTPError: 1xx (the only one Dispatch rescues)."""


class NetHTTPRetriableError(NetHTTPException):
    """3xx."""


class NetHTTPClientException(NetHTTPException):
    """4xx (Net::HTTPServerException)."""


class NetHTTPFatalError(NetHTTPException):
    """5xx."""


class RubyNotImplementedError(Exception):
    """Ruby's NotImplementedError, a ScriptError (not a StandardError): Exec rescues it apart."""


def value(response: requests.Response) -> None:
    """Net::HTTPResponse#value: nothing for a 2xx, else the class's exception."""
    code = response.status_code
    if 200 <= code < 300:
        return
    kind = {1: NetHTTPError, 3: NetHTTPRetriableError, 4: NetHTTPClientException}.get(code // 100)
    raise (kind or NetHTTPFatalError)(response)


# --- models (agent/model/*.rb) --------------------------------------------------------------


def _time(text: str) -> datetime:
    """Time.iso8601."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _iso8601(moment: datetime) -> str:
    """Time#utc.iso8601: whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class State:
    """Model::State: every key of the hash becomes an attribute; to_h writes six back."""

    def __init__(self, opts: dict[str, Any]) -> None:
        if "status" not in opts:
            raise MissingStatusError()
        self.values = dict(opts)

    @classmethod
    def from_h(cls, hsh: dict[str, Any]) -> State:
        hsh = dict(hsh)
        hsh["status"] = hsh["status"].replace("-", "_")
        if "next_update_before" in hsh:
            hsh["next_update_before"] = _time(hsh["next_update_before"])
        if "updated_at" in hsh:
            hsh["updated_at"] = _time(hsh["updated_at"])
        return cls(hsh)

    @property
    def status(self) -> str:  # :pending, :in_progress, :complete (a symbol in Ruby)
        return self.values["status"]

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def _with(self, **changes: Any) -> State:
        return State({**self.values, **changes})

    def to_complete(self, outcome: str | None = None, run_results: Any = None) -> State:
        if self.status not in ("pending", "in_progress"):
            raise InvalidTransitionError(f"Cannot transition status to complete from {self.status}")
        return self._with(
            status="complete", outcome=outcome, run_results=run_results, next_update_before=None
        )

    def to_in_progress(self, next_update_before: datetime, job_id: str | None = None) -> State:
        if self.status not in ("pending", "in_progress"):
            raise InvalidTransitionError(f"Cannot transition status to in-progress from {self.status}")
        changes: dict[str, Any] = {"status": "in_progress", "next_update_before": next_update_before}
        if job_id:
            changes["job_id"] = job_id
        return self._with(**changes)

    def to_h(self) -> dict[str, Any]:
        nub, updated = self.get("next_update_before"), self.get("updated_at")
        doc = {
            "status": self.status.replace("_", "-"),
            "outcome": self.get("outcome"),
            "run_results": self.get("run_results"),
            "job_id": self.get("job_id"),
            "next_update_before": _iso8601(nub) if nub is not None else None,
            "updated_at": _iso8601(updated) if updated is not None else None,
        }
        return {k: v for k, v in doc.items() if v is not None}


class Scope:
    """Model::Scope.from_h: exactly one of nodes, application, query, node_group."""

    KEYS = ("nodes", "application", "query", "node_group")

    def __init__(self, key: str, value: Any) -> None:
        self.key, self.value = key, value

    @classmethod
    def from_h(cls, hsh: Any) -> Scope:
        if not isinstance(hsh, dict):
            raise RubyNoMethodError(f"undefined method `length' for {hsh!r}")
        if len(hsh) != 1:
            raise InvalidDefinitionError("Scope must have exactly one item")
        [(key, value)] = hsh.items()
        if key not in cls.KEYS:
            raise ScopeNotFoundError(f"Scope {key!r} does not exist")
        return cls(key, value)


class Stateful:
    """Model::Stateful, with each run type's defaults and the errors its constructor raises."""

    DEFAULTS: dict[str, Any] = {}
    NEEDS: tuple[tuple[str, type[Exception]], ...] = ()
    kind = "run"

    def __init__(self, opts: dict[str, Any]) -> None:
        opts = {**self.DEFAULTS, **opts}
        for key, error in self.NEEDS:
            if key not in opts:
                raise error()
        self.fields = opts

    @classmethod
    def from_h(cls, hsh: dict[str, Any]) -> Stateful:
        hsh = dict(hsh)
        if "scope" in hsh and cls is not PlanRun:
            hsh["scope"] = Scope.from_h(hsh["scope"])
        if "state" in hsh:
            hsh["state"] = State.from_h(hsh["state"])
        return cls(hsh)

    @property
    def id(self) -> str:
        return self.fields["id"]

    @property
    def state(self) -> State:
        return self.fields["state"]

    def with_state(self, state: State) -> Stateful:
        copy = type(self).__new__(type(self))
        copy.fields = {**self.fields, "state": state}
        return copy


class Run(Stateful):
    DEFAULTS = {
        "environment": "production",
        "noop": False,
        "debug": False,
        "trace": False,
        "evaltrace": False,
    }
    NEEDS = (("scope", MissingScopeError),)


class TaskRun(Stateful):
    DEFAULTS = {"environment": "production", "params": {}, "noop": False, "targets": []}
    NEEDS = (("scope", MissingScopeError), ("name", MissingNameError))
    kind = "task-run"


class PlanRun(Stateful):
    DEFAULTS = {"environment": "production", "params": {}}
    NEEDS = (("name", MissingNameError),)
    kind = "plan-run"


# --- the Relay API (util/http/client.rb, relay_api.rb) --------------------------------------


class RelayAPI:
    """Util::HTTP::RelayAPI: one Net::HTTP request per call, `Content-Type: application/json`,
    the body `to_json` when there is one, `Authorization: Bearer`. The counters are the
    test's, not the agent's."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base = base_url.rstrip("/") + "/"
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "*/*", "User-Agent": "Ruby"}
        )
        self.accepts: Counter[str] = Counter()
        self.puts: list[tuple[str, dict[str, Any], int]] = []

    def _request(self, verb: str, path: str, body: Any = None) -> requests.Response:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"}
        return self.session.request(verb, self.base + path, data=data, headers=headers, timeout=30)

    def get_runs(self) -> list[Stateful]:
        response = self._request("GET", "_puppet/runs")
        value(response)
        models = {"run": Run, None: Run, "task-run": TaskRun, "plan-run": PlanRun}
        return [models[r.get("type")].from_h(r) for r in response.json()["runs"] if r.get("type") in models]

    def put_run_state(self, run: Stateful) -> Stateful:
        body = run.state.to_h()
        response = self._request("PUT", f"_puppet/runs/{run.id}/state", body)
        self.puts.append((run.id, body, response.status_code))
        value(response)
        return run.with_state(State.from_h(response.json()))

    def post_accept_run(self, run: Stateful) -> bool:
        self.accepts[run.id] += 1
        return self._request("POST", f"_puppet/runs/{run.id}/accept").status_code == 202


# --- the scheduler (Puppet::Scheduler::Job and Scheduler) -----------------------------------


class Job:
    """Puppet::Scheduler::Job: ready when never run or its interval has passed."""

    def __init__(self, interval: float, handler: Callable[[Job], None]) -> None:
        self.run_interval = interval  # in real (compressed) seconds
        self.last_run: float | None = None  # monotonic
        self.last_run_wall: datetime | None = None
        self.first_run_wall: datetime | None = None
        self.handler = handler
        self.enabled = True

    def ready(self, now: float) -> bool:
        return self.last_run is None or self.last_run + self.run_interval <= now

    def interval_to_next_from(self, now: float) -> float:
        return 0 if self.ready(now) else self.run_interval - (now - self.last_run)  # type: ignore[operator]

    def run(self, now: float, wall: datetime) -> None:
        self.last_run, self.last_run_wall = now, wall
        self.first_run_wall = self.first_run_wall or wall
        self.handler(self)

    def disable(self) -> None:
        self.enabled = False


class Schedule:
    """Job::Schedule.from_scheduler_job: next_update_before = last run + 3 x interval, with
    the agent's own interval (15 s), not the compressed wait."""

    def __init__(self, job: Job, agent_interval: float) -> None:
        assert job.last_run_wall is not None
        self.last_run_at = job.last_run_wall
        self.interval = agent_interval

    @property
    def next_update_before(self) -> datetime:
        return self.last_run_at + timedelta(seconds=self.interval * 3)


class Backend:
    """Backend::Base: exec(run, state_dir, schedule) returns the run with its new state."""

    def exec(self, run: Stateful, state_dir: Path, schedule: Schedule) -> Stateful:
        raise RubyNotImplementedError()


class OrchestratorAPI:
    """Util::HTTP::PE: `X-Authentication: <token>`, TLS with the Puppet CA."""

    def __init__(self, base_url: str, token: str, ca: Path) -> None:
        self.base = base_url.rstrip("/") + "/"
        self.ca = str(ca)  # per request: a Session's own `verify` loses to REQUESTS_CA_BUNDLE
        self.session = requests.Session()
        self.session.headers.update({"X-Authentication": token, "Content-Type": "application/json"})

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        data = json.dumps(body, default=_scope_json)
        return self.session.post(self.base + path, data=data, timeout=30, verify=self.ca)

    def get(self, path: str) -> requests.Response:
        return self.session.get(self.base + path, timeout=30, verify=self.ca)


def _scope_json(value: Any) -> Any:
    if isinstance(value, Scope):  # Scope#to_json
        return {value.key: value.value}
    raise TypeError(value)


class Orchestrator(Backend):
    """Backend::Orchestrator: a pending run starts a job (command/deploy, command/task,
    command/plan_run), any other is checked. A 4xx completes the run `error`; a 5xx (and
    every other Net::HTTP error) is raised again, for Exec's retries."""

    def __init__(self, api: OrchestratorAPI) -> None:
        self.api = api

    def exec(self, run: Stateful, state_dir: Path, schedule: Schedule) -> Stateful:
        try:
            if run.state.status == "pending":
                start = {Run: self._deploy, TaskRun: self._task, PlanRun: self._plan_run}[type(run)]
                return start(run, schedule)
            return self._check(run, schedule, plan=isinstance(run, PlanRun))
        except NetHTTPClientException as exc:
            try:
                result = exc.response.json()
            except ValueError:
                result = {"msg": exc.response.text}
            return run.with_state(run.state.to_complete(outcome="error", run_results={"result": result}))

    def _started(
        self, run: Stateful, schedule: Schedule, response: requests.Response, plan: bool
    ) -> Stateful:
        value(response)
        data = response.json()
        job_id = data["name"] if plan else data["job"]["name"]
        return run.with_state(run.state.to_in_progress(schedule.next_update_before, job_id=job_id))

    def _deploy(self, run: Stateful, schedule: Schedule) -> Stateful:
        f = run.fields
        body = {k: f[k] for k in ("environment", "scope", "debug", "trace", "evaltrace")}
        body["noop" if f["noop"] else "no_noop"] = True
        return self._started(run, schedule, self.api.post("command/deploy", body), plan=False)

    def _task(self, run: Stateful, schedule: Schedule) -> Stateful:
        f = run.fields
        body = {"environment": f["environment"], "scope": f["scope"], "task": f["name"]}
        body.update(params=f["params"], noop=f["noop"], targets=f["targets"])
        return self._started(run, schedule, self.api.post("command/task", body), plan=False)

    def _plan_run(self, run: Stateful, schedule: Schedule) -> Stateful:
        f = run.fields
        body = {"environment": f["environment"], "plan_name": f["name"], "params": f["params"]}
        return self._started(run, schedule, self.api.post("command/plan_run", body), plan=True)

    def _check(self, run: Stateful, schedule: Schedule, plan: bool) -> Stateful:
        job_id = run.state.get("job_id")
        response = self.api.get(f"plan_jobs/{job_id}" if plan else f"jobs/{job_id}")
        value(response)
        data = response.json()
        if data["state"] in (("success", "failure") if plan else ("finished", "failed")):
            if plan:
                keys = ("owner", "options", "timestamp", "created_timestamp", "finished_timestamp", "result")
                results = {k: data[k] for k in keys if k in data}
            else:
                nodes = self.api.get(f"jobs/{job_id}/nodes")
                value(nodes)
                keys = (
                    "node_count",
                    "owner",
                    "options",
                    "timestamp",
                    "started_timestamp",
                    "finished_timestamp",
                )
                results = {k: data[k] for k in keys if k in data}
                results["nodes"] = nodes.json()["items"]
            return run.with_state(run.state.to_complete(outcome=data["state"], run_results=results))
        return run.with_state(run.state.to_in_progress(schedule.next_update_before))


# --- the jobs (job/dispatch.rb, job/exec.rb) ------------------------------------------------


class Exec:
    """Job::Exec: one run, every tick, until it is complete."""

    def __init__(self, agent: Agent, run: Stateful, state_dir: Path) -> None:
        self.agent, self.run, self.state_dir = agent, run, state_dir
        self.accepted = False
        self.retries = 3

    def handle(self, job: Job) -> None:
        api = self.agent.api
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Puppet::Util::Pidlock on state_dir/state: its owner is this process, which every
        # job of this agent is, so it is always taken (and so never keeps two jobs apart).
        try:
            schedule = Schedule(job, self.agent.exec_interval)
            stamp = self.state_dir / "stamp"
            try:
                self.accepted = self.accepted or _mtime(stamp) <= self.run.state.get("updated_at")
            except FileNotFoundError:
                pass
            self.accepted = self.accepted or api.post_accept_run(self.run)
            if self.accepted:
                _touch(stamp, self.run.state.get("updated_at"))
            else:
                job.disable()  # "already being processed by another job, ignoring"
                return
            try:
                self.run = self.agent.backend.exec(self.run, self.state_dir, schedule)
            except RubyNotImplementedError as exc:
                msg = f"The backend does not support the configuration for run {self.run.id}: {exc}"
                self.run = self.run.with_state(
                    self.run.state.to_complete(outcome="error", run_results={"result": {"msg": msg}})
                )
            except Exception as exc:  # StandardError
                self.retries -= 1
                if self.retries < 0:
                    msg = f"Run {self.run.id} encountered an error during execution: {exc}"
                    self.run = self.run.with_state(
                        self.run.state.to_complete(outcome="error", run_results={"result": {"msg": msg}})
                    )
            finally:
                # In Ruby's `ensure`: whatever this raises leaves the job, and the scheduler.
                self.run = api.put_run_state(self.run)
                _touch(stamp, self.run.state.get("updated_at"))
            if self.run.state.status == "complete":
                self.agent.completed[self.run.id] += 1
                job.disable()
        finally:
            if not job.enabled:
                shutil.rmtree(self.state_dir, ignore_errors=True)  # remove_entry_secure(dir, true)


class Dispatch:
    """Job::Dispatch: list, and add a job for every run shown `pending`."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def handle(self, job: Job) -> None:
        try:
            runs = self.agent.api.get_runs()
        except NetHTTPError:  # the only rescue: "Failed to retrieve list of pending runs"
            return
        for run in runs:
            if run.state.status == "pending":
                self.agent.add_exec(run)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _mtime(path: Path) -> datetime:
    """File::Stat#mtime, to the microsecond (integers: a float would round 1.8e18 ns)."""
    return EPOCH + timedelta(microseconds=os.stat(path).st_mtime_ns // 1000)


def _touch(path: Path, moment: datetime | None) -> None:
    """Puppet::FileSystem.touch(path, mtime: moment)."""
    path.touch()
    if moment is not None:
        ns = (moment - EPOCH) // timedelta(microseconds=1) * 1000
        os.utime(path, ns=(ns, ns))


# --- the process (application/relay.rb#main) ------------------------------------------------


class Agent:
    """`puppet relay`: the scheduler's loop over Dispatch (every 30 s) and the Exec jobs
    (every 15 s), `speed` times faster. `run()` returns when stopped or when the real agent
    would have exited (`exited` then holds the exception)."""

    def __init__(
        self, base_url: str, token: str, backend: Backend, state_dir: Path, speed: float = 100.0
    ) -> None:
        self.api = RelayAPI(base_url, token)
        self.backend = backend
        self.state_dir = state_dir
        self.speed = speed
        self.exec_interval = EXEC_INTERVAL
        self.jobs: list[Job] = []
        self.stopping = threading.Event()
        self.exited: BaseException | None = None
        # The test's tallies: jobs started and completions seen, per run.
        self.jobs_started: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()

    def add_exec(self, run: Stateful) -> None:
        """Work#add: drop the disabled jobs, add the new one."""
        self.jobs = [j for j in self.jobs if j.enabled]
        self.jobs_started[run.id] += 1
        self.jobs.append(
            Job(self.exec_interval / self.speed, Exec(self, run, self.state_dir / run.id).handle)
        )

    def run(self) -> None:
        self.jobs.append(Job(POLL_INTERVAL / self.speed, Dispatch(self).handle))
        try:
            while not self.stopping.is_set() and any(j.enabled for j in self.jobs):
                now = time.monotonic()
                wait = min(j.interval_to_next_from(now) for j in self.jobs if j.enabled)
                if self.stopping.wait(wait):
                    return
                now, wall = time.monotonic(), datetime.now(UTC)
                for job in [j for j in self.jobs if j.enabled]:
                    if job.ready(now):
                        job.run(now, wall)
        except BaseException as exc:  # nothing in run_loop rescues: `puppet relay` ends
            self.exited = exc

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="ruby-agent-model", daemon=True)
        thread.start()
        return thread
