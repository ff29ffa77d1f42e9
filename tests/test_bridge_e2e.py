"""End to end, all real: Debian's puppetserver (the session's, conftest.py), this host as a
node reached over a real sshd, the project's web server (gunicorn on PostgreSQL), the
`relay-puppet-run` step and the `relay-bridge` daemon with its SSH backend running
`puppet agent -t` on the node.

The data these tests make is committed (gunicorn is another process), so the module makes
its owner once and deletes it (and with it connection, runs, trigger, events) at the end."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.storage import storages
from relay_bridge.api import RelayClient

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition
from tests.bao import free_port
from tests.bridge_helpers import Service, bridge_config, completed, relay_bridge, wait_for
from tests.conftest import point_vault_at
from tests.puppetserver import PuppetServer
from triggers import services
from triggers.models import Event, Trigger
from triggers.objects import body_name

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
STEP = str(Path(sys.executable).parent / "relay-puppet-run")


@dataclass
class World:
    service: Service
    puppetserver: PuppetServer
    certname: str
    trigger: Trigger
    workdir: Path


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, bao, sshd, puppetserver, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e")
    point_vault_at(bao, bao.root().token)
    with django_db_blocker.unblock():
        owner = User.objects.create_user("e2e-ops")
        _, token = PuppetConnection.create_with_token(owner=owner, name="datacenter")
        trigger, trigger_token = Trigger.create_with_token(owner=owner, name="reports")
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{settings.DATABASES['default']['NAME']}",
        "VAULT_ADDR": bao.addr,
        "VAULT_TOKEN": bao.root().token,
        "PORT": str(port),
        "ACCESS_LOG": "",
        "WEB_CONCURRENCY": "1",
    }
    web = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "-c",
            "python:relay.gunicorn_conf",
            "relay.asgi:application",
        ],
        env=env,
        cwd=ROOT,
        stdout=(workdir / "web.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    puppetserver.reports.send_to(f"http://reports:{trigger_token}@127.0.0.1:{port}/api/events")
    client = RelayClient(url, str(token), attempts=1)
    try:
        wait_for(lambda: _up(url), 30, "gunicorn")
        yield World(Service(url, str(token), client), puppetserver, puppetserver.certname(), trigger, workdir)
    finally:
        client.close()
        puppetserver.reports.send_to(None)
        web.terminate()
        web.wait(30)
        with django_db_blocker.unblock():
            owner.delete()  # connection, runs, trigger and events go with it


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=1).ok
    except requests.RequestException:
        return False


def config_for(world: World, name: str, **options) -> Path:
    nodes = {world.certname: {}}
    node_puppet = str(world.puppetserver.node_puppet())
    return bridge_config(
        world.workdir / name, world.service, sshd_of(world), nodes, heartbeat=2, node_puppet_path=node_puppet
    )


def sshd_of(world: World):
    return world.sshd  # set by the autouse fixture below


@pytest.fixture(autouse=True)
def _attach_sshd(world, sshd):
    world.sshd = sshd


def step(world: World, *args: str) -> subprocess.Popen:
    env = {**os.environ, "RELAY_API_URL": world.service.url, "RELAY_CONNECTION_TOKEN": world.service.token}
    return subprocess.Popen(
        [STEP, "--nodes", world.certname, "--poll-interval", "1", "--accept-timeout", "300", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def step_and_poll(world: World, name: str, *args: str) -> tuple[int, dict, Run]:
    """The workflow's step asks for a run; a timer's `relay-bridge poll --once` works it."""
    before = set(Run.objects.values_list("id", flat=True))
    waiting = step(world, *args)
    run = wait_for(lambda: Run.objects.exclude(id__in=before).first(), 30, "the step to create its run")
    log = world.workdir / f"{name}.log"
    assert relay_bridge(config_for(world, name), "poll", "--once", log=log).wait(30) == 0
    out, err = waiting.communicate(timeout=300)
    run.refresh_from_db()
    assert run.status == "complete", (err, log.read_text())
    return waiting.returncode, json.loads(out), run


def test_a_workflow_run_reaches_puppet_agent_over_ssh_and_finishes(world):
    target = world.workdir / "motd"
    world.puppetserver.manifest(
        f"node default {{ file {{ '{target}': content => 'managed by Puppet v1' }} }}"
    )

    code, outputs, run = step_and_poll(world, "finish", "--environment", "production")

    assert (code, outputs["outcome"]) == (0, "finished"), run.run_results
    assert outputs["jobID"] == ""  # plain SSH has no job handle
    [node] = run.run_results["nodes"]
    assert node["name"] == world.certname
    assert node["exit_code"] in (0, 2)
    assert node["state"] == "finished"
    assert target.read_text() == "managed by Puppet v1"
    run.connection.refresh_from_db()
    assert (run.connection.reported_platform, run.connection.reported_backend) == ("oss", "ssh")

    # puppetserver sent the agent's report (reports = http) to the push trigger.
    event = wait_for(lambda: Event.objects.filter(trigger=world.trigger).first(), 60, "the report")
    services.process(str(event.id))  # what the Celery worker does with it
    event.refresh_from_db()
    assert (event.host, event.status, event.state) == (world.certname, "changed", "matched")
    assert [r["title"] for r in event.summary["resources"]] == [str(target)]

    # Puppet put the run's id (--job-id) into the report it sent puppetserver.
    with storages["events"].open(body_name(event.body_sha256), "rb") as body:
        assert f"\njob_id: {run.id}\n".encode() in body.read()
    # The node's last run report, read after Puppet over the same SSH connection, is the
    # very report puppetserver sent (the same transaction), and says what changed.
    assert node["report"]["transaction_uuid"] == event.transaction_uuid
    assert node["report"]["status"] == "changed"
    assert node["changes_pending"] is False
    [resource] = node["resources"]
    assert (resource["type"], resource["title"]) == ("File", str(target))
    assert resource["changes"] == [
        {"property": "ensure", "from": "absent", "to": "file", "status": "success"}
    ]


def test_a_manifest_with_a_failing_resource_ends_failed(world):
    world.puppetserver.manifest("node default { exec { 'refuse': command => '/bin/false' } }")

    code, outputs, run = step_and_poll(world, "fail")

    assert (code, outputs["outcome"]) == (1, "failed")
    [node] = run.run_results["nodes"]
    assert node["exit_code"] in (4, 6)
    assert node["state"] == "failed"
    assert "refuse" in node["output"]


def test_a_noop_run_changes_nothing_on_disk_and_says_what_a_real_run_would_change(world):
    target = world.workdir / "noop-target"
    target.write_text("as it was")
    created = world.workdir / "noop-created"
    world.puppetserver.manifest(
        f"node default {{ file {{ '{target}': content => 'as Puppet wants it' }}"
        f" file {{ '{created}': ensure => file, content => 'new' }} }}"
    )

    code, outputs, run = step_and_poll(world, "noop", "--noop")

    # Puppet exits 0 in noop with changes pending: the exit code cannot tell them apart.
    assert (code, outputs["outcome"]) == (0, "finished")
    assert target.read_text() == "as it was" and not created.exists()
    [node] = run.run_results["nodes"]
    assert node["exit_code"] == 0
    assert "(noop)" in node["output"]
    assert node["changes_pending"] is True
    assert node["report"]["noop"] is True
    assert node["resources_total"] == 2
    content, ensure = node["resources"]
    assert (content["type"], content["title"]) == ("File", str(target))
    sha256 = hashlib.sha256
    assert content["changes"] == [
        {
            "property": "content",
            "from": "{sha256}" + sha256(b"as it was").hexdigest(),
            "to": "{sha256}" + sha256(b"as Puppet wants it").hexdigest(),
            "status": "noop",
        }
    ]
    assert (ensure["type"], ensure["title"]) == ("File", str(created))
    assert ensure["changes"] == [{"property": "ensure", "from": "absent", "to": "file", "status": "noop"}]


def test_a_noop_run_with_nothing_to_change_says_no_changes_are_pending(world):
    target = world.workdir / "in-sync-file"
    target.write_text("already so")
    world.puppetserver.manifest(f"node default {{ file {{ '{target}': content => 'already so' }} }}")

    code, outputs, run = step_and_poll(world, "in-sync", "--noop")

    assert (code, outputs["outcome"]) == (0, "finished")
    [node] = run.run_results["nodes"]
    assert (node["changes_pending"], node["resources_total"], node["resources"]) == (False, 0, [])
    assert node["report"]["noop"] is True and node["report"]["status"] == "unchanged"


def test_serve_picks_up_a_new_run_through_the_long_poll_in_under_a_second(world):
    world.puppetserver.manifest("node default { }")
    log = world.workdir / "serve.log"
    server = relay_bridge(config_for(world, "serve"), "serve", "--wait", "10", log=log)
    try:
        wait_for(lambda: log.exists() and "msg=serving" in log.read_text(), 30)
        time.sleep(1)  # the long-poll is waiting now
        run_id = world.service.client.create_run({"scope": {"nodes": [world.certname]}})["id"]
        run = completed(run_id, timeout=120)
        accepted = RunTransition.objects.get(run_id=run_id, to_status="accepted").at
        assert (accepted - run.created_at).total_seconds() < 1.0
        assert run.outcome == "finished", run.run_results
        assert run.run_results["nodes"][0]["exit_code"] == 0
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
