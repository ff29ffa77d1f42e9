"""The Bolt backend against the Bolt stand-in (tests/standins/bolt, contract §5): each
target judged by its own exit code, Bolt's connection errors as failed nodes, the command
line, and the password kept off it."""

import json
import os
import stat
from pathlib import Path

import pytest
from relay_bridge.backends import RunError, make
from relay_bridge.backends.bolt import BoltBackend
from relay_bridge.config import Config, ConfigError

from tests.sshd import write_fake_puppet

STANDIN = str(Path(__file__).parent / "standins" / "bolt")


@pytest.fixture
def puppet(tmp_path) -> Path:
    return write_fake_puppet(tmp_path)


@pytest.fixture
def bolt_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "bolt-calls"
    monkeypatch.setenv("BOLT_STANDIN_LOG", str(log))
    return log


def targets(monkeypatch, env: dict[str, dict[str, str]], unreachable: str = "") -> None:
    monkeypatch.setenv("BOLT_STANDIN_ENV", json.dumps(env))
    monkeypatch.setenv("BOLT_STANDIN_UNREACHABLE", unreachable)


def finish(job, timeout: float = 30) -> tuple[str, dict]:
    assert job.wait(timeout)
    outcome, results = job.result()
    if "nodes" not in results:
        return outcome, results
    return outcome, {node["name"]: node for node in results["nodes"]}


def run_on(nodes: list[str], **fields) -> dict:
    return {"id": "00000000-0000-0000-0000-000000000002", "type": "run", "scope": {"nodes": nodes}, **fields}


def test_each_target_is_judged_by_its_exit_code_not_by_bolt_s_status(tmp_path, puppet, monkeypatch, bolt_log):
    env = {n: {"FAKE_PUPPET_EXIT": c} for n, c in (("a", "2"), ("b", "0"), ("c", "4"), ("e", "6"))}
    targets(monkeypatch, env, unreachable="d")
    backend = BoltBackend({"bolt_path": STANDIN, "node_puppet_path": str(puppet)})
    outcome, nodes = finish(backend.start(run_on(["a", "b", "c", "d", "e"]), tmp_path))

    assert outcome == "failed"
    # Bolt said `failure` for a (exit 2): for Puppet that is "changes applied".
    assert (nodes["a"]["state"], nodes["a"]["exit_code"], nodes["a"]["meaning"]) == (
        "finished",
        2,
        "changes applied",
    )
    assert (nodes["b"]["state"], nodes["b"]["exit_code"]) == ("finished", 0)
    assert (nodes["c"]["state"], nodes["c"]["exit_code"]) == ("failed", 4)
    assert (nodes["e"]["state"], nodes["e"]["exit_code"]) == ("failed", 6)
    assert nodes["d"]["state"] == "failed"
    assert nodes["d"]["meaning"] == "Failed to connect to d: Connection refused - connect(2) for d:22"
    assert nodes["d"]["details"] == {"kind": "puppetlabs.tasks/connect-error"}
    assert "fake puppet on a with agent -t --no-noop" in nodes["a"]["output"]


def test_a_run_of_0s_and_2s_is_finished_though_bolt_exits_2(tmp_path, puppet, monkeypatch, bolt_log):
    targets(monkeypatch, {"a": {"FAKE_PUPPET_EXIT": "2"}, "b": {"FAKE_PUPPET_EXIT": "0"}})
    backend = BoltBackend({"bolt_path": STANDIN, "node_puppet_path": str(puppet)})
    job = backend.start(run_on(["a", "b"]), tmp_path)
    outcome, nodes = finish(job)
    assert [n["exit_code"] for n in nodes.values()] == [2, 0]
    assert job.proc.returncode == 2  # Bolt's verdict
    assert outcome == "finished"  # ours


def test_the_command_line_and_the_password_kept_off_it(tmp_path, puppet, monkeypatch, bolt_log):
    targets(monkeypatch, {})
    password = tmp_path / "password"
    password.write_text("s3cret-bolt-password\n")
    backend = BoltBackend(
        {
            "bolt_path": STANDIN,
            "node_puppet_path": str(puppet),
            "user": "deploy",
            "password_file": str(password),
            "host_key_check": False,
            "transport": "ssh",
            "concurrency": 3,
        }
    )
    finish(backend.start(run_on(["web1", "web2"], noop=True, environment="staging", debug=True), tmp_path))

    [call] = [json.loads(line) for line in bolt_log.read_text().splitlines()]
    argv = call["argv"]
    agent = f"{puppet} agent -t --noop --debug --environment staging --job-id {run_on([])['id']}"
    assert argv[:2] == ["command", "run"]
    assert argv[2].startswith(f"sh -c '{agent} 2>&1; rc=$?; f=$({puppet} config print lastrunreport")
    assert argv[3:] == [
        "--targets",
        "web1,web2",
        "--format",
        "json",
        "--no-tty",
        "--no-save-rerun",
        "--inventoryfile",
        str(tmp_path / "inventory.yaml"),
        "--concurrency",
        "3",
    ]
    assert "s3cret-bolt-password" not in " ".join(argv)
    assert call["inventory"] == {
        "version": 2,
        "config": {
            "transport": "ssh",
            "ssh": {"user": "deploy", "password": "s3cret-bolt-password", "host-key-check": False},
        },
    }
    assert stat.S_IMODE(os.stat(tmp_path / "inventory.yaml").st_mode) == 0o600


def test_each_target_s_last_run_report_comes_back_through_bolt(tmp_path, puppet, monkeypatch, bolt_log):
    run = run_on(["a", "b"], noop=True)
    fixture = Path(__file__).parent.parent / "bridge_client/tests/fixtures/reports/puppet-7.23-noop.yaml"
    report = tmp_path / "report.yaml"
    report.write_text(fixture.read_text().replace("job_id: relay-abc123", f"job_id: {run['id']}"))
    targets(monkeypatch, {"a": {"FAKE_PUPPET_REPORT": str(report)}, "b": {}})
    backend = BoltBackend({"bolt_path": STANDIN, "node_puppet_path": str(puppet)})
    outcome, nodes = finish(backend.start(run, tmp_path))

    assert outcome == "finished"
    assert (nodes["a"]["changes_pending"], nodes["a"]["resources_total"]) == (True, 3)
    assert [r["title"] for r in nodes["a"]["resources"]] == [
        "/srv/relay-e2e/target",
        "/srv/relay-e2e/newfile",
        "hello",
    ]
    assert (
        nodes["a"]["output"].strip() == f"Notice: fake puppet on a with agent -t --noop --job-id {run['id']}"
    )
    assert nodes["b"]["report_error"] == "The node printed no last run report (see the output)."


def test_over_winrm_puppet_runs_as_it_did_and_no_report_is_read(tmp_path, puppet):
    backend = BoltBackend({"bolt_path": STANDIN, "node_puppet_path": "puppet", "transport": "winrm"})
    assert backend.command(run_on(["a"])) == f"puppet agent -t --no-noop --job-id {run_on([])['id']}"


def test_bolt_that_gives_no_results_is_an_error_saying_so(tmp_path, puppet):
    backend = BoltBackend({"bolt_path": "/bin/false", "node_puppet_path": str(puppet)})
    outcome, results = finish(backend.start(run_on(["a"]), tmp_path))
    assert outcome == "error"
    assert results["result"]["msg"].startswith("Bolt gave no results (it exited 1)")


def test_a_missing_bolt_is_a_run_error(tmp_path, puppet):
    backend = BoltBackend({"bolt_path": str(tmp_path / "no-bolt"), "node_puppet_path": str(puppet)})
    with pytest.raises(RunError, match="Bolt could not be started"):
        backend.start(run_on(["a"]), tmp_path)


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"type": "run", "scope": {"query": "nodes {}"}}, "not scope `query`"),
        ({"type": "plan-run", "name": "deploy", "params": {}}, "cannot do plan-runs"),
        ({"type": "run", "scope": {"nodes": ["--inventoryfile=/etc/x"]}}, "not a valid certname"),
        # --targets reads a file for `@…`, and takes URIs: `local://` would run here, as root.
        ({"type": "run", "scope": {"nodes": ["@/etc/relay/targets"]}}, "not a valid certname"),
        ({"type": "run", "scope": {"nodes": ["local://localhost"]}}, "not a valid certname"),
        ({"type": "run", "scope": {"nodes": ["web*"]}}, "not a valid certname"),
        ({"type": "run", "scope": {"nodes": ["a,b"]}}, "not a valid certname"),
        ({"type": "run", "scope": {"nodes": ["a"]}, "environment": "--x"}, "not a valid environment name"),
    ],
)
def test_what_bolt_cannot_do_is_a_run_error(tmp_path, run, message, bolt_log):
    backend = BoltBackend({"bolt_path": STANDIN})
    with pytest.raises(RunError, match=message):
        backend.start({"id": "x", **run}, tmp_path / "work")
    assert not bolt_log.exists() and not (tmp_path / "work").exists()  # Bolt never started


def test_bolt_in_path_is_the_backend_when_none_is_configured(tmp_path):
    config = Config(
        "https://relay.example/", "rlyp_x", None, {"bolt": {"bolt_path": STANDIN}}, None, tmp_path
    )
    backend = make(config, which=lambda name: STANDIN if name == "bolt" else None, pe=False)
    assert (backend.name, backend.platform) == ("bolt", "oss")
    with pytest.raises(ConfigError) as error:
        BoltBackend({"concurency": 3})
    assert error.value.key == "backend_bolt_concurency"
