"""Outage survival: a TCP proxy of the tests' own sits between `relay-bridge serve` and the
service, and is cut, slowed down, or made to reset connections at chosen moments. Puppet
keeps running, heartbeats come back when the service does, and the final state, spooled
on disk, is delivered when the service returns, even across a bridge restart."""

import signal
import subprocess
import time

import pytest

from runs.models import Run
from tests.bridge_helpers import (
    RELAY_BRIDGE,
    Service,
    bridge_config,
    completed,
    in_progress,
    log_lines,
    serve,
    wait_for,
)
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(live_server):
    tcp = TcpProxy(int(live_server.url.rsplit(":", 1)[1]))
    yield tcp
    tcp.stop()


def status_text(config) -> str:
    return subprocess.run(
        [RELAY_BRIDGE, "--config", str(config), "status"], capture_output=True, text=True, check=True
    ).stdout


def test_an_outage_of_several_heartbeats_mid_run_loses_nothing(service, proxy, sshd, tmp_path):
    calls = tmp_path / "calls"
    node = {"FAKE_PUPPET_SLEEP": "4", "FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(
        tmp_path, Service(proxy.url, service.token, None), sshd, {"a": node}, heartbeat=0.3
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    try:
        run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
        in_progress(run_id)
        proxy.cut()
        time.sleep(0.3)
        frozen = Run.objects.get(pk=run_id).updated_at
        time.sleep(1.5)  # five heartbeat intervals without the service
        assert Run.objects.get(pk=run_id).updated_at == frozen
        proxy.heal()
        wait_for(lambda: Run.objects.get(pk=run_id).updated_at > frozen, 10, "heartbeats to come back")
        run = completed(run_id)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    assert run.outcome == "finished"
    assert run.run_results["nodes"][0]["exit_code"] == 2
    assert len(calls.read_text().splitlines()) == 2  # Puppet ran once, through the outage
    assert proxy.refused > 0
    assert any("heartbeat not delivered; Puppet goes on" in line for line in log_lines(log, run_id))


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_final_state_spooled_during_an_outage_is_delivered_after_a_restart(
    service, proxy, sshd, tmp_path, how
):
    calls = tmp_path / "calls"
    node = {"FAKE_PUPPET_SLEEP": "1", "FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(
        tmp_path, Service(proxy.url, service.token, None), sshd, {"a": node}, heartbeat=0.3
    )
    log = tmp_path / "bridge.log"
    server = serve(config, log, "--stop-timeout", "1")
    run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
    in_progress(run_id)
    proxy.cut()
    wait_for(lambda: "final state spooled (finished)" in status_text(config), 20, "the final state on disk")
    server.send_signal(getattr(signal, how))
    server.wait(30)
    assert "orphaned: the next bridge start resumes it" in status_text(config)
    assert Run.objects.get(pk=run_id).status == "in-progress"

    proxy.heal()
    server = serve(config, log)
    try:
        run = completed(run_id)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    assert run.outcome == "finished"
    assert run.run_results["nodes"][0]["exit_code"] == 2
    assert len(calls.read_text().splitlines()) == 2  # Puppet was not run again
    assert "no runs held" in status_text(config)


def test_a_slow_link_and_reset_connections_lose_nothing(service, proxy, sshd, tmp_path):
    node = {"FAKE_PUPPET_SLEEP": "3", "FAKE_PUPPET_EXIT": "0"}
    config = bridge_config(
        tmp_path, Service(proxy.url, service.token, None), sshd, {"a": node}, heartbeat=0.3
    )
    log = tmp_path / "bridge.log"
    proxy.slow(0.2)
    server = serve(config, log)
    try:
        run_id = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
        in_progress(run_id)
        proxy.reset_all()
        time.sleep(1.0)
        proxy.heal()
        proxy.slow(0.1)
        run = completed(run_id)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    assert run.outcome == "finished"
    assert proxy.refused > 0
    assert "Traceback" not in log.read_text()
