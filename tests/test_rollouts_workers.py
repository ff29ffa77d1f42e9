"""Rollouts on real parts (issue 21 §5): real Celery workers move them on, and the batches are
worked by real bridges that know nothing of rollouts:

- the shipped Ruby agent (tests/ruby_agent.py, a model of puppetlabs-relay 2.5.1) on the PE
  orchestrator stand-in, for a rollout made through `POST /_puppet/runs`;
- `relay-bridge poll --once` with its SSH backend on the tests' sshd, for the native
  `puppet-run` step of a workflow run on the engine;
- a worker SIGKILLed during a pause: the next batch still starts, after the pause, once the
  beat's sweep sends the message the dead worker held."""

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings
from django.utils import timezone
from relay_bridge.api import RelayClient

from puppet_connection.models import PuppetConnection
from relay import dispatch
from runs.models import Rollout, RolloutBatch, Run
from tests.bridge_helpers import Service, bridge_config, relay_bridge, wait_for
from tests.events_helpers import clear_queues
from tests.ruby_agent import Agent, Orchestrator, OrchestratorAPI
from tests.workflow_helpers import EngineWorker, finished, run_of, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

SPEED = 100  # the Ruby agent polls every 0.3 s, ticks every 0.15 s


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    clear_queues(client)  # messages earlier tests queued for rows that are gone
    yield client
    clear_queues(client)


@pytest.fixture
def worker(broker, bao, tmp_path) -> Iterator[EngineWorker]:
    """The engine's worker (prefork, two children), with OpenBao for the workflows' connections."""
    process = EngineWorker(
        tmp_path / "worker.log", concurrency=2, VAULT_ADDR=bao.addr, VAULT_TOKEN=bao.root().token
    )
    yield process
    process.stop()


def ended(run_id: str, timeout: float = 60) -> Run:
    wait_for(lambda: Run.objects.get(pk=run_id).status == "complete", timeout, f"rollout {run_id} to end")
    return Run.objects.get(pk=run_id)


NODES = [f"node-{i}.example.com" for i in range(1, 6)]


def test_the_shipped_ruby_agent_works_a_rollout_and_a_failure_stops_it(
    live_server, worker, pe, alice, tmp_path
):
    _, token = PuppetConnection.create_with_token(owner=alice, name="pe")
    pe.script = ["running", "finished"]
    pe.node_states = {"node-3.example.com": "failed"}  # in the second batch
    made = requests.post(
        f"{live_server.url}/_puppet/runs",
        json={
            "environment": "production",
            "scope": {"nodes": NODES},
            "rollout": {"canary": 1, "batch": "40%", "max_failures": 0, "pause": "1s"},
        },
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    assert made.json()["rollout"]["batches"] == 3  # 1, then 2 at a time (40% of 5)

    agent = Agent(
        live_server.url,
        str(token),
        Orchestrator(OrchestratorAPI(pe.url, pe.token, pe.ca)),
        tmp_path / "relay",
        speed=SPEED,
    )
    thread = agent.start()
    try:
        run = ended(made.json()["id"])
        time.sleep(1)  # a few more polls: nothing else is offered
    finally:
        agent.stopping.set()
        thread.join(10)
    assert agent.exited is None, repr(agent.exited)

    # Two deploys, the canary's and the second batch's, one job each; the third never made.
    assert [job.body["scope"]["nodes"] for job in pe.jobs.values()] == [NODES[:1], NODES[1:3]]
    assert all(count == 1 for count in agent.jobs_started.values()) and len(agent.jobs_started) == 2
    assert made.json()["id"] not in agent.jobs_started  # the rollout's own run is never offered
    assert run.outcome == "failed"
    report = run.run_results
    assert report["stopped"].startswith(
        "1 nodes failed in all, over the budget of 0: batch 2 failed on node-3.example.com"
    )
    assert report["nodes"] == {
        "node-1.example.com": "finished",
        "node-2.example.com": "finished",
        "node-3.example.com": "failed",
        "node-4.example.com": "not-run",
        "node-5.example.com": "not-run",
    }
    # The pause was honoured: the second batch was made a second after the first ended.
    first, second = RolloutBatch.objects.filter(rollout_id=run.pk).order_by("index")
    assert second.run.created_at - first.ended_at >= timezone.timedelta(seconds=1)


ROLLOUT_WORKFLOW = """
apiVersion: v1
parameters:
  canary: {default: 1}
steps:
- name: deploy
  image: relaysh/puppet-step-run
  spec:
    connection: !Connection {type: puppet, name: prod}
    environment: production
    scope:
      nodes: [web1, web2, web3, web4, web5]
    rollout:
      canary: !Parameter canary
      batch: 2
      max_failures: 1
      pause: 1s
"""


class Bridge:
    """`relay-bridge poll --once` every half second (as a systemd timer would, faster), in a thread."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopping.wait(0.5):
            relay_bridge(self.config, "poll", "--once", log=self.log).wait(30)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(40)


@pytest.fixture
def ssh_service(live_server, alice, settings) -> Iterator[Service]:
    settings.RELAY_PUBLIC_URL = live_server.url
    _, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    client = RelayClient(live_server.url, str(token), attempts=1)
    yield Service(live_server.url, str(token), client)
    client.close()


@pytest.mark.parametrize("canary_fails", [False, True])
def test_the_puppet_run_step_rolls_out_with_our_bridge_over_ssh(
    ssh_service, sshd, worker, alice, tmp_path, canary_fails
):
    nodes = {f"web{i}": {"FAKE_PUPPET_EXIT": "2"} for i in range(1, 6)}
    nodes["web3"] = {"FAKE_PUPPET_EXIT": "4"}  # some resources failed: within the budget of 1
    if canary_fails:
        nodes["web1"] = {"FAKE_PUPPET_EXIT": "1"}
    bridge = Bridge(bridge_config(tmp_path, ssh_service, sshd, nodes), tmp_path / "bridge.log")
    try:
        run = finished(run_of(alice, ROLLOUT_WORKFLOW), timeout=120)
    finally:
        bridge.stop()
    deploy = steps_of(run)["deploy"]
    outputs = deploy.outputs
    rollout = Rollout.objects.get(pk=outputs["id"])
    batch_runs = Run.objects.filter(rollout_batch__rollout=rollout).order_by("created_at")
    if canary_fails:
        assert deploy.status == "failure" and outputs["outcome"] == "failed"
        assert outputs["stopped"].startswith("The canary failed on web1 (run ")
        assert [b["nodes"] for b in outputs["batches"]] == [["web1"]]
        assert outputs["nodes"] == {"web1": "failed", **{f"web{i}": "not-run" for i in range(2, 6)}}
        assert [r.scope["nodes"] for r in batch_runs] == [["web1"]]
        return
    # Every batch ran: web3 failed, within the budget; the step fails, as a run does when a
    # node failed, and says it did not stop early.
    assert deploy.status == "failure" and outputs["outcome"] == "failed" and outputs["stopped"] == ""
    assert [(b["nodes"], b["outcome"]) for b in outputs["batches"]] == [
        (["web1"], "finished"),
        (["web2", "web3"], "failed"),
        (["web4", "web5"], "finished"),
    ]
    assert outputs["nodes"] == {
        "web1": "finished",
        "web2": "finished",
        "web3": "failed",
        "web4": "finished",
        "web5": "finished",
    }
    assert [r.scope["nodes"] for r in batch_runs] == [["web1"], ["web2", "web3"], ["web4", "web5"]]
    assert all(r.outcome in ("finished", "failed") and r.accepted_at for r in batch_runs)
    assert rollout.progress()["nodes_done"] == 5
    assert outputs["rollout"]["state"] == "complete" and outputs["rollout"]["batch"] == 3


def test_a_pause_survives_the_worker_that_held_it(live_server, broker, bao, alice, tmp_path):
    _, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    client = RelayClient(live_server.url, str(token), attempts=1)
    env = {"VAULT_ADDR": bao.addr, "VAULT_TOKEN": bao.root().token}
    first = EngineWorker(tmp_path / "first.log", pool="solo", **env)
    second = None
    try:
        made = client.create_run({"scope": {"nodes": ["a", "b"]}, "rollout": {"batch": 1, "pause": "4s"}})
        [run] = client.list_runs(status="pending")
        lease = client.accept(run["id"])
        client.put_state(
            run["id"],
            {
                "status": "complete",
                "outcome": "finished",
                "run_results": {"nodes": [{"name": "a", "state": "finished"}]},
            },
            lease_id=lease,
        )
        # The worker records the batch and holds the message due when the pause ends.
        rollout = wait_for(
            lambda: Rollout.objects.filter(pk=made["id"], state="paused").first(), 30, "the pause"
        )
        received = re.compile(r"runs\.tasks\.advance_rollout\[[^\]]+\] received")
        wait_for(lambda: len(received.findall(first.log())) == 2, 30, "the countdown message")
        first.kill()
        first.stop()
        second = EngineWorker(tmp_path / "second.log", pool="solo", **env)
        time.sleep(max((rollout.next_batch_at - timezone.now()).total_seconds(), 0) + 1)
        assert RolloutBatch.objects.filter(rollout=rollout).count() == 1  # the message died with the worker
        dispatch.publish("runs.tasks.sweep_rollouts")  # what the beat sends every ROLLOUT_SWEEP_INTERVAL
        wait_for(lambda: RolloutBatch.objects.filter(rollout=rollout).count() == 2, 30, "the next batch")
        batch = RolloutBatch.objects.get(rollout=rollout, index=1)
        assert batch.run.scope == {"nodes": ["b"]} and batch.run.created_at >= rollout.next_batch_at
    finally:
        client.close()
        first.stop()
        if second is not None:
            second.stop()


def test_workers_racing_on_a_batch_s_end_start_the_next_batch_once(live_server, worker, alice, tmp_path):
    # Two worker processes of two children each take twenty copies of the message a batch's
    # end sends (as many workers as see its run end, the sweep, a duplicate delivery).
    other = EngineWorker(tmp_path / "other.log", concurrency=2)
    _, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    client = RelayClient(live_server.url, str(token), attempts=1)
    try:
        made = client.create_run({"scope": {"nodes": ["a", "b", "c"]}, "rollout": {"batch": 1}})
        for k in range(1, 3):
            [run] = client.list_runs(status="pending")
            lease = client.accept(run["id"])
            client.put_state(run["id"], {"status": "complete", "outcome": "finished"}, lease_id=lease)
            for _ in range(20):  # beside the one the run's end sent
                dispatch.publish("runs.tasks.advance_rollout", made["id"])
            wait_for(lambda k=k: RolloutBatch.objects.filter(rollout_id=made["id"]).count() == k + 1, 30)
        time.sleep(1)  # the last copies are done
        assert RolloutBatch.objects.filter(rollout_id=made["id"]).count() == 3
        assert Run.objects.filter(connection__owner=alice, is_rollout=False).count() == 3
        assert [len(client.list_runs(status="pending"))] == [1]
    finally:
        client.close()
        other.stop()
