"""The RFC's two workflows (../shared/spec/puppet-integration-rfc.md, "Product-level
explanation") written as Relay workflows and run end to end on real parts: the API over HTTP
(a live server), a real Celery worker process running the engine, the session's Debian
puppetserver, `relay-bridge serve` with its SSH backend running `puppet agent` on this host
through the tests' sshd, and the Slack stand-in's chat.postMessage over HTTPS.

1. A Puppet run changed something: Slack hears which node and which resources.
2. A dry run on some nodes, an approval, then the real run; Slack hears its outcome.

One manifest serves every test: a file the real run manages, and an exec that holds Puppet
(and says its pid) only while a test's flag file exists."""

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from runs.models import Run, RunTransition
from tests.bridge_helpers import Service, bridge_config, log_lines, serve, wait_for
from tests.conftest import api_token_for
from tests.puppetserver import PuppetServer
from tests.slack_standin import SlackStandIn
from tests.sshd import Sshd, alive
from tests.workflow_helpers import EngineWorker
from workflows import engine
from workflows.models import StepRun

pytestmark = pytest.mark.django_db(transaction=True)

LONG_POLL = 1  # seconds: how long the bridge's `GET /_puppet/runs?wait=` waits
SLACK_TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"
BEFORE = "as it was\n"
MANAGED = "managed by Puppet, approved in Relay\n"

# The RFC's first workflow: a Puppet report that changed something tells Slack what changed.
CHANGES = """\
apiVersion: v1
summary: Tell Slack what Puppet changed
description: >
  A Puppet report comes to the push trigger; when the run changed something, Slack hears
  which node and which resources.
parameters:
  host:
    description: The node that sent the report
  resourceStatuses:
    description: The resources the run changed, by name
triggers:
- name: puppet-report
  source:
    type: push
  when: !Fn.equals [!Data status, changed]
  binding:
    parameters:
      host: !Data host
      resourceStatuses: !Data resource_statuses
steps:
- name: tell-slack
  image: relaysh/slack-step-message-send
  spec:
    connection: !Connection {type: slack, name: team}
    channel: '#general'
    message: "Puppet changed ${parameters.host}: ${jsonMarshal(parameters.resourceStatuses)}"
"""

# The RFC's second workflow: a dry run, an approval, the real run, and its outcome in Slack.
DRY_RUN_FIRST = """\
apiVersion: v1
summary: Dry run, approve, run Puppet
description: >
  Puppet runs in noop mode on the nodes; someone looks at what it would change and approves
  the real run; Slack hears how it went.
parameters:
  nodes:
    description: The nodes to run Puppet on
  environment:
    description: The Puppet environment
    default: production
steps:
- name: dry-run
  image: relaysh/puppet-step-run-start
  spec:
    connection: !Connection {type: puppet, name: datacenter}
    environment: !Parameter environment
    scope:
      nodes: !Parameter nodes
    noop: true
- name: dry-run-wait
  image: relaysh/puppet-step-run-wait
  spec:
    connection: !Connection {type: puppet, name: datacenter}
    id: !Output {from: dry-run, name: id}
- name: approval
  description: Look at what the dry run would change, then approve the real run
  type: approval
  dependsOn: dry-run-wait
- name: real-run
  image: relaysh/puppet-step-run
  dependsOn: approval
  spec:
    connection: !Connection {type: puppet, name: datacenter}
    timeoutAfterMissedHeartbeats: 3
    environment: !Parameter environment
    scope:
      nodes: !Parameter nodes
    noOp: false
- name: tell-slack
  image: relaysh/slack-step-message-send
  spec:
    connection: !Connection {type: slack, name: team}
    channel: '#general'
    message: >-
      Puppet run ${outputs['real-run'].id} on ${jsonMarshal(parameters.nodes)}:
      ${outputs['real-run'].outcome}
"""


@dataclass
class Node:
    """This host as a node of the session's puppetserver, with this module's manifest."""

    puppetserver: PuppetServer
    certname: str
    target: Path  # the file the manifest manages
    hold: Path  # while it exists, Puppet runs an exec that sleeps (also in noop mode)
    pids: Path  # where that exec writes Puppet's pid and its own

    def reset(self) -> None:
        self.target.write_text(BEFORE)


@pytest.fixture(scope="module")
def node(puppetserver: PuppetServer, tmp_path_factory) -> Node:
    workdir = tmp_path_factory.mktemp("workflow-e2e")
    node = Node(puppetserver, puppetserver.certname(), workdir / "motd", workdir / "hold", workdir / "pids")
    puppetserver.manifest(
        f"""node default {{
  file {{ '{node.target}': content => "{MANAGED.strip()}\\n" }}
  exec {{ 'hold':
    command => ['/bin/sh', '-c', 'echo $PPID $$ > {node.pids}; exec /bin/sleep 300'],
    onlyif  => '/usr/bin/test -e {node.hold}',
    noop    => false,
  }}
}}
"""
    )
    return node


@pytest.fixture(scope="module")
def slack(tmp_path_factory) -> Iterator[SlackStandIn]:
    standin = SlackStandIn(tmp_path_factory.mktemp("slack"))
    yield standin
    standin.close()


@pytest.fixture(autouse=True)
def _slack_heard_nothing_yet(slack: SlackStandIn) -> None:
    slack.received.clear()
    slack.delays.clear()


class Workers:
    """The module's engine worker (solo: a task runs in the worker process itself, so a
    SIGKILL stops it mid-step), replaced when a test kills it."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory, self.env, self.started = directory, env, 0
        self.current = self.start()

    def start(self) -> EngineWorker:
        self.started += 1
        return EngineWorker(self.directory / f"worker-{self.started}.log", pool="solo", **self.env)

    def replace(self) -> EngineWorker:
        self.current.stop()
        self.current = self.start()
        return self.current


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, bao, slack, tmp_path_factory) -> Iterator[Workers]:
    env = {"VAULT_ADDR": bao.addr, "VAULT_TOKEN": bao.root().token, **slack.worker_env(SLACK_TOKEN)}
    with django_db_blocker.unblock():
        held = Workers(tmp_path_factory.mktemp("workers"), env)
    yield held
    held.current.stop()


class Api:
    """The REST API as a user calls it: over HTTP, with a user API token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def call(self, method: str, path: str, expect: int, body: Any = None) -> Any:
        response = self.session.request(method, self.url + path, json=body, timeout=30)
        assert response.status_code == expect, (method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/api/workflow-runs/{run_id}/", 200)

    def run_until(self, run_id: str, check: Callable[[dict[str, Any]], bool], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while not check(run := self.run(run_id)):
            assert time.monotonic() < deadline, f"timed out; the run is now {run}"
            time.sleep(0.2)
        return run

    def finished(self, run_id: str, timeout: float = 120) -> dict[str, Any]:
        return self.run_until(run_id, lambda run: run["status"] == "complete", timeout)


def steps(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in run["steps"]}


@dataclass
class Ops:
    """Someone who runs Puppet from Relay: a user who may answer approvals, their puppet
    and slack connections (made through the API), and a bridge serving the connection."""

    user: User
    api: Api
    puppet: Service

    def workflow(self, name: str, source: str) -> dict[str, Any]:
        return self.api.call("POST", "/api/workflows/", 201, {"name": name, "source": source})

    def start(self, name: str, parameters: dict[str, Any]) -> str:
        return self.api.call("POST", f"/api/workflows/{name}/runs/", 201, {"parameters": parameters})["id"]

    def puppet_runs(self) -> list[Run]:
        return list(Run.objects.filter(connection__owner=self.user).order_by("created_at"))


@pytest.fixture
def ops(live_server, workers: Workers) -> Ops:
    user = User.objects.create_user("ops")
    user.user_permissions.set(Permission.objects.filter(codename="approve_steprun"))
    api = Api(live_server.url, api_token_for(user))
    puppet = api.call("POST", "/api/connections/puppet/", 201, {"name": "datacenter"})
    api.call("POST", "/api/connections/slack/", 201, {"name": "team", "token": SLACK_TOKEN})
    return Ops(user, api, Service(live_server.url, puppet["token"], None))  # type: ignore[arg-type]


@pytest.fixture
def bridge(ops: Ops, node: Node, sshd: Sshd, tmp_path) -> Iterator[Path]:
    """`relay-bridge serve` for the connection: the SSH backend, this host as the node (an
    ssh alias of the tests' sshd named by its certname), Debian's puppet with the session
    puppetserver's agent configuration, a heartbeat every second. Yields its log."""
    config = bridge_config(
        tmp_path / "bridge",
        ops.puppet,
        sshd,
        {node.certname: {}},
        heartbeat=1,
        node_puppet_path=str(node.puppetserver.node_puppet()),
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log, "--wait", str(LONG_POLL))
    yield log
    server.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0, "".join(log_lines(log))[-3000:]
    # The live server answers the bridge's last long-poll when it ends, with a query: not
    # after the test's database is gone.
    time.sleep(LONG_POLL + 0.2)


def waiting_for_approval(ops: Ops, run_id: str) -> dict[str, Any]:
    return ops.api.run_until(run_id, lambda run: steps(run)["approval"]["status"] == "in-progress")


# The RFC's second workflow -------------------------------------------------------------------


def test_the_dry_run_is_approved_then_puppet_runs_for_real_and_slack_hears_the_outcome(
    ops: Ops, node: Node, bridge: Path, slack: SlackStandIn
):
    node.reset()
    ops.workflow("dry-run-first", DRY_RUN_FIRST)
    run_id = ops.start("dry-run-first", {"nodes": [node.certname]})

    run = waiting_for_approval(ops, run_id)
    assert run["parameters"] == {"nodes": [node.certname], "environment": "production"}
    dry = steps(run)["dry-run-wait"]
    assert dry["status"] == "success" and dry["outputs"]["outcome"] == "finished", dry["outputs"]
    [result] = dry["outputs"]["results"]["nodes"]
    assert (result["name"], result["state"], result["exit_code"]) == (node.certname, "finished", 0)
    assert "(noop)" in result["output"] and str(node.target) in result["output"]
    assert node.target.read_text() == BEFORE  # a dry run
    [noop] = ops.puppet_runs()
    assert noop.noop is True and str(noop.id) == steps(run)["dry-run"]["outputs"]["id"]
    assert steps(run)["real-run"]["status"] == "pending" and slack.received == []

    ops.api.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/approve/", 200)
    run = ops.api.finished(run_id)

    assert (run["outcome"], run["message"]) == ("success", "")
    assert {name: step["status"] for name, step in steps(run).items()} == dict.fromkeys(steps(run), "success")
    assert steps(run)["approval"]["decided_by"] == "ops"
    real = steps(run)["real-run"]["outputs"]
    assert (real["outcome"], real["jobID"]) == ("finished", "")  # plain SSH has no job handle
    assert node.target.read_text() == MANAGED
    noop, applied = ops.puppet_runs()
    assert (applied.noop, str(applied.id), applied.outcome) == (False, real["id"], "finished")
    assert applied.run_results["nodes"][0]["exit_code"] == 2  # changes applied
    [message] = slack.posted()
    assert message["channel"] == "#general"
    assert message["text"] == f'Puppet run {applied.id} on ["{node.certname}"]: finished'


def test_a_rejected_dry_run_fails_the_run_and_no_real_puppet_run_is_made(
    ops: Ops, node: Node, bridge: Path, slack: SlackStandIn
):
    node.reset()
    ops.workflow("dry-run-first", DRY_RUN_FIRST)
    run_id = ops.start("dry-run-first", {"nodes": [node.certname], "environment": "production"})
    waiting_for_approval(ops, run_id)

    ops.api.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/reject/", 200)
    run = ops.api.finished(run_id, timeout=30)

    assert (run["outcome"], run["message"]) == ("failure", "Failed: approval.")
    assert {name: step["status"] for name, step in steps(run).items()} == {
        "dry-run": "success",
        "dry-run-wait": "success",
        "approval": "failure",
        "real-run": "skipped",
        "tell-slack": "skipped",
    }
    assert steps(run)["approval"]["message"] == "Rejected by ops."
    [only] = ops.puppet_runs()  # the dry run's
    assert (only.noop, only.outcome) == (True, "finished")
    assert node.target.read_text() == BEFORE
    assert slack.received == []


def test_cancelling_the_run_while_puppet_runs_stops_puppet_on_the_node(
    ops: Ops, node: Node, bridge: Path, slack: SlackStandIn
):
    node.reset()
    node.pids.unlink(missing_ok=True)
    node.hold.touch()
    puppet = sleeper = None
    try:
        ops.workflow("dry-run-first", DRY_RUN_FIRST)
        run_id = ops.start("dry-run-first", {"nodes": [node.certname]})
        ops.api.run_until(run_id, lambda run: steps(run)["dry-run-wait"]["status"] == "in-progress")
        puppet, sleeper = map(int, wait_for(lambda: node.pids.exists() and node.pids.read_text().split(), 60))
        assert alive(puppet)  # Puppet is running on the node, in its exec

        cancelled = ops.api.call("POST", f"/api/workflow-runs/{run_id}/cancel/", 202)
        assert cancelled["id"] == run_id
        run = ops.api.finished(run_id, timeout=30)

        assert run["outcome"] == "cancelled"
        assert {name: step["status"] for name, step in steps(run).items()} == {
            "dry-run": "success",
            "dry-run-wait": "cancelled",
            "approval": "skipped",
            "real-run": "skipped",
            "tell-slack": "skipped",
        }
        # The Puppet run was cancelled through its own cancel; its bridge stopped Puppet.
        [only] = ops.puppet_runs()
        only = wait_for(lambda: Run.objects.filter(pk=only.pk, status="complete").first(), 30, "the bridge")
        assert only.outcome == "cancelled"
        asked = RunTransition.objects.filter(run=only, note="cancel requested")
        assert list(asked.values_list("token_prefix", flat=True)) == [f"workflow:{run_id}"]
        wait_for(lambda: not alive(puppet), 15, "Puppet to stop on the node")
        # (The exec's own command lives on: Puppet starts it in a session of its own, and
        # stopping Puppet does not stop it. The test ends it below.)
        assert slack.received == []
    finally:
        node.hold.unlink(missing_ok=True)
        for pid in (puppet, sleeper):
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)


# The RFC's first workflow --------------------------------------------------------------------

# What the Puppet module's report processor sends for a run that changed one file.
CHANGED = {
    "host": "web1.example.com",
    "resourceStatuses": {
        "File[/etc/motd]": {
            "resource_type": "File",
            "title": "/etc/motd",
            "change_count": 1,
            "out_of_sync_count": 1,
            "containment_path": ["Stage[main]", "Profile::Motd", "File[/etc/motd]"],
            "corrective_change": False,
        }
    },
}


def test_the_changes_workflow_started_by_hand_tells_slack_the_host_and_its_changed_resources(
    ops: Ops, slack: SlackStandIn
):
    ops.workflow("puppet-changes", CHANGES)
    run = ops.api.finished(ops.start("puppet-changes", CHANGED), timeout=30)
    assert run["outcome"] == "success", run
    [message] = slack.posted()
    assert message["text"].startswith("Puppet changed web1.example.com: {")
    assert '"File[/etc/motd]":{' in message["text"] and '"change_count":1' in message["text"]


def test_a_worker_killed_while_it_posts_to_slack_loses_nothing(
    ops: Ops, workers: Workers, slack: SlackStandIn
):
    ops.workflow("puppet-changes", CHANGES)
    slack.delays = [10]  # Slack is slow to answer: the worker waits in the step
    run_id = ops.start("puppet-changes", CHANGED)
    wait_for(lambda: slack.received, 30, "the worker to post")
    workers.current.kill()  # SIGKILL, in the middle of the step

    step = StepRun.objects.get(run_id=run_id, name="tell-slack")
    assert (step.status, step.attempts) == ("in-progress", 1)
    # Its lease (WORKFLOW_STEP_LEASE) runs out; then the beat's sweep gives the step to the
    # next worker, which starts it again.
    StepRun.objects.filter(pk=step.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    workers.replace()
    assert engine.sweep() == 1
    run = ops.api.finished(run_id, timeout=30)

    assert run["outcome"] == "success"
    step.refresh_from_db()
    assert (step.status, step.attempts) == ("success", 2)
    # Slack got the message before the worker died, and again from the next worker: work
    # outside the database may be done twice (README, "Durable").
    first, second = (request["json"] for request in slack.received)
    assert first == second and first["text"].startswith("Puppet changed web1.example.com")
