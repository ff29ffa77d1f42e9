"""The bridge trusts nothing the service sends (it runs as root): against a live server of
the project, run ids that are not UUIDs (served by a proxy that plays a rogue service) and
node names that are not certnames (written straight into the database, which the API would
refuse) are refused before they reach a path or a command line; and what it keeps under
state_dir is its own, whatever the umask it was started with."""

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.bridge_helpers import (
    RELAY_BRIDGE,
    Service,
    bridge_config,
    completed,
    config_file,
    log_lines,
    relay_bridge,
    wait_for,
)
from tests.faulty_proxy import FaultyProxy
from tests.sshd import write_fake_puppet

pytestmark = pytest.mark.django_db(transaction=True)

BOLT = str(Path(__file__).parent / "standins" / "bolt")


def listed(run_id: str) -> dict:
    return {
        "id": run_id,
        "type": "run",
        "scope": {"nodes": ["a"]},
        "noop": False,
        "state": {"status": "pending", "updated_at": "2024-01-01T00:00:00Z"},
    }


def test_listed_runs_whose_ids_are_not_uuids_are_refused_before_they_touch_disk(service, sshd, tmp_path):
    victim = tmp_path / "victim"  # a directory of root's that a run id names
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    rogue = FaultyProxy(service.url)
    rogue.extra_runs = [listed(str(victim)), listed("../../escaped"), listed(f"{victim}/../x\n")]
    calls = tmp_path / "calls"
    config = bridge_config(
        tmp_path / "bridge",
        Service(rogue.url, service.token, None),
        sshd,
        {"a": {"FAKE_PUPPET_LOG": str(calls)}},
    )
    good = service.client.create_run({"scope": {"nodes": ["a"]}})["id"]
    log = tmp_path / "bridge.log"
    try:
        assert relay_bridge(config, "poll", "--once", log=log).wait(30) == 0
        assert completed(good).outcome == "finished"  # a good run beside them is worked as ever
        wait_for(lambda: any("msg=completed" in line for line in log_lines(log, good)), 30)
    finally:
        rogue.stop()

    assert [p.name for p in victim.iterdir()] == ["precious"]  # no lock file, and no rmtree
    assert not (tmp_path / "bridge" / "escaped").exists()
    assert len(calls.read_text().splitlines()) == 2  # Puppet ran for the good run only
    refused = [line for line in log_lines(log) if "refusing a listed run: its id is not a UUID" in line]
    assert len(refused) == 3 and all("level=error" in line for line in refused)
    assert any(repr(str(victim)) in line for line in refused)
    # Nothing was asked of the service about them either.
    assert [path for _, path, _ in rogue.log if "victim" in path or "escaped" in path] == []


def test_serve_does_not_spin_on_a_run_it_refuses(service, sshd, tmp_path):
    """The long-poll answers at once while a pending run is listed, and a refused one stays
    listed: serve waits between asks, and says so once."""
    rogue = FaultyProxy(service.url)
    rogue.extra_runs = [listed("../../escaped")]
    config = bridge_config(tmp_path, Service(rogue.url, service.token, None), sshd, {"a": {}})
    log = tmp_path / "bridge.log"
    server = relay_bridge(config, "serve", "--wait", "5", log=log)
    try:
        wait_for(lambda: any("refusing a listed run" in line for line in log_lines(log)), 20)
        asked = sum(1 for method, path, _ in rogue.log if method == "GET")
        time.sleep(3)
        asked = sum(1 for method, path, _ in rogue.log if method == "GET") - asked
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
        rogue.stop()
    assert asked <= 8, f"{asked} lists in 3 s"  # one each 0.5 s at most, not a busy loop
    assert sum("refusing a listed run" in line for line in log_lines(log)) == 1


def insert_run(nodes: list, **fields) -> Run:
    """A run the API would refuse (its node names), as a broken or rogue service lists it."""
    return Run.objects.create(connection=PuppetConnection.objects.get(), scope={"nodes": nodes}, **fields)


@pytest.mark.parametrize(
    "evil",
    ["-oProxyCommand=touch {marker}", "@{marker}", "local://{marker}", "Web1", "a b", "a,b", "web1\n"],
)
def test_node_names_that_are_not_certnames_are_refused_by_ssh_and_bolt(service, sshd, tmp_path, evil):
    marker = tmp_path / "pwned"
    marker_name = evil.format(marker=marker)
    calls, bolt_log = tmp_path / "calls", tmp_path / "bolt-calls"
    ssh_run = insert_run([marker_name, "good"])
    ssh = bridge_config(tmp_path / "ssh", service, sshd, {"good": {"FAKE_PUPPET_LOG": str(calls)}})
    assert relay_bridge(ssh, "poll", "--once", log=tmp_path / "ssh.log").wait(30) == 0
    run = completed(str(ssh_run.id))
    assert run.outcome == "error"
    assert (
        run.run_results["result"]["msg"]
        == f"The run names a node that is not a valid certname: {marker_name!r}."
    )

    # Bolt's --targets reads `@file` and URIs (`local://` runs here, as root): none reaches it.
    bolt_run = insert_run([marker_name, "good"])
    bolt = config_file(tmp_path / "bolt", service, "bolt", {"bolt_path": BOLT})
    puppet = write_fake_puppet(tmp_path)
    env = {
        **os.environ,
        "BOLT_STANDIN_LOG": str(bolt_log),
        "BOLT_STANDIN_ENV": json.dumps({"good": {"FAKE_PUPPET_LOG": str(calls)}}),
    }
    env["PATH"] = f"{puppet.parent}:{env['PATH']}"
    assert relay_bridge(bolt, "poll", "--once", log=tmp_path / "bolt.log", env=env).wait(30) == 0
    run = completed(str(bolt_run.id))
    assert run.outcome == "error" and "not a valid certname" in run.run_results["result"]["msg"]

    assert not bolt_log.exists() and not calls.exists() and not marker.exists()  # nothing ran at all
    for name in ("ssh.log", "bolt.log"):
        assert any("the run cannot be done" in line for line in log_lines(tmp_path / name))


def test_an_environment_that_is_not_an_environment_name_is_refused(service, sshd, tmp_path):
    calls = tmp_path / "calls"
    run = insert_run(["good"], environment="production --server evil.example.com")
    config = bridge_config(tmp_path, service, sshd, {"good": {"FAKE_PUPPET_LOG": str(calls)}})
    assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(30) == 0
    assert completed(str(run.id)).outcome == "error"
    assert not calls.exists()


def test_state_files_are_the_bridge_s_alone_whatever_the_umask(service, sshd, tmp_path):
    """Started with umask 000: while Puppet runs, every directory under state_dir is 0700 and
    every file 0600 (the run document, the lock, each node's output, pid and exit code)."""
    nodes = {"fast": {"FAKE_PUPPET_EXIT": "2"}, "slow": {"FAKE_PUPPET_SLEEP": "4"}}
    config = bridge_config(tmp_path, service, sshd, nodes)
    state_dir = tmp_path / "state"
    (state_dir / "runs").mkdir(parents=True)  # made 0777 beforehand, as by a careless hand
    for path in (state_dir, state_dir / "runs"):
        path.chmod(0o777)
    run_id = service.client.create_run({"scope": {"nodes": ["fast", "slow"]}})["id"]
    log = tmp_path / "bridge.log"
    poller = subprocess.Popen(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", RELAY_BRIDGE, "--config", str(config), "poll", "--once"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    assert poller.wait(30) == 0
    work = state_dir / "runs" / run_id / "work"
    wait_for(
        lambda: (work / "00000.rc").exists() and (work / "00001.pid").exists(), 30, "the fast node's end"
    )
    directories, files = {}, {}
    for directory, subdirectories, names in os.walk(state_dir):
        for name in subdirectories:
            directories[Path(directory, name)] = stat.S_IMODE(os.lstat(Path(directory, name)).st_mode)
        for name in names:
            files[Path(directory, name)] = stat.S_IMODE(os.lstat(Path(directory, name)).st_mode)
    directories[state_dir] = stat.S_IMODE(os.stat(state_dir).st_mode)
    assert completed(run_id, timeout=30).outcome == "finished"
    assert set(directories.values()) == {0o700}, directories
    assert {path.name for path in files} >= {
        "run.json",
        "lock",
        "00000.log",
        "00000.pid",
        "00000.rc",
        "00001.pid",
    }
    assert set(files.values()) == {0o600}, files
