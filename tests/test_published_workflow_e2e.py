"""Published Puppet workflows run here unmodified, end to end, on real parts.

`puppet-selective-enforcement` (puppetlabs/relay-workflows, kept byte for byte in
tests/fixtures/relay-workflows/published/) names its connection `my-puppet-connection`, binds
`host`, `noop` and `resource_statuses` from the push trigger's data, and does its thinking in
two `relaysh/core` script steps (`ni get | jq`, `ni output set`) before an approval gates the
Puppet run. Here it is saved through the API as published, and started

- by the push body the Puppet module's report processor sends for a noop run that found a
  corrective change, and
- by a real noop report: Debian's puppet agent, after an enforcing run, finds the file it
  manages changed behind its back (a corrective change), and puppetserver's `reports = http`
  processor sends the report to the workflow's push trigger.

Its script steps run in real bubblewrap sandboxes on a worker of the `steps` queue and talk
to the step runtime API on the live server; the engine runs on its own worker; the approval
is answered over the API; `relay-bridge serve` runs `puppet agent` on this host over SSH;
the outcome comes back as the wait step's outputs.

The Puppet steps' own code (`relay-integrations/relay-puppet` `steps/run-start` and
`steps/run-wait` `step.py`, on `relaysh/core:latest-python` with the official relay_sdk) is
public code that this repository does not copy. `test_the_published_puppet_step_code_*` runs
it as script steps when RELAY_PUPPET_STEPS names a checkout's `steps/` folder, and is skipped
otherwise; a client of our own, written to the same contract (the spec's connection, the
runs API with its token, outputs through relay_sdk), takes the same path in every run."""

import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import requests
from django.contrib.auth.models import Permission, User

from runs.models import Run
from tests.bridge_helpers import Service, bridge_config, log_lines, serve, wait_for
from tests.conftest import api_token_for
from tests.puppetserver import PuppetServer
from tests.script_helpers import running_script_workers
from tests.sshd import Sshd
from tests.test_events_push_body import motd
from tests.test_workflow_e2e import BEFORE, MANAGED, Api, Node, managed_file, statuses, steps
from triggers.models import Event
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

PUBLISHED = Path(__file__).parent / "fixtures" / "relay-workflows" / "published"
SELECTIVE_ENFORCEMENT = (PUBLISHED / "puppet-selective-enforcement.yaml").read_text()
CONNECTION = "my-puppet-connection"  # the name the published workflow uses
LONG_POLL = 1


@pytest.fixture(scope="module")
def node(puppetserver: PuppetServer, tmp_path_factory) -> Node:
    workdir = tmp_path_factory.mktemp("published-e2e")
    node = Node(puppetserver, puppetserver.certname(), workdir / "motd", workdir / "hold", workdir / "pids")
    puppetserver.manifest(f"node default {{\n{managed_file(node)}}}\n")
    return node


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, bao, live_server, tmp_path_factory) -> Iterator[None]:
    """The engine's worker and a worker of the `steps` queue (real bubblewrap sandboxes).
    The Puppet steps' scripts wait for Puppet: their wall time is a run's, not a test's."""
    with running_script_workers(
        django_db_blocker,
        bao,
        live_server.url,
        tmp_path_factory.mktemp("published-workers"),
        STEP_WALL_TIME="300",
        STEP_CPU_SECONDS="60",
        STEP_MEMORY_BYTES=str(512 * 1024 * 1024),
        RELAY_PUBLIC_URL=live_server.url,
    ):
        yield


@pytest.fixture
def ops(live_server, workers, settings) -> Iterator[tuple[User, Api, Service]]:
    # A `puppet` connection resolves to the service's public URL: the live server's here
    # (the step runtime API evaluates specs in this process).
    settings.RELAY_PUBLIC_URL = live_server.url
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="approve_steprun"))
    api = Api(live_server.url, api_token_for(user))
    puppet = api.call("POST", "/api/connections/puppet/", 201, {"name": CONNECTION})
    yield user, api, Service(live_server.url, puppet["token"], None)  # type: ignore[arg-type]


@pytest.fixture
def bridge(ops, node: Node, sshd: Sshd, tmp_path) -> Iterator[Path]:
    """`relay-bridge serve` for the connection: the SSH backend, this host as the node."""
    _, _, service = ops
    config = bridge_config(
        tmp_path / "bridge",
        service,
        sshd,
        {node.certname: {}},
        heartbeat=1,
        node_puppet_path=str(node.puppetserver.node_puppet()),
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log, "--wait", str(LONG_POLL))
    yield log
    server.terminate()
    assert server.wait(60) == 0, "".join(log_lines(log))[-3000:]


def save_published(api: Api) -> str:
    """Save the published workflow as it is; the push trigger's token (shown once)."""
    saved = api.call("POST", "/api/workflows/", 201, {"name": "selective", "source": SELECTIVE_ENFORCEMENT})
    [trigger] = saved["triggers"]
    assert (trigger["name"], trigger["type"]) == ("puppet-report", "push")
    return trigger["token"]


def run_started_by(event_id: str) -> str:
    run = wait_for(lambda: WorkflowRun.objects.filter(event_id=event_id).first(), 60, "the event's run")
    return str(run.pk)


def log_of(api: Api, run_id: str, step: str) -> str:
    return api.call("GET", f"/api/workflow-runs/{run_id}/steps/{step}/log", 200)["text"]


def approve_and_finish(api: Api, run_id: str, node: Node, user: User) -> dict[str, Any]:
    """The run waits at the approval with the corrective change found; approved, Puppet runs
    for real through the bridge and the outcome comes back."""
    run = api.run_until(run_id, lambda run: statuses(run)["approval"] == "in-progress", timeout=120)
    resource = f"File[{node.target}]"
    assert statuses(run) == {
        "view-puppet-resources": "success",
        "detect-corrective-changes": "success",
        "approval": "in-progress",
        "start-puppet-run": "pending",
        "wait-for-puppet-run": "pending",
    }
    # `ni get | jq .resourceStatuses` printed the report's resources; `ni output set` gave
    # the corrective one's name to the approval's condition.
    assert f'"{resource}"' in log_of(api, run_id, "view-puppet-resources")
    assert '"corrective_change": true' in log_of(api, run_id, "view-puppet-resources")
    detect = steps(run)["detect-corrective-changes"]
    assert detect["outputs"] == {"detectedChanges": resource}
    assert f"Detected changes, if any: {resource}" in log_of(api, run_id, "detect-corrective-changes")
    assert not Run.objects.filter(connection__owner=user).exists()  # nothing runs before approval
    assert node.target.read_text() == BEFORE

    api.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/approve/", 200)
    run = api.finished(run_id, timeout=180)

    assert (run["outcome"], run["message"]) == ("success", ""), run
    assert statuses(run) == dict.fromkeys(statuses(run), "success")
    [puppet_run] = Run.objects.filter(connection__owner=user)
    assert puppet_run.noop is False and puppet_run.scope == {"nodes": [node.certname]}
    assert steps(run)["start-puppet-run"]["outputs"]["id"] == str(puppet_run.pk)
    outcome = steps(run)["wait-for-puppet-run"]["outputs"]
    assert outcome["outcome"] == "finished"
    [result] = outcome["results"]["nodes"]
    assert (result["name"], result["state"], result["exit_code"]) == (node.certname, "finished", 2)
    assert node.target.read_text() == MANAGED
    return run


def test_the_module_push_body_of_a_corrective_noop_run_starts_it_and_the_approval_gates_puppet(
    ops, node: Node, bridge: Path, live_server
):
    user, api, _ = ops
    node.reset()
    token = save_published(api)
    body = motd(noop=True, pending=True)
    body["host"] = node.certname
    body["resource_statuses"] = {
        f"File[{node.target}]": {
            **body["resource_statuses"]["File[/etc/motd]"],
            "title": str(node.target),
            "containment_path": ["Stage[main]", "Main", f"File[{node.target}]"],
            "corrective_change": True,
        }
    }
    sent = requests.post(
        f"{live_server.url}/api/events",
        json={"data": body},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert sent.status_code == 202, sent.text
    run_id = run_started_by(sent.json()["id"])
    run = approve_and_finish(api, run_id, node, user)
    assert run["parameters"]["host"] == node.certname and run["parameters"]["noop"] is True


def test_a_real_noop_report_with_a_corrective_change_starts_it(
    ops, node: Node, bridge: Path, live_server, puppetserver: PuppetServer
):
    user, api, _ = ops
    token = save_published(api)
    puppet = str(puppetserver.node_puppet())
    # Puppet enforces the file once (an agent run keeps what it enforced, so that it can tell
    # a corrective change later), and someone changes the file behind its back.
    puppetserver.reports.send_to(None)
    node.reset()
    enforced = subprocess.run([puppet, "agent", "-t"], capture_output=True, text=True, timeout=300)
    assert enforced.returncode == 2, enforced.stdout + enforced.stderr
    node.reset()
    # The noop run finds the change, and puppetserver's http processor sends its report.
    port = urlparse(live_server.url).port
    puppetserver.reports.send_to(f"http://reports:{token}@127.0.0.1:{port}/api/events")
    try:
        noop = subprocess.run([puppet, "agent", "-t", "--noop"], capture_output=True, text=True, timeout=300)
        assert noop.returncode == 0, noop.stdout + noop.stderr  # noop: 0 with changes pending
        assert "(corrective)" in noop.stdout, noop.stdout
        event = wait_for(lambda: Event.objects.filter(trigger__owner=user).first(), 60, "the report")
        run_id = run_started_by(str(event.pk))
        event.refresh_from_db()
        assert event.data["noop"] is True and event.data["host"] == node.certname
        assert event.data["resource_statuses"][f"File[{node.target}]"]["corrective_change"] is True
        # The bridge's real run sends its report too (it starts a run of its own, which
        # finds nothing to approve): only the noop report's run is looked at here.
        approve_and_finish(api, run_id, node, user)
    finally:
        puppetserver.reports.send_to(None)


# The Puppet steps as script steps ----------------------------------------------------------

# A client of the runs API written to the published steps' contract (relay-puppet's
# steps/run-start and steps/run-wait READMEs and schemas): the spec's `connection`
# ({relayAPIURL, token}), `POST _puppet/runs` and `GET _puppet/runs/{id}` with the token as a
# Bearer, the outputs `id`, `jobID`, `outcome`, `results` set through relay_sdk.
OUR_RUN_START = """\
import time
from urllib.parse import urljoin

import requests
from relay_sdk import Dynamic as D
from relay_sdk import Interface

relay = Interface()
connection = relay.get(D.connection)
session = requests.Session()
session.headers["Authorization"] = "Bearer " + connection["token"]
asked = {"environment": relay.get(D.environment), "scope": relay.get(D.scope)}
made = session.post(urljoin(connection["relayAPIURL"], "_puppet/runs"), json=asked, timeout=30)
made.raise_for_status()
run = made.json()
relay.outputs.set("id", run["id"])
while run["state"]["status"] == "pending":
    time.sleep(1)
    seen = session.get(urljoin(connection["relayAPIURL"], "_puppet/runs/" + run["id"]), timeout=30)
    seen.raise_for_status()
    run = seen.json()
if run["state"].get("job_id"):
    relay.outputs.set("jobID", run["state"]["job_id"])
print("run", run["id"], "started")
"""

OUR_RUN_WAIT = """\
import time
from urllib.parse import urljoin

import requests
from relay_sdk import Dynamic as D
from relay_sdk import Interface

relay = Interface()
connection = relay.get(D.connection)
url = urljoin(connection["relayAPIURL"], "_puppet/runs/" + relay.get(D.id))
headers = {"Authorization": "Bearer " + connection["token"]}
while True:
    seen = requests.get(url, headers=headers, timeout=30)
    seen.raise_for_status()
    state = seen.json()["state"]
    if state["status"] == "complete":
        break
    time.sleep(1)
for output, field in (("jobID", "job_id"), ("outcome", "outcome"), ("results", "run_results")):
    if state.get(field):
        relay.outputs.set(output, state[field])
print("run complete:", state.get("outcome"))
"""


def python_steps(run_start: str, run_wait: str) -> str:
    """The two steps as the published workflows write them, on `relaysh/core:latest-python`
    with each step's Python given to `python3` on its input."""

    def script(code: str) -> str:
        return textwrap.indent(f"python3 - <<'STEP'\n{code}STEP\n", "      ")

    return f"""\
apiVersion: v1
parameters:
  host: {{}}
steps:
- name: start-puppet-run
  image: relaysh/core:latest-python
  spec:
    connection: !Connection {{type: puppet, name: {CONNECTION}}}
    environment: production
    scope:
      nodes: [!Parameter host]
  input:
  - |
{script(run_start)}
- name: wait-for-puppet-run
  image: relaysh/core:latest-python
  spec:
    connection: !Connection {{type: puppet, name: {CONNECTION}}}
    id: !Output [start-puppet-run, id]
  input:
  - |
{script(run_wait)}
"""


def run_the_python_steps(api: Api, user: User, node: Node, token: str, source: str) -> dict[str, Any]:
    node.reset()
    api.call("POST", "/api/workflows/", 201, {"name": "python-steps", "source": source})
    run_id = api.call(
        "POST", "/api/workflows/python-steps/runs/", 201, {"parameters": {"host": node.certname}}
    )["id"]
    run = api.finished(run_id, timeout=240)
    assert (run["outcome"], run["message"]) == ("success", ""), run
    [puppet_run] = Run.objects.filter(connection__owner=user)
    assert steps(run)["start-puppet-run"]["outputs"]["id"] == str(puppet_run.pk)
    outputs = steps(run)["wait-for-puppet-run"]["outputs"]
    assert outputs["outcome"] == "finished" == puppet_run.outcome
    [result] = outputs["results"]["nodes"]
    assert (result["name"], result["exit_code"]) == (node.certname, 2)
    assert node.target.read_text() == MANAGED
    # The connection's token reached the scripts (they called the runs API with it), and
    # never their logs.
    for step in ("start-puppet-run", "wait-for-puppet-run"):
        assert token not in log_of(api, run_id, step)
    return outputs


def test_a_runs_api_client_on_the_python_image_runs_puppet_as_the_native_steps_do(
    ops, node: Node, bridge: Path
):
    user, api, service = ops
    outputs = run_the_python_steps(api, user, node, service.token, python_steps(OUR_RUN_START, OUR_RUN_WAIT))
    assert "jobID" not in outputs  # plain SSH has no job handle, as with the native steps


RELAY_PUPPET_STEPS = os.environ.get("RELAY_PUPPET_STEPS")


@pytest.mark.skipif(
    not RELAY_PUPPET_STEPS,
    reason="RELAY_PUPPET_STEPS names no checkout of relay-integrations/relay-puppet's steps/ "
    "(its code is not copied into this repository)",
)
def test_the_published_puppet_step_code_runs_as_script_steps_with_the_native_steps_outcome(
    ops, node: Node, bridge: Path
):
    user, api, service = ops
    folder = Path(RELAY_PUPPET_STEPS or "")
    run_start = (folder / "run-start" / "step.py").read_text()
    run_wait = (folder / "run-wait" / "step.py").read_text()
    run_the_python_steps(api, user, node, service.token, python_steps(run_start, run_wait))
