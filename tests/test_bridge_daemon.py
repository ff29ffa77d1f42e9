"""`relay-bridge` (poll --once, serve) against a live server of the project and the tests'
sshd, with a stand-in `puppet` on the nodes: the RFC's run flow, cancel, shutdown, bounded
concurrency, the service failing in every way, and configuration errors."""

import signal
import subprocess
import time
from datetime import timedelta

import pytest
from relay_bridge.api import RelayClient

from runs.models import Run, RunTransition
from tests.bridge_helpers import (
    RELAY_BRIDGE,
    Service,
    bridge_config,
    completed,
    log_lines,
    relay_bridge,
    wait_for,
)
from tests.sshd import alive

pytestmark = pytest.mark.django_db(transaction=True)


def new_run(service: Service, nodes: list[str], **fields) -> str:
    return service.client.create_run({"scope": {"nodes": nodes}, **fields})["id"]


def test_poll_once_forks_a_daemon_that_works_the_run_and_exits_at_once(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    nodes = {"web1": {"FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_SLEEP": "2", "FAKE_PUPPET_LOG": str(calls)}}
    config = bridge_config(tmp_path, service, sshd, nodes)
    run_id = new_run(service, ["web1"], environment="production")
    log = tmp_path / "bridge.log"

    started = time.monotonic()
    poller = relay_bridge(config, "poll", "--once", log=log)
    assert poller.wait(10) == 0
    # The parent is gone while Puppet still runs: the work is the daemon's.
    assert time.monotonic() - started < 2
    assert Run.objects.get(pk=run_id).status != "complete"

    in_progress = wait_for(lambda: Run.objects.filter(pk=run_id, status="in-progress").first())
    promised = in_progress.next_update_before - in_progress.updated_at
    assert timedelta(seconds=1.2) < promised <= timedelta(seconds=1.6)  # 3 x the 0.5 s heartbeat

    run = completed(run_id)
    assert run.outcome == "finished"
    [node] = run.run_results["nodes"]
    assert (node["name"], node["state"], node["exit_code"]) == ("web1", "finished", 2)
    assert node["meaning"] == "changes applied"
    assert "fake puppet on web1 with agent -t --no-noop --environment production" in node["output"]
    assert [(t.from_status, t.to_status) for t in RunTransition.objects.filter(run_id=run_id)] == [
        ("pending", "accepted"),
        ("accepted", "in-progress"),
        ("in-progress", "complete"),
    ]
    # It heartbeated while Puppet ran (2 s at 0.5 s), and told the service what it is.
    assert run.updated_at > in_progress.updated_at
    run.connection.refresh_from_db()
    assert (run.connection.reported_platform, run.connection.reported_backend) == ("oss", "ssh")
    assert len(calls.read_text().splitlines()) == 2  # Puppet ran once: start and end
    lines = log_lines(log, run_id)
    assert any("msg=accepted" in line for line in lines)
    assert any("msg=completed" in line and "outcome=finished" in line for line in lines)
    assert service.token not in log.read_text()
    # The work directory is cleaned up (after the final PUT, so the run may show complete first).
    wait_for(lambda: not list((tmp_path / "state" / "runs").iterdir()), 10, "the work directory to go")


@pytest.mark.parametrize("same_host", [False, True])
def test_two_bridges_that_both_saw_a_run_work_it_once(service, sshd, tmp_path, same_host):
    """Both listed the run: on two hosts the service's accept picks one (409 for the
    other); on one host the run's lock file does, before either asks the service."""
    import threading

    from relay_bridge.backends.ssh import SshBackend
    from relay_bridge.worker import RunWorker

    calls = tmp_path / "calls"
    ssh_config = sshd.write_config({"a": {"FAKE_PUPPET_LOG": str(calls), "FAKE_PUPPET_SLEEP": "0.5"}})
    backend = SshBackend(sshd.options(ssh_config, node_puppet_path=str(sshd.fake_puppet())))
    run_id = new_run(service, ["a"])
    run = service.client.get_run(run_id)
    barrier = threading.Barrier(2)
    outcomes = []

    def bridge(number: int) -> None:
        client = RelayClient(service.url, service.token, platform="oss", backend="ssh", attempts=1)
        state_dir = tmp_path / ("state" if same_host else f"state-{number}")
        worker = RunWorker(client, backend, run, state_dir, heartbeat=0.2)
        barrier.wait()
        outcomes.append(worker.work())
        client.close()

    threads = [threading.Thread(target=bridge, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes, key=str) == [None, "finished"]
    assert Run.objects.get(pk=run_id).outcome == "finished"
    assert len(calls.read_text().splitlines()) == 2  # Puppet ran once: start and end
    accepts = RunTransition.objects.filter(run_id=run_id, to_status="accepted").count()
    assert accepts == 1


def test_a_cancel_stops_puppet_on_the_node_and_completes_the_run_cancelled(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    config = bridge_config(
        tmp_path, service, sshd, {"a": {"FAKE_PUPPET_SLEEP": "120", "FAKE_PUPPET_LOG": str(calls)}}
    )
    run_id = new_run(service, ["a"])
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)
    wait_for(lambda: Run.objects.filter(pk=run_id, status="in-progress").exists())
    pid = int(wait_for(lambda: calls.exists() and calls.read_text().split()[2]))
    assert alive(pid)

    service.client.cancel(run_id)
    run = completed(run_id, timeout=15)
    assert run.outcome == "cancelled"
    assert run.run_results["nodes"][0]["meaning"] == "stopped before Puppet finished"
    wait_for(lambda: not alive(pid), 5, "Puppet to stop on the node")


def test_a_scope_the_backend_cannot_do_completes_error_saying_why(service, sshd, tmp_path):
    config = bridge_config(tmp_path, service, sshd, {})
    run_id = service.client.create_run(
        {"scope": {"query": "inventory[certname] { facts.os.family = 'Debian' }"}}
    )["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)
    run = completed(run_id)
    assert run.outcome == "error"
    assert (
        "can only run on a list of nodes (scope `nodes`), not scope `query`"
        in run.run_results["result"]["msg"]
    )


def test_serve_picks_up_a_new_run_through_the_long_poll_in_under_a_second(service, sshd, tmp_path):
    config = bridge_config(tmp_path, service, sshd, {"a": {"FAKE_PUPPET_EXIT": "0"}})
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", "--wait", "5", log=log)
    try:
        wait_for(lambda: any("msg=serving" in line for line in log_lines(log)))
        time.sleep(1)  # the long-poll is waiting now
        latencies = []
        for _ in range(3):
            run_id = new_run(service, ["a"])
            run = completed(run_id)
            accepted = RunTransition.objects.get(run_id=run_id, to_status="accepted").at
            latencies.append((accepted - run.created_at).total_seconds())
            assert run.outcome == "finished"
            time.sleep(0.3)
        assert max(latencies) < 1.0, latencies
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0


def test_serve_works_at_most_max_concurrent_runs_at_once(service, sshd, tmp_path):
    config = bridge_config(tmp_path, service, sshd, {"a": {"FAKE_PUPPET_SLEEP": "1"}})
    log = tmp_path / "bridge.log"
    run_ids = [new_run(service, ["a"]) for _ in range(5)]
    server = relay_bridge(config, "serve", "--max-concurrent", "2", "--wait", "2", log=log)
    try:
        runs = [completed(run_id) for run_id in run_ids]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
    assert {run.outcome for run in runs} == {"finished"}
    spans = []
    for run_id in run_ids:
        times = {t.to_status: t.at for t in RunTransition.objects.filter(run_id=run_id)}
        spans += [(times["accepted"], 1), (times["complete"], -1)]
    held, most = 0, 0
    for _, change in sorted(spans):
        held += change
        most = max(most, held)
    assert most == 2


def test_sigterm_lets_puppet_finish_within_the_stop_timeout(service, sshd, tmp_path):
    config = bridge_config(
        tmp_path, service, sshd, {"a": {"FAKE_PUPPET_SLEEP": "1.5", "FAKE_PUPPET_EXIT": "2"}}
    )
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", "--wait", "2", "--stop-timeout", "30", log=log)
    run_id = new_run(service, ["a"])
    wait_for(lambda: Run.objects.filter(pk=run_id, status="in-progress").exists())
    server.send_signal(signal.SIGTERM)
    assert server.wait(20) == 0
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.outcome) == ("complete", "finished")


def test_sigterm_stops_puppet_after_the_stop_timeout_and_completes_error(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    config = bridge_config(
        tmp_path, service, sshd, {"a": {"FAKE_PUPPET_SLEEP": "120", "FAKE_PUPPET_LOG": str(calls)}}
    )
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", "--wait", "2", "--stop-timeout", "1", log=log)
    run_id = new_run(service, ["a"])
    wait_for(lambda: Run.objects.filter(pk=run_id, status="in-progress").exists())
    pid = int(wait_for(lambda: calls.exists() and calls.read_text().split()[2]))
    started = time.monotonic()
    server.send_signal(signal.SIGTERM)
    assert server.wait(20) == 0
    assert time.monotonic() - started < 10
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.outcome) == ("complete", "error")
    assert (
        run.run_results["result"]["msg"]
        == "The bridge was stopped before Puppet finished; Puppet was stopped."
    )
    wait_for(lambda: not alive(pid), 5, "Puppet to stop on the node")


def test_serve_keeps_trying_while_the_service_is_unreachable_and_stops_cleanly(sshd, tmp_path):
    from tests.bao import free_port

    dead = Service(f"http://127.0.0.1:{free_port()}", "rlyp_" + "x" * 61, None)
    config = bridge_config(tmp_path, dead, sshd, {})
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", log=log)
    wait_for(lambda: sum("could not list runs" in line for line in log_lines(log)) >= 2, 30)
    assert server.poll() is None  # no crash, no exit
    delays = [float(line.split("retry_in=")[1].split()[0]) for line in log_lines(log) if "retry_in=" in line]
    assert delays[:2] == [1.0, 2.0]  # backing off
    server.send_signal(signal.SIGTERM)
    assert server.wait(15) == 0
    assert "Traceback" not in log.read_text()


def test_poll_once_with_the_service_unreachable_exits_1_with_a_log_line(sshd, tmp_path):
    from tests.bao import free_port

    dead = Service(f"http://127.0.0.1:{free_port()}", "rlyp_" + "x" * 61, None)
    config = bridge_config(tmp_path, dead, sshd, {})
    log = tmp_path / "bridge.log"
    poller = relay_bridge(config, "poll", "--once", log=log, env={"PATH": "/usr/bin:/bin"})
    assert poller.wait(120) == 1
    assert any("level=error" in line and "could not list runs" in line for line in log_lines(log))
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("relay_api_url: ftp://x\nrelay_connection_token: rlyp_x\n", "relay_api_url"),
        ("relay_api_url: https://relay.example\n", "relay_connection_token"),
        ("relay_api_url: https://relay.example\nrelay_connection_token: rlyp_x\nbackend: chef\n", "backend"),
        (
            "relay_api_url: https://relay.example\nrelay_connection_token: rlyp_x\nbackend: ssh\n"
            "backend_ssh_paralelism: 3\n",
            "backend_ssh_paralelism",
        ),
        (
            "relay_api_url: https://relay.example\nrelay_connection_token: rlyp_x\n"
            "heartbeat_interval: soon\n",
            "heartbeat_interval",
        ),
    ],
)
def test_invalid_configuration_exits_2_naming_the_key(tmp_path, yaml_text, key):
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml_text)
    for command in (["poll", "--once"], ["serve"]):
        done = subprocess.run(
            [RELAY_BRIDGE, "--config", str(config), "--state-dir", str(tmp_path), *command],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2
        assert f"invalid configuration: {key}:" in done.stderr
        assert "rlyp_x" not in done.stderr


def test_the_systemd_units_name_this_installation_and_pass_systemd_s_checks(tmp_path):
    done = subprocess.run(
        [RELAY_BRIDGE, "--config", "/etc/relay/bridge.yaml", "systemd-units", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    units = sorted(p.name for p in tmp_path.iterdir())
    assert units == ["relay-bridge-poll.service", "relay-bridge-poll.timer", "relay-bridge.service"]
    assert len(done.stdout.splitlines()) == 3
    poll = (tmp_path / "relay-bridge-poll.service").read_text()
    assert f"ExecStart={RELAY_BRIDGE} --config /etc/relay/bridge.yaml poll --once" in poll
    assert "KillMode=process" in poll  # or systemd kills the forked workers with the oneshot
    for unit in ("relay-bridge-poll.service", "relay-bridge.service"):
        assert "StateDirectoryMode=0700" in (tmp_path / unit).read_text()  # systemd's default is 0755
    assert "OnUnitActiveSec=30s" in (tmp_path / "relay-bridge-poll.timer").read_text()
    assert (
        f"ExecStart={RELAY_BRIDGE} --config /etc/relay/bridge.yaml serve"
        in (tmp_path / "relay-bridge.service").read_text()
    )
    verify = subprocess.run(
        ["systemd-analyze", "verify", *map(str, sorted(tmp_path.iterdir()))], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stderr
    assert "relay-bridge" not in verify.stderr, verify.stderr


def test_a_service_that_fails_every_way_mid_run_loses_nothing(service, sshd, tmp_path):
    """5xx, garbage and dropped connections (before and after the service acted) on the
    accept, the heartbeats and the final state: Puppet runs once, and the run completes."""
    from tests.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(service.url)
    calls = tmp_path / "calls"
    nodes = {"a": {"FAKE_PUPPET_SLEEP": "2", "FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}}
    config = bridge_config(tmp_path, Service(proxy.url, service.token, None), sshd, nodes)
    run_id = new_run(service, ["a"])
    proxy.fail("GET", r"/runs\?", "503", "garbage")
    proxy.fail("POST", r"/accept$", "drop-before", "500", "drop-after")
    beat, final = r'"status": ?"in-progress"', r'"status": ?"complete"'
    proxy.fail("PUT", r"/state$", "500", "garbage", "drop-before", "503", body=beat)  # the first beats
    proxy.fail("PUT", r"/state$", "503", "garbage", "drop-after", body=final)  # the final state
    log = tmp_path / "bridge.log"
    try:
        assert relay_bridge(config, "poll", "--once", log=log).wait(60) == 0
        run = completed(run_id)
        # The answer to the final state was dropped after the service took it: the bridge
        # sends it again, and the service answers the same (it is idempotent).
        wait_for(lambda: any("msg=completed" in line for line in log_lines(log, run_id)), 60)
    finally:
        proxy.stop()
    assert run.outcome == "finished"
    assert run.run_results["nodes"][0]["exit_code"] == 2
    assert len(calls.read_text().splitlines()) == 2  # Puppet started once
    assert not proxy.rules, f"faults not met: {proxy.rules}"
    text = log.read_text()
    assert "Traceback" not in text
    assert "heartbeat not delivered; Puppet goes on" in text
    assert text.count("service call failed; retrying") >= 8
    assert service.token not in text


def test_serve_s_prometheus_endpoint_counts_runs_and_api_errors(service, sshd, tmp_path):
    from tests.bao import free_port
    from tests.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(service.url)
    proxy.fail("PUT", r"/state$", "503", body=r'"status": ?"complete"')
    config = bridge_config(
        tmp_path, Service(proxy.url, service.token, None), sshd, {"a": {}, "b": {"FAKE_PUPPET_EXIT": "4"}}
    )
    port = free_port()
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", "--wait", "2", "--metrics-port", str(port), log=log)
    try:
        finished = new_run(service, ["a"])
        failed = new_run(service, ["b"])
        assert (completed(finished).outcome, completed(failed).outcome) == ("finished", "failed")
        # The gauge of runs held drops just after the completion is counted: wait for both.
        text = wait_for(lambda: _metrics(port, 'outcome="failed"', "relay_bridge_runs_held 0"), 10)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
        proxy.stop()
    assert "relay_bridge_runs_held 0" in text
    assert 'relay_bridge_runs_completed_total{outcome="finished"} 1' in text
    assert 'relay_bridge_runs_completed_total{outcome="failed"} 1' in text
    assert 'relay_bridge_api_errors_total{kind="5xx"} 1' in text
    assert "# TYPE relay_bridge_runs_completed_total counter" in text


def _metrics(port: int, *wanted: str) -> str:
    """The metrics page, once it shows everything `wanted`; else ""."""
    import requests

    try:
        answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except requests.RequestException:
        return ""
    return answer.text if all(w in answer.text for w in wanted) else ""


def test_a_metrics_port_in_use_exits_2_saying_so(service, sshd, tmp_path):
    import socket

    config = bridge_config(tmp_path, service, sshd, {})
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        log = tmp_path / "bridge.log"
        server = relay_bridge(config, "serve", "--metrics-port", str(port), log=log)
        assert server.wait(30) == 2
    assert any("cannot serve metrics" in line and f"port={port}" in line for line in log_lines(log))
