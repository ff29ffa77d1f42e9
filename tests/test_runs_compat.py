"""The service against clients that behave like the real ones, over real HTTP.

RubyAgentLike does what puppetlabs-relay 2.5.x's `puppet relay` agent does (contract §1):
Bearer token, JSON bodies, Net::HTTP's `Accept: */*`; keeps only listed runs whose
state.status is pending; counts an accept as won only on 202; PUTs `pending` once right
after accepting; reports in-progress with the orchestrator job *name* and
next_update_before = now + 3 x 15 s; echoes updated_at back; takes every PUT answer's
body as the run's new state; and, like its State model, refuses to move to in-progress or
complete from any status but pending and in-progress (it raises, and the agent gives the
run up)."""

import json
from datetime import UTC, datetime, timedelta

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection


class RubyAgentLike:
    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/") + "/"
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "*/*", "User-Agent": "Ruby"}
        )
        self.states: dict[str, dict] = {}

    def _send(self, method: str, path: str, body: dict | None = None) -> requests.Response:
        data = json.dumps(body) if body is not None else ""
        return self.session.request(
            method, self.base + path, data=data, headers={"Content-Type": "application/json"}, timeout=10
        )

    def list_pending(self) -> list[dict]:
        response = self._send("GET", "_puppet/runs")
        assert response.status_code == 200
        runs = [r for r in response.json()["runs"] if r["state"]["status"] == "pending"]
        for run in runs:
            assert run["state"]["updated_at"]  # the agent reads it
            assert run.get("type", "run") in ("run", "task-run", "plan-run")
            self.states[run["id"]] = run["state"]
        return runs

    def accept(self, run_id: str) -> bool:
        return self._send("POST", f"_puppet/runs/{run_id}/accept").status_code == 202

    def put_state(self, run_id: str, state: dict) -> dict:
        previous = self.states.get(run_id, {})
        body = {**state, "updated_at": previous.get("updated_at")}  # echoed back, ignored
        response = self._send("PUT", f"_puppet/runs/{run_id}/state", body)
        assert response.status_code == 202, response.text
        self.states[run_id] = response.json()  # the answer is the new state
        return self.states[run_id]

    def move(self, run_id: str, status: str, **fields) -> dict:
        """State#to_in_progress and State#to_complete, then the PUT."""
        current = self.states[run_id]["status"]
        if current not in ("pending", "in-progress"):
            raise InvalidTransitionError(f"Cannot transition status to {status} from {current}")
        return self.put_state(run_id, {"status": status, **fields})


class InvalidTransitionError(Exception):
    pass


def due_in(seconds: int) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def token(transactional_db) -> str:
    owner = User.objects.create_user("alice")
    return str(PuppetConnection.create_with_token(owner=owner, name="prod")[1])


def test_a_ruby_agent_like_client_works_a_run_from_list_to_complete(live_server, token):
    step = requests.Session()
    step.headers["Authorization"] = f"Bearer {token}"
    created = step.post(
        f"{live_server.url}/_puppet/runs",
        json={"environment": "production", "scope": {"nodes": ["node-a.example.com"]}},
        timeout=10,
    )
    assert created.status_code == 201
    run_id = created.json()["id"]

    agent, rival = RubyAgentLike(live_server.url, token), RubyAgentLike(live_server.url, token)
    [listed] = agent.list_pending()
    assert (listed["id"], listed["environment"], listed["scope"]) == (
        run_id,
        "production",
        {"nodes": ["node-a.example.com"]},
    )
    for field in ("noop", "debug", "trace", "evaltrace"):
        assert listed[field] is False
    assert agent.accept(run_id)
    assert not rival.accept(run_id)  # 409: "someone else has it"
    # Accepted, the run is offered to nobody any more (its own body still shows `pending`
    # until it is in progress): the agent would start a job for any run listed `pending`,
    # its own included (issue 18 §1). Before, it was listed and the rival refused the accept.
    assert rival.list_pending() == [] and agent.list_pending() == []
    assert not rival.accept(run_id)

    assert agent.put_state(run_id, {"status": "pending"})["status"] == "pending"
    state = agent.put_state(
        run_id, {"status": "in-progress", "job_id": "1234", "next_update_before": due_in(45)}
    )
    assert state["status"] == "in-progress" and state["job_id"] == "1234"
    for _ in range(2):  # heartbeats
        state = agent.put_state(
            run_id, {"status": "in-progress", "job_id": "1234", "next_update_before": due_in(45)}
        )
        assert state["status"] == "in-progress"
    results = [
        {
            "name": "node-a.example.com",
            "state": "finished",
            "start_timestamp": "2026-11-21T10:00:00Z",
            "finish_timestamp": "2026-11-21T10:00:30Z",
            "duration": 30.1,
            "transaction_uuid": "b0b5f1c8-3f4b-4c7a-9a0e-2f6e0c0a1b2c",
            "details": {"message": "Finished puppet run on node-a.example.com - Success!"},
            "result": {"metrics": {"resources": {"changed": 1}}},
        }
    ]
    final = agent.put_state(
        run_id, {"status": "complete", "job_id": "1234", "outcome": "finished", "run_results": results}
    )
    assert (
        final["status"] == "complete" and final["outcome"] == "finished" and final["run_results"] == results
    )
    assert None not in final.values()  # nulls are left out

    seen_by_step = step.get(f"{live_server.url}/_puppet/runs/{run_id}", timeout=10).json()
    assert seen_by_step["state"] == final


@pytest.mark.parametrize("outcome", ["failed", "error"])
def test_the_agent_s_failure_outcomes_and_error_results_are_kept(live_server, token, outcome):
    agent = RubyAgentLike(live_server.url, token)
    run_id = requests.post(
        f"{live_server.url}/_puppet/runs",
        json={"scope": {"nodes": ["a"]}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["id"]
    assert agent.accept(run_id)
    error = {"result": {"msg": "puppetlabs.orchestrator/unknown-environment: no such environment"}}
    state = agent.put_state(run_id, {"status": "complete", "outcome": outcome, "run_results": error})
    assert (state["outcome"], state["run_results"]) == (outcome, error)


def test_plan_runs_complete_with_success_or_failure(live_server, token):
    agent = RubyAgentLike(live_server.url, token)
    run = requests.post(
        f"{live_server.url}/_puppet/runs",
        json={
            "type": "plan-run",
            "name": "deploy::app",
            "params": {"version": "1.2"},
            "environment": "production",
        },
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()
    [listed] = agent.list_pending()
    assert (listed["type"], listed["name"], listed["params"]) == (
        "plan-run",
        "deploy::app",
        {"version": "1.2"},
    )
    assert agent.accept(run["id"])
    assert (
        agent.put_state(run["id"], {"status": "complete", "outcome": "success", "run_results": {"value": 1}})[
            "outcome"
        ]
        == "success"
    )


def test_the_rfc_example_bodies(live_server, token):
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{live_server.url}/_puppet/runs"
    # "POST /_puppet/runs" request, as printed in the RFC.
    rfc_request = {
        "environment": "staging",
        "scope": {"nodes": ["node-a.example.com", "node-b.example.com"]},
        "noop": False,
        "debug": False,
        "trace": False,
        "evaltrace": False,
    }
    created = requests.post(base, json=rfc_request, headers=headers, timeout=10)
    assert created.status_code == 201 and "id" in created.json()
    run_id = created.json()["id"]
    # "GET /_puppet/runs" response shape.
    listed = requests.get(base, headers=headers, timeout=10).json()
    assert listed["runs"][0]["state"]["status"] == "pending"
    assert {"id", "state", "environment", "scope"} <= set(listed["runs"][0])
    # "POST .../accept": 202 exactly once, then 409.
    assert requests.post(f"{base}/{run_id}/accept", headers=headers, timeout=10).status_code == 202
    assert requests.post(f"{base}/{run_id}/accept", headers=headers, timeout=10).status_code == 409
    # "PUT .../state" in-progress and complete, as printed (with a next_update_before that
    # is in the future today; the RFC's own example time is in 2020).
    job = "https://orchestrator.example.com:8143/orchestrator/v1/jobs/1234"
    progress = requests.put(
        f"{base}/{run_id}/state",
        json={"status": "in-progress", "job_id": job, "next_update_before": due_in(300)},
        headers=headers,
        timeout=10,
    )
    assert progress.status_code == 202 and progress.json()["job_id"] == job
    done = requests.put(
        f"{base}/{run_id}/state",
        json={"status": "complete", "job_id": job, "outcome": "finished"},
        headers=headers,
        timeout=10,
    )
    assert done.status_code == 202 and done.json()["outcome"] == "finished"
    detail = requests.get(f"{base}/{run_id}", headers=headers, timeout=10).json()
    assert detail["state"]["status"] == "complete" and detail["state"]["job_id"] == job


def test_basic_auth_works_over_http_too(live_server, token):
    response = requests.get(f"{live_server.url}/_puppet/runs", auth=("any", token), timeout=10)
    assert response.json() == {"runs": []}


def test_the_agent_s_run_survives_a_failing_backend(live_server, token):
    """The agent's Exec job: when its backend raises, it PUTs the state it has (`pending`, as
    listed) and takes the answer as its state; its next try moves on from that state. An
    `accepted` there would make every later transition raise, and the run would be stuck."""
    run_id = requests.post(
        f"{live_server.url}/_puppet/runs",
        json={"environment": "production", "scope": {"nodes": ["node-a.example.com"]}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["id"]
    agent = RubyAgentLike(live_server.url, token)
    agent.list_pending()
    assert agent.accept(run_id)
    for _ in range(2):  # the backend fails twice; each time the state it holds is PUT
        assert agent.put_state(run_id, {"status": agent.states[run_id]["status"]})["status"] == "pending"
    error = {"result": {"msg": "Retries exhausted"}}
    final = agent.move(run_id, "complete", outcome="error", run_results=error)
    assert (final["status"], final["outcome"], final["run_results"]) == ("complete", "error", error)


def test_the_run_start_step_waits_until_the_run_is_in_progress(live_server, token):
    """relay-puppet's run-start step: `while run['state']['status'] == 'pending'` it GETs the
    run again; then it reads `job_id`. An accepted run must still be `pending` to it."""
    headers = {"Authorization": f"Bearer {token}"}
    run = requests.post(
        f"{live_server.url}/_puppet/runs",
        json={"environment": "production", "scope": {"nodes": ["node-a.example.com"]}},
        headers=headers,
        timeout=10,
    ).json()

    def step_sees() -> dict:
        return requests.get(f"{live_server.url}/_puppet/runs/{run['id']}", headers=headers, timeout=10).json()

    agent = RubyAgentLike(live_server.url, token)
    agent.list_pending()
    assert agent.accept(run["id"])
    agent.put_state(run["id"], {"status": "pending"})
    assert step_sees()["state"]["status"] == "pending"  # still waiting: no job yet
    agent.move(run["id"], "in-progress", job_id="81", next_update_before=due_in(45))
    state = step_sees()["state"]
    assert (state["status"], state["job_id"]) == ("in-progress", "81")
