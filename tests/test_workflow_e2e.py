"""The RFC's workflows (../shared/spec/puppet-integration-rfc.md, "Product-level
explanation") written as Relay workflows and run end to end on real parts: the API over HTTP
(a live server), a real Celery worker process running the engine and reading the events,
the session's Debian puppetserver, `relay-bridge serve` with its SSH backend running
`puppet agent` on this host through the tests' sshd, Debian's `puppet apply` sending real
reports, and the Slack stand-in's chat.postMessage over HTTPS.

The second workflow: a dry run on some nodes, an approval that shows what it would change,
the real run, and its outcome in Slack; started by hand, by a module push body and by a
real noop report; approved, rejected, cancelled while Puppet runs. The first one (a push
trigger tells Slack what Puppet changed) is the worked example in docs/workflows.md, which
test_workflow_triggers.py starts with a real `puppet apply` and a push body; here a worker
running it is SIGKILLed mid-step.

One manifest serves every test: a file the real run manages, and an exec that holds Puppet
(and says its pid) only while a test's flag file exists."""

import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from runs.models import Run, RunTransition
from tests.bridge_helpers import Service, bridge_config, log_lines, serve, wait_for
from tests.conftest import api_token_for
from tests.events_helpers import clear_queues, puppet_apply
from tests.puppetserver import PuppetServer
from tests.slack_standin import SlackStandIn
from tests.sshd import Sshd, alive
from tests.test_events_push_body import motd
from tests.test_workflow_triggers import readme_example
from tests.workflow_helpers import EngineWorker
from triggers.models import Event
from workflows import engine
from workflows.models import StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

LONG_POLL = 1  # seconds: how long the bridge's `GET /_puppet/runs?wait=` waits
SLACK_TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"
BEFORE = "as it was\n"
MANAGED = "managed by Puppet, approved in Relay\n"

# The RFC's second workflow: a dry run, an approval, the real run, and its outcome in Slack.
# Its push trigger takes a noop report that found changes pending (the trigger's default
# rule drops one that found none) and dry-runs that node again before asking.
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
triggers:
- name: puppet-noop-report
  source:
    type: push
  when: !Data noop
  binding:
    parameters:
      nodes: [!Data host]
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
    connection: !Connection {type: slack, name: ops-slack}
    channel: '#puppet'
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
    puppetserver.manifest(f"node default {{\n{managed_file(node)}{holding_exec(node)}}}\n")
    return node


def managed_file(node: Node) -> str:
    return f"  file {{ '{node.target}': content => \"{MANAGED.strip()}\\n\" }}\n"


def holding_exec(node: Node) -> str:
    return f"""  exec {{ 'hold':
    command => ['/bin/sh', '-c', 'echo $PPID $$ > {node.pids}; exec /bin/sleep 300'],
    onlyif  => '/usr/bin/test -e {node.hold}',
    noop    => false,
  }}
"""


def sha256(text: str) -> str:
    return "{sha256}" + hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def slack(tmp_path_factory) -> Iterator[SlackStandIn]:
    standin = SlackStandIn(tmp_path_factory.mktemp("slack"))
    standin.channels["C0PUPPET01"] = "puppet"
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
    clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))  # earlier modules' messages
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


def statuses(run: dict[str, Any]) -> dict[str, str]:
    return {step["name"]: step["status"] for step in run["steps"]}


@dataclass
class Ops:
    """Someone who runs Puppet from Relay: a user who may answer approvals (in the API and
    the admin), their puppet and slack connections (made through the API)."""

    user: User
    api: Api
    puppet: Service

    def workflow(self, name: str, source: str) -> dict[str, Any]:
        return self.api.call("POST", "/api/workflows/", 201, {"name": name, "source": source})

    def start(self, name: str, parameters: dict[str, Any]) -> str:
        return self.api.call("POST", f"/api/workflows/{name}/runs/", 201, {"parameters": parameters})["id"]

    def started_by(self, event_id: str) -> str:
        """The id of the run an event started, once the worker has read the event."""
        run = wait_for(lambda: WorkflowRun.objects.filter(event_id=event_id).first(), 60, "the event's run")
        return str(run.pk)

    def puppet_runs(self) -> list[Run]:
        return list(Run.objects.filter(connection__owner=self.user).order_by("created_at"))


@pytest.fixture
def ops(live_server, workers: Workers) -> Ops:
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="approve_steprun"))
    api = Api(live_server.url, api_token_for(user))
    puppet = api.call("POST", "/api/connections/puppet/", 201, {"name": "datacenter"})
    api.call("POST", "/api/connections/slack/", 201, {"name": "ops-slack", "token": SLACK_TOKEN})
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


def push_trigger_token(workflow: dict[str, Any]) -> str:
    [trigger] = workflow["triggers"]  # shown once, in the create's answer
    assert (trigger["name"], trigger["type"]) == ("puppet-noop-report", "push")
    return trigger["token"]


# The RFC's second workflow -------------------------------------------------------------------


def test_a_run_started_by_hand_shows_what_the_dry_run_would_change_and_once_approved_runs_puppet_for_real(
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
    assert node.target.read_text() == BEFORE  # a dry run
    # The evidence: Puppet exited 0, yet changes are pending, and these.
    assert result["changes_pending"] is True and result["report"]["noop"] is True
    [resource] = result["resources"]
    assert (resource["type"], resource["title"]) == ("File", str(node.target))
    assert resource["changes"] == [
        {"property": "content", "from": sha256(BEFORE), "to": sha256(MANAGED), "status": "noop"}
    ]
    # ... and the approval's page shows it to the approver, next to the buttons.
    admin = Client()
    admin.force_login(ops.user)
    approval = StepRun.objects.get(run_id=run_id, name="approval")
    page = admin.get(f"/admin/workflows/approval/{approval.pk}/change/").content.decode()
    assert 'value="Approve"' in page
    assert (
        f"<strong>{node.certname}</strong>: changes pending<br>"
        f"File[{node.target}] content: {sha256(BEFORE)} → {sha256(MANAGED)}"
    ) in page
    [noop] = ops.puppet_runs()
    assert noop.noop is True and str(noop.id) == steps(run)["dry-run"]["outputs"]["id"]
    assert statuses(run)["real-run"] == "pending" and slack.received == []

    ops.api.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/approve/", 200)
    run = ops.api.finished(run_id)

    assert (run["outcome"], run["message"]) == ("success", "")
    assert statuses(run) == dict.fromkeys(statuses(run), "success")
    assert steps(run)["approval"]["decided_by"] == "ops"
    real = steps(run)["real-run"]["outputs"]
    assert (real["outcome"], real["jobID"]) == ("finished", "")  # plain SSH has no job handle
    assert node.target.read_text() == MANAGED
    noop, applied = ops.puppet_runs()
    assert (applied.noop, str(applied.id), applied.outcome) == (False, real["id"], "finished")
    [applied_node] = applied.run_results["nodes"]
    assert applied_node["exit_code"] == 2 and applied_node["changes_pending"] is False  # applied
    [message] = slack.posted()
    assert message["channel"] == "#puppet"
    assert message["text"] == f'Puppet run {applied.id} on ["{node.certname}"]: finished'


def test_a_module_push_body_starts_a_run_and_its_rejection_fails_it_with_no_real_puppet_run(
    ops: Ops, node: Node, bridge: Path, slack: SlackStandIn, live_server
):
    node.reset()
    token = push_trigger_token(ops.workflow("dry-run-first", DRY_RUN_FIRST))
    # What the Puppet module's report processor sends for a noop run with a change pending.
    sent = requests.post(
        f"{live_server.url}/api/events",
        json={"data": {**motd(noop=True, pending=True), "host": node.certname}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert sent.status_code == 202, sent.text
    run_id = ops.started_by(sent.json()["id"])
    assert waiting_for_approval(ops, run_id)["parameters"] == {
        "nodes": [node.certname],
        "environment": "production",
    }

    ops.api.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/reject/", 200)
    run = ops.api.finished(run_id, timeout=30)

    assert (run["outcome"], run["message"]) == ("failure", "Failed: approval.")
    assert statuses(run) == {
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


def test_a_real_noop_report_starts_a_run_and_cancelling_it_while_puppet_runs_stops_puppet_on_the_node(
    ops: Ops, node: Node, bridge: Path, slack: SlackStandIn, live_server, tmp_path
):
    node.reset()
    node.pids.unlink(missing_ok=True)
    node.hold.touch()
    puppet = sleeper = None
    try:
        token = push_trigger_token(ops.workflow("dry-run-first", DRY_RUN_FIRST))
        # Puppet, in noop mode, finds the file out of sync and sends its report (its own http
        # processor: YAML, the token as the reporturl's password) to the workflow's trigger.
        port = urlparse(live_server.url).port
        applied = puppet_apply(
            tmp_path,
            f"node default {{\n{managed_file(node)}}}\n",
            "--noop",
            "--reports=http",
            f"--reporturl=http://x:{token}@127.0.0.1:{port}/api/events",
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr  # noop: 0 with changes pending
        assert node.target.read_text() == BEFORE
        event = wait_for(lambda: Event.objects.first(), 30, "the report")
        run_id = ops.started_by(str(event.pk))
        event.refresh_from_db()
        assert event.data["host"] == node.certname and event.data["noop"] is True
        assert list(event.data["resource_statuses"]) == [f"File[{node.target}]"]
        run = ops.api.run_until(run_id, lambda run: statuses(run)["dry-run-wait"] == "in-progress")
        assert run["parameters"]["nodes"] == [node.certname]
        puppet, sleeper = map(int, wait_for(lambda: node.pids.exists() and node.pids.read_text().split(), 60))
        assert alive(puppet)  # Puppet is running on the node, in its exec

        cancelled = ops.api.call("POST", f"/api/workflow-runs/{run_id}/cancel/", 202)
        assert cancelled["id"] == run_id
        run = ops.api.finished(run_id, timeout=30)

        assert run["outcome"] == "cancelled"
        assert statuses(run) == {
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


def test_a_worker_killed_while_it_posts_to_slack_loses_nothing(
    ops: Ops, workers: Workers, slack: SlackStandIn
):
    ops.workflow("tell-slack", readme_example())
    slack.delays = [10]  # Slack is slow to answer: the worker waits in the step
    changes = motd(noop=False, pending=False)["resource_statuses"]
    run_id = ops.start("tell-slack", {"host": "web1.example.com", "changes": changes})
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
    # outside the database may be done twice (docs/workflows.md, "Durable").
    first, second = (request["json"] for request in slack.received)
    assert first == second and first["channel"] == "#puppet"
    assert (
        first["text"].startswith("Puppet changed web1.example.com: {")
        and '"File[/etc/motd]"' in first["text"]
    )
