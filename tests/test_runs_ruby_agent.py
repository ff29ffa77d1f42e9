"""The shipped Ruby agent's loop (tests/ruby_agent.py, a model of puppetlabs-relay 2.5.1's
`puppet relay`) against a live server, at 100 times its speed (poll 0.3 s, tick 0.15 s),
with the PE orchestrator stand-in as its backend (issue 18 §1).

The slow start: the orchestrator answers 503 to the first deploys, so a run stays accepted
but not in progress for several ticks (the agent PUTs `pending` after each failure, and
retries). Were the list to show such a run `pending`, the agent would start a second job
for it: a second deploy, its run directory deleted under the first job, and in the end a
409 on a PUT, which ends the agent."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition, Status
from tests.ruby_agent import (
    Agent,
    Backend,
    InvalidDefinitionError,
    MissingNameError,
    MissingScopeError,
    Orchestrator,
    OrchestratorAPI,
    RelayAPI,
)

SPEED = 100  # poll every 0.3 s, tick every 0.15 s
POLL = 30 / SPEED


@pytest.fixture
def token(transactional_db) -> str:
    owner = User.objects.create_user("alice")
    return str(PuppetConnection.create_with_token(owner=owner, name="prod")[1])


def create_runs(url: str, token: str, count: int) -> list[str]:
    step = requests.Session()
    step.headers["Authorization"] = f"Bearer {token}"
    ids = []
    for i in range(count):
        body = {"environment": "production", "scope": {"nodes": [f"node-{i}.example.com"]}}
        created = step.post(f"{url}/_puppet/runs", json=body, timeout=10)
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    return ids


def wait_until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize(("runs", "unavailable"), [(1, 3), (3, 9)])
def test_a_slow_starting_backend_gets_one_job_per_run(live_server, token, pe, tmp_path, runs, unavailable):
    # The first deploys are refused, "Try again later": three for each run at most, the
    # agent's retries (round robin: every run's job starts in the same poll).
    pe.fail_next = [503] * unavailable
    pe.script = ["running", "running", "finished"]
    ids = create_runs(live_server.url, token, runs)
    backend = Orchestrator(OrchestratorAPI(pe.url, pe.token, pe.ca))
    agent = Agent(live_server.url, token, backend, tmp_path / "relay", speed=SPEED)
    thread = agent.start()
    try:
        done = wait_until(lambda: Run.objects.filter(pk__in=ids, status=Status.COMPLETE).count() == runs, 15)
        # A few more polls: nothing is offered, or started, again.
        time.sleep(3 * POLL)
    finally:
        agent.stopping.set()
        thread.join(10)

    assert agent.exited is None, repr(agent.exited)  # the agent never exits
    assert done
    # A pending PUT after each 503 went through as a heartbeat: the slow start happened.
    pending_puts = [body for _, body, _ in agent.api.puts if body["status"] == "pending"]
    assert len(pending_puts) >= unavailable
    assert all(code == 202 for _, _, code in agent.api.puts)
    for run_id in ids:
        assert agent.jobs_started[run_id] == 1
        assert agent.api.accepts[run_id] == 1
        assert agent.completed[run_id] == 1
        run = Run.objects.get(pk=run_id)
        assert run.outcome == "finished", run.run_results
        assert RunTransition.objects.filter(run_id=run_id, to_status=Status.COMPLETE).count() == 1
    deploys = [s for s in pe.seen if s["method"] == "POST" and s["path"].endswith("/command/deploy")]
    assert len(deploys) == runs + unavailable  # each run's one deploy, and the refused ones
    assert len(pe.jobs) == runs
    assert sorted(j.body["scope"]["nodes"][0] for j in pe.jobs.values()) == sorted(
        f"node-{i}.example.com" for i in range(runs)
    )


class CannedRelay:
    """A server that answers GET _puppet/runs with a fixed list (and nothing else): the
    model's own behaviour on lists the service would not send today."""

    def __init__(self, runs: list[dict]) -> None:
        body = json.dumps({"runs": runs}).encode()
        self.lists = 0
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                canned.lists += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


PENDING = {"status": "pending", "updated_at": "2026-11-26T10:00:00.123456Z"}


@pytest.mark.parametrize(
    ("run", "error"),
    [
        ({"type": "task-run", "name": "package", "targets": ["a"]}, MissingScopeError),
        ({"type": "task-run", "scope": {"nodes": ["a"]}}, MissingNameError),
        ({"type": "run"}, MissingScopeError),
        ({"scope": {"nodes": ["a"], "query": "x"}}, InvalidDefinitionError),
    ],
)
def test_the_model_exits_on_a_run_it_cannot_read_as_the_agent_does(tmp_path, run, error):
    """Dispatch rescues only Net::HTTPError: a model error ends `puppet relay`, at the
    first poll, before any accept."""
    relay = CannedRelay([{"id": "8e659097-254a-4b27-bb93-88efea9a9f0e", "state": PENDING, **run}])
    agent = Agent(relay.url, "rlyp_x", Backend(), tmp_path / "relay", speed=SPEED)
    try:
        agent.run()  # returns when the agent exits
    finally:
        relay.stop()
    assert isinstance(agent.exited, error)
    assert relay.lists == 1 and not agent.api.accepts and not agent.jobs_started


def test_the_model_keeps_only_pending_runs_and_drops_unknown_types(tmp_path):
    runs = [
        {"id": "r1", "state": {**PENDING, "status": "in-progress"}, "scope": {"nodes": ["a"]}},
        {"id": "r2", "type": "workflow", "state": PENDING},
        {"id": "r3", "type": "plan-run", "name": "deploy", "state": PENDING},
    ]
    relay = CannedRelay(runs)
    try:
        listed = RelayAPI(relay.url, "rlyp_x").get_runs()
    finally:
        relay.stop()
    assert [(type(r).__name__, r.id, r.state.status) for r in listed] == [
        ("Run", "r1", "in_progress"),
        ("PlanRun", "r3", "pending"),
    ]
    assert listed[1].fields["environment"] == "production"  # Puppet[:environment]


def test_an_agent_restarted_while_it_starts_a_run_takes_it_back_by_its_stamp(
    live_server, token, pe, tmp_path, settings
):
    """The agent exits on any error listing runs (a 502 during a deploy of the service), and
    its unit starts it again. An accepted run whose bridge has been silent for
    RUN_REOFFER_AFTER is listed `pending` to it again, and it takes the run back by its stamp
    file, with no second accept; a live agent, which PUTs at every tick, is never offered one
    (the slow-start test above runs with the default, 90 s). Our own bridge is never offered
    such a run: it knows its runs from its state_dir."""
    settings.RUN_REOFFER_AFTER = 1
    pe.fail_next = [503]  # the first agent dies while its run is accepted, not started
    pe.script = ["running", "finished"]
    [run_id] = create_runs(live_server.url, token, 1)
    backend = Orchestrator(OrchestratorAPI(pe.url, pe.token, pe.ca))
    first = Agent(live_server.url, token, backend, tmp_path / "relay", speed=SPEED)
    thread = first.start()
    try:
        assert wait_until(lambda: any(body["status"] == "pending" for _, body, _ in first.api.puts), 10)
    finally:
        first.stopping.set()
        thread.join(10)
    assert Run.objects.get(pk=run_id).status == Status.ACCEPTED
    listed = session_list(live_server.url, token)
    assert listed == []  # silent for less than RUN_REOFFER_AFTER: nobody is offered it
    time.sleep(1.2)
    assert [r["id"] for r in session_list(live_server.url, token)] == [run_id]
    assert session_list(live_server.url, token, **{"X-Relay-Backend": "orchestrator"}) == []

    second = Agent(live_server.url, token, backend, tmp_path / "relay", speed=SPEED)
    thread = second.start()
    try:
        assert wait_until(lambda: Run.objects.get(pk=run_id).status == Status.COMPLETE, 15)
    finally:
        second.stopping.set()
        thread.join(10)
    assert second.exited is None, repr(second.exited)
    assert second.api.accepts[run_id] == 0  # its stamp file said it had accepted it
    assert second.jobs_started[run_id] == 1 and second.completed[run_id] == 1
    assert Run.objects.get(pk=run_id).outcome == "finished"
    assert RunTransition.objects.filter(run_id=run_id, to_status=Status.ACCEPTED).count() == 1


def session_list(url: str, token: str, **headers: str) -> list[dict]:
    answer = requests.get(
        f"{url}/_puppet/runs", headers={"Authorization": f"Bearer {token}", **headers}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["runs"]


def test_the_agent_runs_a_published_task_run_and_a_plan_run_without_an_environment(
    live_server, token, pe, tmp_path
):
    """What the published task-run-start and plan-run-start POST (with `environment: null`,
    as they send when their spec has none) is read by the agent and sent to the orchestrator
    as its own code sends it: command/task with the scope, command/plan_run; the environment
    is the agent's Puppet[:environment]."""
    client = requests.Session()
    client.headers["Authorization"] = f"Bearer {token}"
    bodies = [
        {
            "type": "task-run",
            "environment": None,
            "scope": {"nodes": ["web1.example.com"]},
            "name": "package",
            "params": {"name": "nginx", "action": "status"},
            "noop": False,
            "targets": [],
        },
        {"type": "plan-run", "environment": None, "name": "app::deploy", "params": {"version": "2"}},
    ]
    ids = []
    for body in bodies:
        created = client.post(f"{live_server.url}/_puppet/runs", json=body, timeout=10)
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    pe.script = ["running", "finished"]  # a plan job ends `success` (the stand-in's plan states)
    backend = Orchestrator(OrchestratorAPI(pe.url, pe.token, pe.ca))
    agent = Agent(live_server.url, token, backend, tmp_path / "relay", speed=SPEED)
    thread = agent.start()
    try:
        done = wait_until(lambda: Run.objects.filter(pk__in=ids, status=Status.COMPLETE).count() == 2, 15)
    finally:
        agent.stopping.set()
        thread.join(10)
    assert agent.exited is None, repr(agent.exited)
    assert done
    task, plan = (Run.objects.get(pk=i) for i in ids)
    assert (task.outcome, plan.outcome) == ("finished", "success")
    [command] = [s for s in pe.seen if s["method"] == "POST" and s["path"].endswith("/command/task")]
    assert command["body"] == {
        "environment": "production",
        "scope": {"nodes": ["web1.example.com"]},
        "task": "package",
        "params": {"name": "nginx", "action": "status"},
        "noop": False,
        "targets": [],
    }
    [command] = [s for s in pe.seen if s["method"] == "POST" and s["path"].endswith("/command/plan_run")]
    assert command["body"] == {
        "environment": "production",
        "plan_name": "app::deploy",
        "params": {"version": "2"},
    }
