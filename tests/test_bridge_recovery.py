"""Crash recovery: `relay-bridge serve` SIGKILLed mid-run, for each backend, then started
again. It finds the runs it held in its state_dir, re-attaches to Puppet's work if that is
still there (SSH and Bolt children, the PE job) and finishes the run, or completes it
`error` saying why when the work is gone. Puppet is never started twice."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runs.models import Run
from tests.bridge_helpers import (
    RELAY_BRIDGE,
    bridge_config,
    completed,
    config_file,
    in_progress,
    log_lines,
    relay_bridge,
    serve,
    wait_for,
)
from tests.sshd import alive, write_fake_puppet
from tests.standins.orchestrator import Orchestrator

pytestmark = pytest.mark.django_db(transaction=True)
BOLT = str(Path(__file__).parent / "standins" / "bolt")
REPORTS = Path(__file__).resolve().parent.parent / "bridge_client" / "tests" / "fixtures" / "reports"


def kill(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGKILL)
    server.wait(10)


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0


def restart_until_complete(config: Path, log: Path, run_id: str) -> Run:
    """Start the bridge again, let it finish the run it held, stop it."""
    server = serve(config, log)
    try:
        return completed(run_id)
    finally:
        stop(server)


def status(config: Path) -> list[dict]:
    done = subprocess.run(
        [RELAY_BRIDGE, "--config", str(config), "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_ssh_a_killed_bridge_re_attaches_to_the_running_node_and_finishes(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    node = {"FAKE_PUPPET_SLEEP": "3", "FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(
        tmp_path, service, sshd, {"a": node, "b": {"FAKE_PUPPET_LOG": str(calls)}}, heartbeat=0.3
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    run_id = service.client.create_run({"scope": {"nodes": ["a", "b"]}})["id"]
    in_progress(run_id)
    puppet_pid = int(wait_for(lambda: _started(calls, "a")))
    kill(server)

    [held] = status(config)
    assert (held["run"], held["backend"], held["worked"]) == (run_id, "ssh", False)
    assert alive(puppet_pid)  # Puppet on the node does not care that the bridge died
    beat = Run.objects.get(pk=run_id).updated_at

    run = restart_until_complete(config, log, run_id)
    assert run.outcome == "finished"
    assert run.updated_at > beat
    nodes = {n["name"]: n for n in run.run_results["nodes"]}
    assert (nodes["a"]["exit_code"], nodes["b"]["exit_code"]) == (2, 0)
    starts = [line for line in calls.read_text().splitlines() if line.startswith("start")]
    assert len(starts) == 2  # one per node: nothing ran twice
    assert any("resuming: re-attached" in line for line in log_lines(log, run_id))
    assert status(config) == []


def test_ssh_a_node_that_ended_while_the_bridge_was_down_is_read_from_its_files(service, sshd, tmp_path):
    calls, report = tmp_path / "calls", tmp_path / "report.yaml"
    node = {"FAKE_PUPPET_SLEEP": "1", "FAKE_PUPPET_EXIT": "6", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(
        tmp_path, service, sshd, {"a": {**node, "FAKE_PUPPET_REPORT": str(report)}}, heartbeat=0.3
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    run_id = service.client.create_run({"scope": {"nodes": ["a"]}, "noop": True})["id"]
    # The node's last run report, as Puppet writes it when the run ends (after its sleep).
    report.write_text((REPORTS / "puppet-7.23-noop.yaml").read_text().replace("relay-abc123", run_id))
    in_progress(run_id)
    kill(server)
    wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) == 2, 20, "Puppet to end")
    time.sleep(0.3)

    # Restarted without reading reports: the report the node printed for this run is read.
    text = config.read_text()
    config.write_text(text + "backend_ssh_report_max_bytes: 0\n")
    run = restart_until_complete(config, log, run_id)
    assert run.outcome == "failed"
    [node] = run.run_results["nodes"]
    assert node["exit_code"] == 6
    assert (node["changes_pending"], node["resources_total"]) == (True, 3)
    assert "relay-bridge:" not in node["output"]


def test_bolt_a_killed_bridge_re_attaches_to_bolt_and_finishes(service, tmp_path, monkeypatch):
    puppet = write_fake_puppet(tmp_path)
    calls = tmp_path / "bolt-calls"
    monkeypatch.setenv("BOLT_STANDIN_LOG", str(calls))
    monkeypatch.setenv(
        "BOLT_STANDIN_ENV", json.dumps({"a": {"FAKE_PUPPET_SLEEP": "3", "FAKE_PUPPET_EXIT": "2"}})
    )
    config = config_file(tmp_path, service, "bolt", {"bolt_path": BOLT, "node_puppet_path": str(puppet)}, 0.3)
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    run_id = service.client.create_run({"scope": {"nodes": ["a", "b"]}})["id"]
    in_progress(run_id)
    bolt_pid = json.loads(wait_for(lambda: calls.exists() and calls.read_text()))["pid"]
    kill(server)
    assert alive(bolt_pid)

    run = restart_until_complete(config, log, run_id)
    assert run.outcome == "finished"
    assert [n["exit_code"] for n in run.run_results["nodes"]] == [2, 0]
    assert len(calls.read_text().splitlines()) == 1  # Bolt ran once


def test_bolt_gone_while_the_bridge_was_down_completes_error_saying_why(service, tmp_path, monkeypatch):
    puppet = write_fake_puppet(tmp_path)
    calls = tmp_path / "bolt-calls"
    monkeypatch.setenv("BOLT_STANDIN_LOG", str(calls))
    monkeypatch.setenv("BOLT_STANDIN_ENV", json.dumps({"a": {"FAKE_PUPPET_SLEEP": "30"}}))
    config = config_file(tmp_path, service, "bolt", {"bolt_path": BOLT, "node_puppet_path": str(puppet)}, 0.3)
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
    in_progress(run_id)
    bolt_pid = json.loads(wait_for(lambda: calls.exists() and calls.read_text()))["pid"]
    kill(server)
    os.killpg(bolt_pid, signal.SIGKILL)  # the machine lost it too
    wait_for(lambda: not alive(bolt_pid), 10)

    run = restart_until_complete(config, log, run_id)
    assert run.outcome == "error"
    assert run.run_results["result"]["msg"] == (
        "The bridge restarted and could not find Puppet's work again: "
        "Bolt ended while the bridge was down and left no results."
    )


def test_orchestrator_a_killed_bridge_re_attaches_to_the_pe_job(service, tmp_path):
    pe = Orchestrator(tmp_path / "pe")
    pe.script = ["running"] * 12 + ["finished"]
    options = {"api_url": pe.url, "token": pe.token, "cacert": str(pe.ca)}
    config = config_file(tmp_path, service, "orchestrator", options, 0.2)
    log = tmp_path / "bridge.log"
    try:
        server = serve(config, log)
        run_id = service.client.create_run({"scope": {"nodes": ["a"]}, "environment": "production"})["id"]
        in_progress(run_id)
        wait_for(lambda: sum(r["path"].endswith("/jobs/81") for r in pe.seen) >= 2, 20)
        kill(server)
        [held] = status(config)
        assert held["job"] == {"kind": "orchestrator", "job": "81", "plan": False}

        server = serve(config, log)
        try:
            run = completed(run_id)
        finally:
            stop(server)
    finally:
        pe.stop()
    assert (run.outcome, run.job_id) == ("finished", "81")
    assert len([r for r in pe.seen if r["path"].endswith("/command/deploy")]) == 1


def test_a_run_held_by_a_live_bridge_is_not_taken_by_a_second_on_the_same_host(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    node = {"FAKE_PUPPET_SLEEP": "2", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(tmp_path, service, sshd, {"a": node}, heartbeat=0.3)
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    try:
        run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
        in_progress(run_id)
        [held] = status(config)
        assert held["worked"] is True
        assert relay_bridge(config, "poll", "--once", log=tmp_path / "poll.log").wait(30) == 0
        assert any("forked=0" in line for line in log_lines(tmp_path / "poll.log"))
        assert completed(run_id).outcome == "finished"
    finally:
        stop(server)
    assert len(calls.read_text().splitlines()) == 2


def test_poll_once_resumes_what_a_killed_bridge_held(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    node = {"FAKE_PUPPET_SLEEP": "2", "FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(tmp_path, service, sshd, {"a": node}, heartbeat=0.3)
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
    in_progress(run_id)
    kill(server)

    assert relay_bridge(config, "poll", "--once", log=log).wait(30) == 0  # what the next timer tick does
    run = completed(run_id)
    assert (run.outcome, run.run_results["nodes"][0]["exit_code"]) == ("finished", 2)
    assert len(calls.read_text().splitlines()) == 2


def _started(calls: Path, node: str) -> str | None:
    """The pid of the stand-in Puppet on `node`, once it has started."""
    lines = calls.read_text().splitlines() if calls.exists() else []
    return next(
        (line.split()[2] for line in lines if line.startswith("start") and line.split()[3] == node), None
    )
