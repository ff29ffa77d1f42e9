"""The shipped Ruby agent's loop (tests/ruby_agent.py, a model of puppetlabs-relay 2.5.1's
`puppet relay`) against a live server, at 100 times its speed (poll 0.3 s, tick 0.15 s),
with the PE orchestrator stand-in as its backend (issue 18 §1).

The slow start: the orchestrator answers 503 to the first deploys, so a run stays accepted
but not in progress for several ticks (the agent PUTs `pending` after each failure, and
retries). Were the list to show such a run `pending`, the agent would start a second job
for it: a second deploy, its run directory deleted under the first job, and in the end a
409 on a PUT, which ends the agent."""

import time
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition, Status
from tests.ruby_agent import Agent, Orchestrator, OrchestratorAPI
from tests.standins.orchestrator import Orchestrator as OrchestratorStandIn

SPEED = 100  # poll every 0.3 s, tick every 0.15 s
POLL = 30 / SPEED


@pytest.fixture
def token(transactional_db) -> str:
    owner = User.objects.create_user("alice")
    return str(PuppetConnection.create_with_token(owner=owner, name="prod")[1])


@pytest.fixture
def pe(tmp_path: Path):
    standin = OrchestratorStandIn(tmp_path / "pe")
    yield standin
    standin.stop()


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
