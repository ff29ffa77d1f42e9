"""Task runs worked by this service's bridge (its run worker, against a live server): Bolt
(`bolt task run`, against the Bolt stand-in) on the scope's nodes, the PE orchestrator
(`POST command/task`, against the orchestrator stand-in) with the run's scope, and the SSH
backend refusing them with an `error` outcome. Task runs stored before task runs had a
scope (certnames as targets) are worked too: the list offers them to this bridge."""

import json
import stat
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from relay_bridge.api import RelayClient
from relay_bridge.backends.bolt import BoltBackend
from relay_bridge.backends.orchestrator import OrchestratorBackend
from relay_bridge.backends.ssh import SshBackend
from relay_bridge.worker import RunWorker

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.bridge_helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BOLT = str(Path(__file__).parent / "standins" / "bolt")
# A task as Bolt finds it (modules/<module>/tasks/init.sh): it answers its parameters, which
# Bolt gives as JSON on stdin and as PT_ variables, with the target it ran on.
TASK = """#!/bin/sh
read -r input
printf '{"node": "%s", "name": "%s", "input": %s}\\n' "$FAKE_PUPPET_NODE" "$PT_name" "$input"
exit "${TASK_EXIT:-0}"
"""


@pytest.fixture
def token(live_server) -> str:
    _, token = PuppetConnection.create_with_token(owner=User.objects.create_user("ops"), name="prod")
    return str(token)


def client(live_server, token: str, backend: str, platform: str = "oss") -> RelayClient:
    return RelayClient(live_server.url, token, platform=platform, backend=backend, attempts=2)


def work(relay: RelayClient, backend, tmp_path: Path, body: dict | None = None, run_id: str = "") -> Run:
    """Create the run (or take `run_id`), then work it as the bridge does: from the list."""
    if body is not None:
        run_id = relay.create_run(body)["id"]
    [run] = [r for r in relay.list_runs(status="pending") if r["id"] == run_id]
    RunWorker(relay, backend, run, tmp_path / "state", heartbeat=0.05).work()
    return Run.objects.get(pk=run_id)


def task_run(scope: dict, **fields) -> dict:
    """The published task-run-start's body."""
    body = {"type": "task-run", "environment": None, "scope": scope, "name": "package"}
    return {**body, "params": {}, "noop": False, "targets": [], **fields}


def old_task_run(targets: list[str]) -> str:
    """Stored before task runs had a scope: certnames as targets, no scope."""
    run = Run.objects.create(
        connection=PuppetConnection.objects.get(), type="task-run", name="package", params={}, targets=targets
    )
    return str(run.id)


def stored_task_run(scope: dict) -> str:
    """A task run the service took before it knew the bridge (no platform recorded yet),
    which the bridge then lists."""
    run = Run.objects.create(
        connection=PuppetConnection.objects.get(),
        type="task-run",
        name="package",
        params={},
        scope=scope,
        targets=[],
    )
    return str(run.id)


@pytest.fixture
def modules(tmp_path) -> Path:
    script = tmp_path / "modules" / "package" / "tasks" / "init.sh"
    script.parent.mkdir(parents=True)
    script.write_text(TASK)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return tmp_path / "modules"


@pytest.fixture
def bolt_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "bolt-calls"
    monkeypatch.setenv("BOLT_STANDIN_LOG", str(log))
    monkeypatch.setenv("BOLT_STANDIN_ENV", json.dumps({"web2": {"TASK_EXIT": "1"}}))
    return log


def test_bolt_runs_the_task_on_the_scope_s_nodes(live_server, token, modules, bolt_log, tmp_path):
    relay = client(live_server, token, "bolt")
    backend = BoltBackend({"bolt_path": BOLT, "modulepath": str(modules)})
    params = {"name": "nginx", "secret_word": "do-not-show"}
    targets = [{"uri": "local://localhost"}]  # never used: Bolt's inventory is the bridge's
    run = work(
        relay,
        backend,
        tmp_path,
        task_run({"nodes": ["web1", "web2"]}, params=params, noop=True, targets=targets),
    )

    assert (run.status, run.outcome) == ("complete", "failed")  # web2's task exited 1
    nodes = {node["name"]: node for node in run.run_results["nodes"]}
    assert nodes["web1"] == {
        "name": "web1",
        "state": "finished",
        "result": {"node": "web1", "name": "nginx", "input": params},
    }
    assert nodes["web2"]["state"] == "failed"
    assert nodes["web2"]["result"]["_error"]["kind"] == "puppetlabs.tasks/task-error"
    [call] = [json.loads(line) for line in bolt_log.read_text().splitlines()]
    argv = call["argv"]
    assert argv[:5] == ["task", "run", "package", "--targets", "web1,web2"]
    assert "--noop" in argv and argv[argv.index("--modulepath") + 1] == str(modules)
    params_file = argv[argv.index("--params") + 1]
    assert params_file.startswith("@") and "do-not-show" not in " ".join(argv)  # off the command line
    assert "local" not in json.dumps(call)

    # Without noop, and all good: finished.
    monkey_env = {"BOLT_STANDIN_ENV": "{}"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in monkey_env.items():
            patch.setenv(name, value)
        done = work(relay, backend, tmp_path, task_run({"nodes": ["web1"]}, params={"name": "vim"}))
    assert (done.outcome, done.run_results["nodes"][0]["result"]["name"]) == ("finished", "vim")
    assert "--noop" not in json.loads(bolt_log.read_text().splitlines()[-1])["argv"]


def test_bolt_works_a_task_run_stored_before_scopes(live_server, token, modules, bolt_log, tmp_path):
    relay = client(live_server, token, "bolt")
    backend = BoltBackend({"bolt_path": BOLT, "modulepath": str(modules)})
    run = work(relay, backend, tmp_path, run_id=old_task_run(["web1", "web3"]))
    assert run.outcome == "finished"
    assert [node["name"] for node in run.run_results["nodes"]] == ["web1", "web3"]


@pytest.mark.parametrize(
    ("scope", "why"),
    [
        (
            {"query": "inventory[certname] {}"},
            "not scope `query`: that needs PuppetDB (the bridge's puppetdb_url)",
        ),
        ({"node_group": "00000000-0000-4000-8000-000000000000"}, "not scope `node_group`"),
    ],
)
def test_bolt_cannot_resolve_a_query_or_node_group(
    live_server, token, modules, bolt_log, tmp_path, scope, why
):
    relay = client(live_server, token, "bolt")
    backend = BoltBackend({"bolt_path": BOLT, "modulepath": str(modules)})
    run = work(relay, backend, tmp_path, run_id=stored_task_run(scope))
    assert (run.status, run.outcome) == ("complete", "error")
    assert why in run.run_results["result"]["msg"]
    assert not bolt_log.exists()  # Bolt never started


def test_bolt_says_which_task_it_cannot_find(live_server, token, modules, bolt_log, tmp_path):
    relay = client(live_server, token, "bolt")
    backend = BoltBackend({"bolt_path": BOLT, "modulepath": str(modules)})
    run = work(relay, backend, tmp_path, task_run({"nodes": ["web1"]}, name="nosuch::task"))
    assert run.outcome == "error"
    assert run.run_results["result"]["msg"] == (
        "Bolt gave no results (it exited 1): bolt/unknown-task: Could not find a task named 'nosuch::task'."
        " For a list of available tasks, run 'bolt task show'."
    )


def test_the_orchestrator_gets_command_task_with_the_run_s_scope(live_server, token, pe, tmp_path):
    pe.queries["inventory[certname] { facts.os.family = 'RedHat' }"] = ["web1", "web2"]
    relay = client(live_server, token, "orchestrator", "pe")
    backend = OrchestratorBackend({"api_url": pe.url, "token": pe.token, "cacert": str(pe.ca)}, backoff=0.01)
    targets = [{"hostnames": ["win1"], "transport": "winrm", "user": "ops"}]
    body = task_run(
        {"query": "inventory[certname] { facts.os.family = 'RedHat' }"},
        environment="production",
        params={"name": "nginx", "action": "status"},
        noop=True,
        targets=targets,
    )
    run = work(relay, backend, tmp_path, body)

    assert (run.outcome, run.job_id) == ("finished", "81")
    assert [node["name"] for node in run.run_results["nodes"]] == ["web1", "web2"]
    [command] = [r for r in pe.seen if r["method"] == "POST" and r["path"].endswith("/command/task")]
    assert command["body"] == {
        "environment": "production",
        "scope": {"query": "inventory[certname] { facts.os.family = 'RedHat' }"},
        "task": "package",
        "params": {"name": "nginx", "action": "status"},
        "noop": True,
        "targets": targets,
        "description": f"Relay run {run.id}",
    }

    # A task run stored before scopes: its certnames are the scope's nodes.
    old = work(relay, backend, tmp_path, run_id=old_task_run(["web3"]))
    assert old.outcome == "finished"
    command = [r for r in pe.seen if r["method"] == "POST" and r["path"].endswith("/command/task")][-1]
    assert command["body"] == {
        "environment": "production",
        "scope": {"nodes": ["web3"]},
        "task": "package",
        "params": {},
        "noop": False,
        "targets": [],
        "description": f"Relay run {old.id}",
    }


def test_the_ssh_backend_refuses_task_runs_with_an_error_outcome(live_server, token, tmp_path):
    relay = client(live_server, token, "ssh")
    run = work(relay, SshBackend({}), tmp_path, run_id=stored_task_run({"nodes": ["web1"]}))
    assert (run.status, run.outcome) == ("complete", "error")
    assert run.run_results == {
        "result": {"msg": "The ssh backend cannot do task-runs; use the Bolt or PE orchestrator backend."}
    }


def test_a_bolt_task_outlives_a_bridge_restart(modules, bolt_log, tmp_path, monkeypatch):
    """The job's handle (kept in the run's record) finds the task's Bolt again, and its
    results are read as a task's, not as Puppet's."""
    monkeypatch.setenv("BOLT_STANDIN_ENV", json.dumps({"web1": {"TASK_SLEEP": "1"}}))
    (modules / "package" / "tasks" / "init.sh").write_text(
        '#!/bin/sh\nsleep "${TASK_SLEEP:-0}"\nprintf \'{"slept": "%s"}\\n\' "${TASK_SLEEP:-0}"\n'
    )
    backend = BoltBackend({"bolt_path": BOLT, "modulepath": str(modules)})
    run = {"id": "00000000-0000-0000-0000-000000000003", **task_run({"nodes": ["web1", "web2"]})}
    first = backend.start(run, tmp_path / "work")
    handle = json.loads(json.dumps(first.handle()))  # as the record keeps it
    wait_for(bolt_log.exists, 10, "Bolt to start")  # a restart comes later than its exec
    assert handle == {"kind": "bolt", "pid": first.pid, "nodes": ["web1", "web2"], "task": True}

    again = backend.attach(handle, tmp_path / "work")  # the bridge restarted meanwhile
    assert again.wait(30)
    outcome, results = again.result()
    assert outcome == "finished"
    assert [(node["name"], node["result"]) for node in results["nodes"]] == [
        ("web1", {"slept": "1"}),
        ("web2", {"slept": "0"}),
    ]
    first.wait(5)
