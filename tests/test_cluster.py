"""Two nodes of one deployment on this host, each started as the Procfile says (`web`, `worker`
with its beat, `steps`, each line run by the shell from the repository's root with the
virtualenv's bin on PATH; `release` once), with RELAY_NODE_NAME node-a and node-b, sharing the
test session's PostgreSQL database, Redis (its broker namespace), OpenBao and event storage.

Across the nodes: a run created on one is dispatched to a bridge long-polling the other; a
workflow with a script step and an approval runs through both. Then the node whose beat is
active dies (SIGKILL of its whole process group) while a script runs on the other node's
steps worker, which dies too: the other node's beat takes over, the script's step ends
`failure` with its reason, a schedule due during the outage starts once, and nothing is left
in progress. The timers are short (TIMES), so that all this takes seconds, not minutes."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.utils import timezone
from relay_bridge.api import RelayClient

from runs.models import OPEN_STATES, Run
from scriptsteps.models import ScriptRun
from tests.conftest import api_token_for
from tests.events_helpers import clear_queues, wait_until
from tests.script_helpers import crash, freeze
from triggers.models import Schedule
from workflows.models import StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line and line[0] != "#"
)
TIMES = {
    "BEAT_LOCK_TIMEOUT": 8,  # a dead beat's lock lasts this long …
    "BEAT_MAX_LOOP_INTERVAL": 1,  # … and the others try to take it this often
    "STEP_LOST_AFTER": 4,
    "WORKFLOW_SWEEP_INTERVAL": 2,
    "SCHEDULE_TICK_INTERVAL": 1,
}
# What a loaded machine adds to each bound: a task's trip through the broker, a process's
# pause. The bounds themselves are the documented ones.
SLACK = 3.0


class Node:
    """One node: the Procfile's processes, all in one process group (a machine, as far as
    killing it goes), each logging to a file of its own."""

    def __init__(self, name: str, port: int, logs: Path, bao: Any) -> None:
        db = connection.settings_dict
        self.name, self.url, self.logs = name, f"http://127.0.0.1:{port}", logs
        logs.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "VAULT_ADDR": bao.addr,
            "VAULT_TOKEN": bao.root().token,
            "RELAY_NODE_NAME": name,
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "WEB_CONCURRENCY": "1",
            "STEP_CONCURRENCY": "2",
            "STEP_RUNTIME_URL": self.url,
            "RELAY_PUBLIC_URL": self.url,
            "STEP_HEARTBEAT": "0.5",
            **{name: str(value) for name, value in TIMES.items()},
        }
        self.processes: dict[str, subprocess.Popen] = {}
        self.group = 0

    def run(self, kind: str, **popen: Any) -> subprocess.Popen:
        log = (self.logs / f"{kind}.log").open("ab")
        return subprocess.Popen(
            ["/bin/sh", "-c", PROCFILE[kind]], cwd=ROOT, env=self.env, stdout=log, stderr=log, **popen
        )

    def start(self) -> "Node":
        for kind in ("web", "worker", "steps"):
            process = self.run(kind, process_group=self.group)
            self.group = self.group or process.pid
            self.processes[kind] = process
        wait_until(lambda: self.answers() or self.exited(), 60)
        for kind in ("worker", "steps"):
            wait_until(lambda kind=kind: " ready." in self.log(kind) or self.exited(), 60)
        assert not self.exited(), self.exited()
        return self

    def answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def exited(self) -> str:
        return "".join(
            f"{kind} exited: {self.log(kind)[-2000:]}\n"
            for kind, process in self.processes.items()
            if process.poll() is not None
        )

    def log(self, kind: str) -> str:
        return (self.logs / f"{kind}.log").read_text(errors="replace")

    def holds_the_beat(self) -> bool:
        return "beat: Acquired lock" in self.log("worker")

    def scripts_taken(self) -> int:
        return len(re.findall(r"run_script\[[-0-9a-f]+\] received", self.log("steps")))

    def kill(self) -> None:
        """The machine dies: every process of the node at once."""
        os.killpg(self.group, signal.SIGKILL)
        for process in self.processes.values():
            process.wait(timeout=10)

    def stop(self) -> None:
        if any(process.poll() is None for process in self.processes.values()):
            os.killpg(self.group, signal.SIGTERM)
            for process in self.processes.values():
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.group, signal.SIGKILL)
                    process.wait(timeout=10)


class Api:
    """The REST API of one node, as a user calls it."""

    def __init__(self, node: Node, token: str) -> None:
        self.url = node.url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def call(self, method: str, path: str, expect: int, body: Any = None) -> Any:
        response = self.session.request(method, self.url + path, json=body, timeout=30)
        assert response.status_code == expect, (method, self.url + path, response.status_code, response.text)
        return response.json() if response.content else None

    def run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/api/workflow-runs/{run_id}/", 200)

    def steps(self, run_id: str) -> dict[str, dict[str, Any]]:
        return {step["name"]: step for step in self.run(run_id)["steps"]}

    def log(self, run_id: str, step: str) -> str:
        return self.call("GET", f"/api/workflow-runs/{run_id}/steps/{step}/log", 200)["text"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def nodes(django_db_blocker, bao, tmp_path):
    clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))  # the beat's schedule and lock too
    started: list[Node] = []
    with django_db_blocker.unblock():
        a = Node("node-a", free_port(), tmp_path / "node-a", bao)
        release = a.run("release")
        assert release.wait(timeout=120) == 0, (a.logs / "release.log").read_text()[-3000:]
        started.append(a.start())
        started.append(Node("node-b", free_port(), tmp_path / "node-b", bao).start())
    yield started
    for node in started:
        node.stop()


WITH_APPROVAL = """\
apiVersion: v1
steps:
- name: script
  image: relaysh/core
  input: [echo hello from a script]
- name: approval
  type: approval
  dependsOn: script
- name: after
  image: relaysh/core
  dependsOn: approval
  input: [echo approved]
"""
LONG = """\
apiVersion: v1
steps:
- name: long
  image: relaysh/core
  input: [echo started, sleep 120]
"""
SCHEDULED = """\
apiVersion: v1
triggers:
- name: yearly
  source:
    type: schedule
    schedule: '0 0 1 1 *'
steps:
- name: noop
  image: relay-internal/noop
"""


def test_two_nodes_share_the_work_and_survive_the_death_of_the_node_with_the_beat(nodes):
    a, b = nodes
    user = User.objects.create_user("ops")
    user.user_permissions.set(Permission.objects.filter(codename="approve_steprun"))
    token = api_token_for(user)
    api_a, api_b = Api(a, token), Api(b, token)

    # A run created on A wakes a bridge long-polling B.
    bridge_token = api_a.call("POST", "/api/connections/puppet/", 201, {"name": "dc"})["token"]
    bridge_b, service_a = (
        RelayClient(b.url, bridge_token, attempts=1),
        RelayClient(a.url, bridge_token, attempts=1),
    )
    answer: dict[str, Any] = {}

    def long_poll() -> None:
        answer["runs"] = bridge_b.list_runs(wait=20)
        answer["at"] = time.monotonic()

    waiting = threading.Thread(target=long_poll)
    waiting.start()
    time.sleep(1)  # B holds the long-poll
    assert waiting.is_alive()
    created_at = time.monotonic()
    created = service_a.create_run({"scope": {"nodes": ["web01"]}})
    waiting.join(timeout=20)
    assert [run["id"] for run in answer["runs"]] == [created["id"]]
    assert answer["at"] - created_at < 2
    lease = bridge_b.accept(created["id"])
    bridge_b.put_state(created["id"], {"status": "complete", "outcome": "finished"}, lease)
    assert service_a.get_run(created["id"])["state"]["status"] == "complete"

    # A workflow saved on A, started on B, its script's log read through A, approved on B.
    api_a.call("POST", "/api/workflows/", 201, {"name": "approved", "source": WITH_APPROVAL})
    run_id = api_b.call("POST", "/api/workflows/approved/runs/", 201, {"parameters": {}})["id"]
    wait_until(lambda: api_a.steps(run_id)["approval"]["status"] == "in-progress", 60)
    assert api_a.steps(run_id)["script"]["status"] == "success"
    assert "hello from a script" in api_a.log(run_id, "script")
    api_b.call("POST", f"/api/workflow-runs/{run_id}/steps/approval/approve/", 200)
    wait_until(lambda: api_a.run(run_id)["status"] == "complete", 60)
    assert api_a.run(run_id)["outcome"] == "success"
    assert "approved" in api_b.log(run_id, "after")

    # One beat is active: the first node's, which took the lock first.
    assert a.holds_the_beat() and not b.holds_the_beat()
    api_b.call("POST", "/api/workflows/", 201, {"name": "scheduled", "source": SCHEDULED})
    schedule = Schedule.objects.get(workflow__name="scheduled")

    # A script on B's steps worker: A's is held still (frozen) until B's has taken it.
    taken = b.scripts_taken()
    freeze(a.processes["steps"].pid)
    time.sleep(2)  # its last wait for a message (a second long) has ended
    api_b.call("POST", "/api/workflows/", 201, {"name": "long", "source": LONG})
    long_id = api_b.call("POST", "/api/workflows/long/runs/", 201, {"parameters": {}})["id"]
    wait_until(lambda: "started" in api_b.log(long_id, "long"), 60)
    step = StepRun.objects.get(run_id=long_id, name="long")
    assert b.scripts_taken() == taken + 1  # (and A's, frozen, could not have run it)

    # A dies (its beat with it), and B's steps worker; a schedule falls due meanwhile.
    killed_at = time.monotonic()
    a.kill()
    crash(b.processes["steps"].pid)
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() + timedelta(seconds=1))

    wait_until(b.holds_the_beat, 60, every=0.2)
    failover = time.monotonic() - killed_at
    print(f"\nthe beat failed over to node-b in {failover:.1f} s")
    assert failover <= TIMES["BEAT_LOCK_TIMEOUT"] + TIMES["BEAT_MAX_LOOP_INTERVAL"] + SLACK

    wait_until(lambda: StepRun.objects.get(pk=step.pk).status != "in-progress", 60, every=0.2)
    ended = time.monotonic() - killed_at
    print(f"the lost script's step failed {ended:.1f} s after the kill")
    # Documented: a lost script fails STEP_LOST_AFTER after its last heartbeat, at the next
    # sweep; with the beat's node gone, once a beat holds the lock again.
    bound = max(TIMES["STEP_LOST_AFTER"], TIMES["BEAT_LOCK_TIMEOUT"] + TIMES["BEAT_MAX_LOOP_INTERVAL"])
    assert ended <= bound + TIMES["WORKFLOW_SWEEP_INTERVAL"] + SLACK
    step.refresh_from_db()
    assert step.status == "failure"
    assert step.message.startswith(
        f"The worker running the script stopped (not heard of for {TIMES['STEP_LOST_AFTER']} seconds)"
    ), step.message
    wait_until(lambda: api_b.run(long_id)["status"] == "complete", 30)

    # The schedule's slot: one run, finished by B's engine worker; no second one later.
    wait_until(lambda: WorkflowRun.objects.filter(schedule=schedule, status="complete").exists(), 30)
    time.sleep(3 * TIMES["SCHEDULE_TICK_INTERVAL"])
    assert WorkflowRun.objects.filter(schedule=schedule).count() == 1

    # Nothing left in progress.
    assert not WorkflowRun.objects.exclude(status="complete").exists()
    assert not StepRun.objects.filter(status__in=["pending", "in-progress"]).exclude(run__status="complete")
    assert not StepRun.objects.filter(status="in-progress").exists()
    assert not ScriptRun.objects.filter(status__in=["queued", "running"]).exists()
    assert not Run.objects.filter(status__in=OPEN_STATES).exists()
