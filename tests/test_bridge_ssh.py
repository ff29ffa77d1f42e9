"""The bridge's SSH backend against a real OpenSSH server, with a stand-in `puppet` on the
"nodes" (ssh config aliases of that server) that exits as each node is told to."""

import time
from pathlib import Path

import pytest
from relay_bridge.backends import RunError, choose
from relay_bridge.backends.ssh import SshBackend
from relay_bridge.config import Config, ConfigError

from tests.sshd import Sshd, alive


def run_on(nodes: list[str], **fields) -> dict:
    return {"id": "00000000-0000-0000-0000-000000000001", "type": "run", "scope": {"nodes": nodes}, **fields}


def finish(job, timeout: float = 30) -> tuple[str, dict]:
    assert job.wait(timeout), "the job did not finish"
    outcome, results = job.result()
    return outcome, {node["name"]: node for node in results["nodes"]}


def backend_for(sshd: Sshd, nodes: dict[str, dict[str, str]], unreachable=(), **options) -> SshBackend:
    config = sshd.write_config(nodes, unreachable)
    return SshBackend(sshd.options(config, node_puppet_path=str(sshd.fake_puppet()), **options))


def test_every_exit_code_is_judged_as_the_contract_says(sshd, tmp_path):
    nodes = {f"exit-{code}": {"FAKE_PUPPET_EXIT": str(code)} for code in (0, 2, 4, 6, 1)}
    backend = backend_for(sshd, nodes, parallelism=5)
    outcome, results = finish(backend.start(run_on(list(nodes)), tmp_path))

    assert outcome == "failed"
    assert {name: (r["state"], r["exit_code"]) for name, r in results.items()} == {
        "exit-0": ("finished", 0),
        "exit-2": ("finished", 2),
        "exit-4": ("failed", 4),
        "exit-6": ("failed", 6),
        "exit-1": ("failed", 1),
    }
    assert results["exit-0"]["meaning"] == "no changes"
    assert results["exit-2"]["meaning"] == "changes applied"
    assert results["exit-4"]["meaning"] == "some resources failed"
    assert results["exit-6"]["meaning"] == "changes applied and some resources failed"
    assert "another run" in results["exit-1"]["meaning"]
    # The tail of what the node printed, without the bridge's own pid line.
    assert results["exit-4"]["output"] == "Notice: fake puppet on exit-4 with agent -t --no-noop"
    assert all(r["duration"] > 0 for r in results.values())


def test_a_run_where_every_node_exits_0_or_2_is_finished(sshd, tmp_path):
    backend = backend_for(sshd, {"a": {"FAKE_PUPPET_EXIT": "0"}, "b": {"FAKE_PUPPET_EXIT": "2"}})
    outcome, results = finish(backend.start(run_on(["a", "b"]), tmp_path))
    assert outcome == "finished"
    assert [r["exit_code"] for r in results.values()] == [0, 2]


def test_a_node_that_refuses_ssh_fails_alone_and_the_others_go_on(sshd, tmp_path):
    nodes = {"up-1": {"FAKE_PUPPET_EXIT": "2"}, "down": {}, "up-2": {"FAKE_PUPPET_EXIT": "0"}}
    backend = backend_for(sshd, nodes, unreachable=("down",), parallelism=1)
    outcome, results = finish(backend.start(run_on(list(nodes)), tmp_path))

    assert outcome == "failed"
    assert results["down"]["state"] == "failed"
    assert results["down"]["exit_code"] == 255
    assert results["down"]["meaning"] == "could not connect or log in over SSH"
    assert "Connection refused" in results["down"]["output"]
    assert (results["up-1"]["state"], results["up-2"]["state"]) == ("finished", "finished")


def test_a_node_whose_key_is_not_accepted_fails(sshd, tmp_path):
    backend = backend_for(sshd, {"a": {}})
    backend.identity_file = str(tmp_path / "no-such-key")
    outcome, results = finish(backend.start(run_on(["a"]), tmp_path / "work"))
    assert outcome == "failed"
    assert results["a"]["exit_code"] == 255
    assert "Permission denied" in results["a"]["output"]


@pytest.mark.parametrize("evil", ["-oProxyCommand=touch {marker}", "Good", "good\n", "user@good", "good:22"])
def test_a_node_name_that_is_not_a_certname_is_refused_before_anything_runs(sshd, tmp_path, evil):
    """As strict as the service (its certname rule): never an option ssh would read, nor a
    user@host or host:port the workflow could slip in."""
    marker, calls = tmp_path / "pwned", tmp_path / "calls"
    evil = evil.format(marker=marker)
    backend = backend_for(sshd, {"good": {"FAKE_PUPPET_LOG": str(calls)}})
    with pytest.raises(RunError, match="not a valid certname"):
        backend.start(run_on(["good", evil]), tmp_path / "work")
    assert not marker.exists() and not calls.exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("fields", "flags"),
    [
        ({"noop": True}, "agent -t --noop"),
        ({"noop": False}, "agent -t --no-noop"),
        (
            {"noop": False, "debug": True, "trace": True, "evaltrace": True, "environment": "staging"},
            "agent -t --no-noop --debug --trace --evaltrace --environment staging",
        ),
    ],
)
def test_the_run_s_flags_reach_puppet(sshd, tmp_path, fields, flags):
    log = tmp_path / "calls"
    backend = backend_for(sshd, {"a": {"FAKE_PUPPET_LOG": str(log)}})
    finish(backend.start(run_on(["a"], **fields), tmp_path / "work"))
    assert log.read_text().splitlines()[0].split(" ", 4)[4] == flags


def test_parallelism_bounds_the_nodes_worked_at_once(sshd, tmp_path):
    log = tmp_path / "calls"
    nodes = {f"n{i}": {"FAKE_PUPPET_LOG": str(log), "FAKE_PUPPET_SLEEP": "0.4"} for i in range(7)}
    backend = backend_for(sshd, nodes, parallelism=3)
    outcome, _ = finish(backend.start(run_on(list(nodes)), tmp_path / "work"))
    assert outcome == "finished"

    events = sorted(
        (float(line.split()[1]), 1 if line.startswith("start") else -1)
        for line in log.read_text().splitlines()
    )
    running, most = 0, 0
    for _, change in events:
        running += change
        most = max(most, running)
    assert len(events) == 14
    assert most == 3


def test_stop_kills_puppet_on_the_node_and_skips_nodes_not_started(sshd, tmp_path):
    log = tmp_path / "calls"
    nodes = {f"n{i}": {"FAKE_PUPPET_LOG": str(log), "FAKE_PUPPET_SLEEP": "60"} for i in range(3)}
    backend = backend_for(sshd, nodes, parallelism=2)
    job = backend.start(run_on(list(nodes)), tmp_path / "work")
    deadline = time.monotonic() + 20
    while (not log.exists() or len(log.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(line.split()[2]) for line in log.read_text().splitlines()]
    assert len(pids) == 2 and all(alive(pid) for pid in pids)

    started = time.monotonic()
    job.stop()
    outcome, results = finish(job, timeout=15)
    assert time.monotonic() - started < 10
    assert outcome == "failed"
    assert results["n2"]["state"] == "skipped"
    assert {results["n0"]["meaning"], results["n1"]["meaning"]} == {"stopped before Puppet finished"}
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids), "Puppet still runs on the node"


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"type": "run", "scope": {"query": "nodes[certname] {}"}}, "not scope `query`"),
        ({"type": "run", "scope": {"node_group": "abc"}}, "not scope `node_group`"),
        ({"type": "task-run", "name": "package", "params": {}, "targets": ["a"]}, "cannot do task-runs"),
        ({"type": "plan-run", "name": "deploy", "params": {}}, "cannot do plan-runs"),
        ({"type": "run", "scope": {"nodes": []}}, "names no nodes"),
    ],
)
def test_what_ssh_cannot_do_is_a_run_error_saying_why(sshd, tmp_path, run, message):
    backend = backend_for(sshd, {"a": {}})
    with pytest.raises(RunError, match=message):
        backend.start({"id": "x", **run}, tmp_path)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"paralelism": 3}, "backend_ssh_paralelism"),
        ({"parallelism": "many"}, "backend_ssh_parallelism"),
        ({"parallelism": 0}, "backend_ssh_parallelism"),
        ({"port": "ssh"}, "backend_ssh_port"),
        ({"sudo": "maybe"}, "backend_ssh_sudo"),
        ({"ssh_options": ["NoEquals"]}, "backend_ssh_ssh_options"),
    ],
)
def test_bad_options_name_their_key(options, key):
    with pytest.raises(ConfigError) as error:
        SshBackend(options)
    assert error.value.key == key


def test_the_backend_is_chosen_as_the_rfc_says(tmp_path):
    config = Config("https://relay.example/", "rlyp_x", None, {}, None, tmp_path)
    assert choose(config, which=lambda name: None) == "ssh"
    assert choose(config, which=lambda name: "/usr/bin/bolt" if name == "bolt" else None) == "bolt"
    configured = Config("https://relay.example/", "rlyp_x", "ssh", {}, None, tmp_path)
    assert choose(configured, which=lambda name: "/usr/bin/bolt") == "ssh"


def test_the_ssh_command_line(tmp_path):
    backend = SshBackend({"user": "deploy", "identity_file": "/k", "port": 2222, "ssh_options": ["A=b"]})
    argv = backend.ssh_argv("web1.example.com", "true")
    assert argv[:5] == ["ssh", "-T", "-o", "BatchMode=yes", "-o"]
    assert argv[-3:] == ["--", "web1.example.com", "true"]
    assert ["-l", "deploy"] == argv[argv.index("-l") : argv.index("-l") + 2]
    assert "IdentitiesOnly=yes" in argv and "A=b" in argv and "2222" in argv
    assert (
        backend.puppet_command({"noop": True}) == 'echo "relay-bridge: pid $$"; exec puppet agent -t --noop'
    )
    sudo = SshBackend({"sudo": True, "node_puppet_path": "/opt/puppetlabs/bin/puppet"})
    assert sudo.puppet_command({}).endswith("exec sudo -n /opt/puppetlabs/bin/puppet agent -t --no-noop")
    assert Path(backend.client).name == "ssh"
