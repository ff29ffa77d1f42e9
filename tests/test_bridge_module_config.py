"""A Puppet server that puppetlabs-relay 2.5.1 configured: `relay-bridge` with no
configuration of its own reads the module's /etc/puppetlabs/puppet/relay.yaml, as the
module's template renders it, and works a run from a live server of the project through
the office proxy that relay.yaml names, with the Bolt that it names (the Bolt stand-in)."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from relay_bridge import config

from runs.models import Run
from tests.bao import free_port
from tests.bridge_helpers import RELAY_BRIDGE, Service, completed, log_lines, wait_for
from tests.forward_proxy import ForwardProxy
from tests.sshd import write_fake_puppet

pytestmark = pytest.mark.django_db(transaction=True)

MODULE = Path(__file__).parents[1] / "bridge_client" / "tests" / "fixtures" / "module-relay-yaml"
BOLT = str(Path(__file__).parent / "standins" / "bolt")
PROXY_USER, PROXY_PASSWORD = "relay", "pr0xy p@ss:w/rd%"  # as in the rendered file


def relay_yaml(directory: Path, service: Service, proxy: ForwardProxy) -> Path:
    """The module's rendering, its placeholders pointed at this test's service, Bolt and proxy."""
    text = (MODULE / "bolt.yaml").read_text()
    for old, new in (
        ("http://relay.invalid:8000/", f"{service.url}/"),
        ("rlyp_CONNECTIONTOKENPLACEHOLDER", service.token),
        ('"/opt/puppetlabs/bin/bolt"', json.dumps(BOLT)),
        ("proxy_port: 3128", f"proxy_port: {proxy.port}"),
    ):
        assert old in text
        text = text.replace(old, new)
    directory.mkdir(parents=True)
    path = directory / "relay.yaml"
    path.write_text(text)
    return path


def stop_daemons_of(state_dir: Path) -> None:
    """The conftest stops bridges started with `--config` under the tests' directory; this
    one has no --config: a daemon a failed test left working for it is stopped here."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(state_dir).encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def test_the_module_s_relay_yaml_works_unchanged_through_its_proxy(service, tmp_path):
    if config.DEFAULT_PATH.exists():
        pytest.skip(f"{config.DEFAULT_PATH} exists here: it would be read before the module's relay.yaml")
    proxy = ForwardProxy(PROXY_USER, PROXY_PASSWORD)
    path = relay_yaml(tmp_path / "puppet", service, proxy)
    bin_dir = tmp_path / "bin"  # `puppet` on the "nodes" (the stand-in Bolt runs it here)
    bin_dir.mkdir()
    write_fake_puppet(bin_dir).rename(bin_dir / "puppet")
    calls, bolt_log, log = tmp_path / "calls", tmp_path / "bolt-calls", tmp_path / "bridge.log"
    run_id = service.client.create_run({"scope": {"nodes": ["web1"]}, "environment": "production"})["id"]
    dead = f"http://127.0.0.1:{free_port()}"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RELAY_MODULE_CONFIG": str(path),  # where the module puts it: /etc/puppetlabs/puppet/relay.yaml
        # An environment's proxy must not win over the one relay.yaml names.
        "http_proxy": dead,
        "HTTP_PROXY": dead,
        "BOLT_STANDIN_LOG": str(bolt_log),
        "BOLT_STANDIN_ENV": json.dumps({"web1": {"FAKE_PUPPET_EXIT": "2", "FAKE_PUPPET_LOG": str(calls)}}),
    }
    try:
        # No --config; the options after the command.
        poller = subprocess.run(
            [RELAY_BRIDGE, "poll", "--once", "--state-dir", str(tmp_path / "state")],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            timeout=60,
        )
        assert poller.returncode == 0, log.read_text()
        run = completed(run_id)
        wait_for(lambda: any("msg=completed" in line for line in log_lines(log, run_id)), 30)
    finally:
        proxy.stop()
        stop_daemons_of(tmp_path / "state")

    assert (run.outcome, run.run_results["nodes"][0]["exit_code"]) == ("finished", 2)
    # Every call to Relay went through the proxy, with its credentials.
    base = f"{service.url}/_puppet/runs"
    assert ("GET", f"{base}?status=pending") in proxy.carried
    assert ("POST", f"{base}/{run_id}/accept") in proxy.carried
    assert [call for call in proxy.carried if call == ("PUT", f"{base}/{run_id}/state")]
    assert proxy.refused == 0
    # Bolt as relay.yaml says: its command, and the SSH user, password and host key check of
    # the module's keys, the password in the 0600 inventory only.
    [call] = [json.loads(line) for line in bolt_log.read_text().splitlines()]
    assert call["argv"][:2] == ["command", "run"] and "--targets" in call["argv"]
    assert call["inventory"]["config"]["ssh"] == {
        "user": "relay-automation",
        "password": "b0lt p@ss:w/rd",
        "host-key-check": False,
    }
    assert "b0lt p@ss:w/rd" not in " ".join(call["argv"])
    assert len(calls.read_text().splitlines()) == 2  # Puppet ran once
    # `debug: true` is the module's debug logging; nothing secret is in it.
    text = log.read_text()
    assert "level=debug" in text and f"file={path}" in text
    for secret in (service.token, "rlyt_TRIGGERTOKEN", "pr0xy", "b0lt p@ss"):
        assert secret not in text
    assert Run.objects.get(pk=run_id).connection.reported_backend == "bolt"
    assert not os.listdir(tmp_path / "state" / "runs")
