"""The bridge's SSH backend against a real OpenSSH server, with a stand-in `puppet` on the
"nodes" (ssh config aliases of that server) that exits as each node is told to."""

import base64
import time
from pathlib import Path

import pytest
from relay_bridge import reports
from relay_bridge.backends import RunError, choose
from relay_bridge.backends.ssh import SshBackend
from relay_bridge.config import Config, ConfigError

from tests.sshd import Sshd, alive

RUN_ID = "00000000-0000-0000-0000-000000000001"


def run_on(nodes: list[str], **fields) -> dict:
    return {"id": RUN_ID, "type": "run", "scope": {"nodes": nodes}, **fields}


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
    assert (
        results["exit-4"]["output"]
        == f"Notice: fake puppet on exit-4 with agent -t --no-noop --job-id {RUN_ID}"
    )
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
        ({"noop": True}, f"agent -t --noop --job-id {RUN_ID}"),
        ({"noop": False}, f"agent -t --no-noop --job-id {RUN_ID}"),
        (
            {"noop": False, "debug": True, "trace": True, "evaltrace": True, "environment": "staging"},
            f"agent -t --no-noop --debug --trace --evaltrace --environment staging --job-id {RUN_ID}",
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
    # Each Puppet run lasts long enough (1.5 s) that three overlap even when a loaded machine
    # takes a second to open an SSH session (0.4 s saw two at once under load).
    nodes = {f"n{i}": {"FAKE_PUPPET_LOG": str(log), "FAKE_PUPPET_SLEEP": "1.5"} for i in range(7)}
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
    assert backend.puppet_command(run_on(["a"], noop=True)) == (
        "sh -c 'sh -c '\"'\"'echo \"relay-bridge: pid $$\"; "
        f"exec puppet agent -t --noop --job-id {RUN_ID} 2>&1'\"'\"'; rc=$?; "
        "f=$(puppet config print lastrunreport --section agent 2>/dev/null); "
        "echo '\"'\"'relay-bridge: last run report'\"'\"'; "
        '[ -n "$f" ] && head -c 16777217 -- "$f" 2>/dev/null | base64; '
        "echo '\"'\"'relay-bridge: end of report'\"'\"'; exit $rc'"
    )
    sudo = SshBackend({"sudo": True, "node_puppet_path": "/opt/puppetlabs/bin/puppet"})
    command = sudo.puppet_command(run_on(["a"]))
    assert f"exec sudo -n /opt/puppetlabs/bin/puppet agent -t --no-noop --job-id {RUN_ID} 2>&1" in command
    assert "f=$(sudo -n /opt/puppetlabs/bin/puppet config print lastrunreport --section agent" in command
    assert 'sudo -n head -c 16777217 -- "$f"' in command
    # Without reports, Puppet takes the shell's place, as it always did.
    plain = SshBackend({"report_max_bytes": 0})
    assert plain.puppet_command(run_on(["a"])) == (
        f'echo "relay-bridge: pid $$"; exec puppet agent -t --no-noop --job-id {RUN_ID}'
    )
    assert Path(backend.client).name == "ssh"


REPORTS = Path(__file__).resolve().parent.parent / "bridge_client" / "tests" / "fixtures" / "reports"


def node_report(tmp_path: Path, job_id: str = RUN_ID, name: str = "noop") -> Path:
    """A last run report real Puppet wrote in noop, as if this run's (its job id)."""
    path = tmp_path / f"report-{name}-{job_id}.yaml"
    text = (REPORTS / f"puppet-7.23-{name}.yaml").read_text()
    path.write_text(text.replace("job_id: relay-abc123", f"job_id: {job_id}"))
    return path


def test_each_node_s_last_run_report_says_what_would_change(sshd, tmp_path):
    nodes = {"web": {"FAKE_PUPPET_REPORT": str(node_report(tmp_path))}, "db": {}}
    backend = backend_for(sshd, nodes)
    outcome, results = finish(backend.start(run_on(["web", "db"], noop=True), tmp_path / "work"))

    assert outcome == "finished"
    web = results["web"]
    assert web["changes_pending"] is True
    assert web["resources_total"] == 3
    assert web["resources"][0] == {
        "type": "File",
        "title": "/srv/relay-e2e/target",
        "changes": [
            {
                "property": "content",
                "from": "{sha256}369b74f2003ce39f5829ec7a2f84852b72b610d0312c8951d5d8f7316c9902ba",
                "to": "{sha256}c191cdc9d1cbb23832d2bf4696f83604c66714cafb34e367022962500d9b9652",
                "status": "noop",
            },
            {"property": "mode", "from": "0644", "to": "0640", "status": "noop"},
        ],
    }
    assert web["report"]["transaction_uuid"] == "ceff85f8-f6b8-4c94-8229-79f2f7825618"
    # The output is what Puppet printed, not the report after it.
    assert web["output"] == f"Notice: fake puppet on web with agent -t --noop --job-id {RUN_ID}"
    # A node whose Puppet left no report says so, and that nothing is known.
    assert (results["db"]["changes_pending"], results["db"]["report_error"]) == (
        None,
        "The node printed no last run report (see the output).",
    )


def test_a_report_another_run_left_is_not_taken_for_this_run_s(sshd, tmp_path):
    other = node_report(tmp_path, job_id="11111111-1111-1111-1111-111111111111")
    backend = backend_for(sshd, {"a": {"FAKE_PUPPET_REPORT": str(other), "FAKE_PUPPET_EXIT": "1"}})
    _, results = finish(backend.start(run_on(["a"], noop=True), tmp_path / "work"))
    assert results["a"]["changes_pending"] is None
    assert results["a"]["report_error"] == (
        "The node's last run report is another run's (job id '11111111-1111-1111-1111-111111111111')."
    )


def test_what_puppet_prints_cannot_pose_as_the_report(sshd, tmp_path):
    """A manifest can make Puppet print anything: marks and a report saying nothing changes."""
    fake = node_report(tmp_path, name="clean").read_text().replace("job_id: clean-1", f"job_id: {RUN_ID}")
    fake = fake.replace("noop_pending: true", "noop_pending: false")
    printed = tmp_path / "printed"
    printed.write_bytes(
        reports.REPORT_MARK + base64.encodebytes(fake.encode()) + reports.END_MARK + b"Notice: more\n"
    )
    node = {"FAKE_PUPPET_REPORT": str(node_report(tmp_path)), "FAKE_PUPPET_PRINT": str(printed)}
    backend = backend_for(sshd, {"a": node})
    _, results = finish(backend.start(run_on(["a"], noop=True), tmp_path / "work"))
    assert results["a"]["changes_pending"] is True
    assert results["a"]["resources_total"] == 3
    assert results["a"]["output"].endswith("relay-bridge: end of report\nNotice: more")


def test_a_report_larger_than_report_max_bytes_is_not_read(sshd, tmp_path):
    backend = backend_for(
        sshd, {"a": {"FAKE_PUPPET_REPORT": str(node_report(tmp_path))}}, report_max_bytes=1000
    )
    _, results = finish(backend.start(run_on(["a"], noop=True), tmp_path / "work"))
    assert results["a"]["report_error"] == "The node's last run report is larger than 1000 bytes; not read."


def test_with_report_max_bytes_0_no_report_is_read(sshd, tmp_path):
    backend = backend_for(sshd, {"a": {"FAKE_PUPPET_REPORT": str(node_report(tmp_path))}}, report_max_bytes=0)
    _, results = finish(backend.start(run_on(["a"], noop=True), tmp_path / "work"))
    assert {"changes_pending", "report_error", "resources"}.isdisjoint(results["a"])
