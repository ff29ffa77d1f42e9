"""The Puppet steps with a real bridge: `relay-bridge` (its SSH backend against the tests'
sshd, a stand-in `puppet` on the "nodes") and the bridge's PE orchestrator backend against
the orchestrator stand-in, working the runs the steps make, on a live server. The steps are
driven as the engine drives them (tests/step_helpers.py)."""

import threading

import pytest
from relay_bridge.api import RelayClient
from relay_bridge.backends.orchestrator import OrchestratorBackend
from relay_bridge.worker import RunWorker

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.bridge_helpers import Service, bridge_config, completed, in_progress, relay_bridge, wait_for
from tests.sshd import alive
from tests.standins.orchestrator import Orchestrator
from tests.step_helpers import Connection, Step
from workflows.steps.base import Wait

pytestmark = pytest.mark.django_db(transaction=True)

PUPPET = Connection("puppet", "prod")


@pytest.fixture
def service(live_server, alice):
    _, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    client = RelayClient(live_server.url, str(token), attempts=1)
    yield Service(live_server.url, str(token), client)
    client.close()


def poll_once(config, tmp_path) -> None:
    """The bridge takes what is pending and forks a worker for it (as its systemd timer)."""
    assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10) == 0


def test_run_start_then_run_wait_with_the_bridge_over_ssh(service, sshd, alice, tmp_path):
    nodes = {"web1": {"FAKE_PUPPET_EXIT": "2"}, "web2": {"FAKE_PUPPET_EXIT": "0"}}
    config = bridge_config(tmp_path, service, sshd, nodes)
    spec = {
        "connection": PUPPET,
        "environment": "production",
        "scope": {"nodes": ["web1", "web2"]},
        "noop": True,
    }
    start = Step("relaysh/puppet-step-run-start", spec, alice.pk)
    assert isinstance(start.start(), Wait)

    poll_once(config, tmp_path)
    assert start.until_done().success
    run_id = start.outputs["id"]
    waiting = Step("relaysh/puppet-step-run-wait", {"connection": PUPPET, "id": run_id}, alice.pk)
    done = waiting.until_done()

    assert done.success and waiting.outputs["outcome"] == "finished" and waiting.outputs["jobID"] == ""
    results = {node["name"]: node for node in waiting.outputs["results"]["nodes"]}
    assert {name: (node["state"], node["exit_code"]) for name, node in results.items()} == {
        "web1": ("finished", 2),
        "web2": ("finished", 0),
    }
    assert "with agent -t --noop --environment production" in results["web1"]["output"]


def test_the_rfc_s_run_step_fails_when_puppet_fails_on_a_node(service, sshd, alice, tmp_path):
    config = bridge_config(tmp_path, service, sshd, {"web1": {"FAKE_PUPPET_EXIT": "4"}})
    step = Step(
        "relaysh/puppet-step-run",
        {
            "connection": PUPPET,
            "scope": {"nodes": ["web1"]},
            "noOp": False,
            "timeoutAfterMissedHeartbeats": 3,
        },
        alice.pk,
    )
    done = step.until_done(between=lambda: poll_once(config, tmp_path))
    assert not done.success
    assert step.outputs == {"id": step.outputs["id"], "jobID": "", "outcome": "failed"}
    assert (
        Run.objects.get(pk=step.outputs["id"]).run_results["nodes"][0]["meaning"] == "some resources failed"
    )


def test_cancelling_a_waiting_step_stops_puppet_on_the_node(service, sshd, alice, tmp_path):
    calls = tmp_path / "calls"
    config = bridge_config(
        tmp_path, service, sshd, {"web1": {"FAKE_PUPPET_SLEEP": "120", "FAKE_PUPPET_LOG": str(calls)}}
    )
    step = Step("relaysh/puppet-step-run", {"connection": PUPPET, "scope": {"nodes": ["web1"]}}, alice.pk)
    step.start()
    poll_once(config, tmp_path)
    in_progress(step.outputs["id"])
    pid = int(wait_for(lambda: calls.exists() and calls.read_text().split()[2]))

    step.cancel()  # the workflow run is cancelled while the step waits
    run = completed(step.outputs["id"], timeout=15)
    assert run.outcome == "cancelled"
    wait_for(lambda: not alive(pid), 5, "Puppet to stop on the node")


def work_on_pe(service: Service, pe: Orchestrator, tmp_path) -> threading.Thread:
    """A bridge on PE works the connection's pending run with the orchestrator, in a thread."""
    relay = RelayClient(service.url, service.token, platform="pe", backend="orchestrator", attempts=2)
    [run] = relay.list_runs(status="pending")
    backend = OrchestratorBackend({"api_url": pe.url, "token": pe.token, "cacert": str(pe.ca)}, backoff=0.01)
    worker = threading.Thread(target=RunWorker(relay, backend, run, tmp_path / "state", heartbeat=0.05).work)
    worker.start()
    return worker


def test_task_run_start_then_run_wait_on_puppet_enterprise(service, pe, alice, tmp_path):
    PuppetConnection.objects.update(platform="pe")
    spec = {
        "connection": PUPPET,
        "environment": "production",
        "name": "package",
        "params": {"name": "nginx", "action": "status"},
        "scope": {"nodes": ["web1", "web2"]},
    }
    start = Step("relaysh/puppet-step-task-run-start", spec, alice.pk)
    start.start()
    worker = work_on_pe(service, pe, tmp_path)
    assert start.until_done().success
    waiting = Step(
        "relaysh/puppet-step-run-wait", {"connection": PUPPET, "id": start.outputs["id"]}, alice.pk
    )
    done = waiting.until_done()
    worker.join(10)

    assert done.success and waiting.outputs["outcome"] == "finished" and waiting.outputs["jobID"] == "81"
    assert start.outputs["jobID"] == "81"
    assert [node["name"] for node in waiting.outputs["results"]["nodes"]] == ["web1", "web2"]
    [command] = [r for r in pe.seen if r["method"] == "POST" and r["path"].endswith("/command/task")]
    assert command["body"]["task"] == "package" and command["body"]["scope"] == {"nodes": ["web1", "web2"]}
    assert command["body"]["params"] == {"name": "nginx", "action": "status"}


def test_plan_run_start_then_run_wait_on_puppet_enterprise(service, pe, alice, tmp_path):
    PuppetConnection.objects.update(platform="pe")
    pe.script = ["running", "success"]
    pe.plan_result = {"deployed": ["web1"]}
    spec = {
        "connection": PUPPET,
        "environment": "production",
        "name": "app::deploy",
        "params": {"version": "2"},
    }
    start = Step("relaysh/puppet-step-plan-run-start", spec, alice.pk)
    start.start()
    worker = work_on_pe(service, pe, tmp_path)
    start.until_done()
    waiting = Step(
        "relaysh/puppet-step-run-wait", {"connection": PUPPET, "id": start.outputs["id"]}, alice.pk
    )
    done = waiting.until_done()
    worker.join(10)
    assert done.success and waiting.outputs["outcome"] == "success"
    assert waiting.outputs["results"]["result"] == {"deployed": ["web1"]}


def test_task_run_start_with_the_published_spec_then_run_wait_on_pe(service, pe, alice, tmp_path):
    """Every field of relay-puppet's task-run-start spec schema, through the orchestrator."""
    PuppetConnection.objects.update(platform="pe")
    pe.node_groups["2e9c2b3a-0000-4000-8000-000000000001"] = ["db1", "db2"]
    targets = [{"hostnames": ["db1"], "transport": "ssh", "user": "ops"}]
    spec = {
        "connection": PUPPET,
        "environment": "staging",
        "scope": {"node_group": "2e9c2b3a-0000-4000-8000-000000000001"},
        "name": "service::restart",
        "params": {"name": "postgresql"},
        "noop": True,
        "targets": targets,
    }
    start = Step("relaysh/puppet-step-task-run-start", spec, alice.pk)
    start.start()
    worker = work_on_pe(service, pe, tmp_path)
    assert start.until_done().success
    waiting = Step(
        "relaysh/puppet-step-run-wait", {"connection": PUPPET, "id": start.outputs["id"]}, alice.pk
    )
    done = waiting.until_done()
    worker.join(10)

    assert done.success and waiting.outputs["outcome"] == "finished"
    assert [node["name"] for node in waiting.outputs["results"]["nodes"]] == ["db1", "db2"]
    [command] = [r for r in pe.seen if r["method"] == "POST" and r["path"].endswith("/command/task")]
    assert command["body"] == {
        "environment": "staging",
        "scope": {"node_group": "2e9c2b3a-0000-4000-8000-000000000001"},
        "task": "service::restart",
        "params": {"name": "postgresql"},
        "noop": True,
        "targets": targets,
        "description": f"Relay run {start.outputs['id']}",
    }
