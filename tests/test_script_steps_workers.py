"""Script steps and their workers, each test with workers of its own: a `steps` worker killed
mid-script (the sandbox dies with it, the step ends `failure` with the reason instead of
waiting forever), and other images with a container runtime configured (the docker CLI, with
no engine to talk to: what can be checked here)."""

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction

from scriptsteps import cgroups, container, sandbox
from scriptsteps.models import ScriptRun
from tests.events_helpers import clear_queues, wait_until
from tests.script_helpers import LIMITS, crash, kill_tree, sandbox_processes, script_workers
from tests.test_script_steps import log_of
from tests.workflow_helpers import EngineWorker, finished, run_of, step_in
from workflows import engine
from workflows.models import StepRun
from workflows.steps.base import StepContext

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start_workers(django_db_blocker, bao, live_server, tmp_path):
    started = []

    def start(**env: str):
        clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))
        with django_db_blocker.unblock():
            workers = script_workers(tmp_path, bao, live_server.url, **env)
        started.extend(workers)
        return workers

    yield start
    for worker in started:
        worker.stop()


def test_a_worker_killed_mid_script_takes_its_sandbox_along_and_the_step_fails_saying_why(
    start_workers, owner
):
    engine_worker, steps_worker = start_workers(STEP_LOST_AFTER="2")
    run = run_of(
        owner,
        "apiVersion: v1\nsteps:\n- {name: long, image: relaysh/core, input: [echo started, sleep 60]}\n",
    )
    step = step_in(run, "long", "in-progress")
    wait_until(lambda: "started" in log_of(run, "long"), 30)
    assert sandbox_processes()
    kill_tree(steps_worker.process.pid)
    steps_worker.process.wait(timeout=10)
    # --die-with-parent: the sandbox went with the worker process that ran it.
    wait_until(lambda: not sandbox_processes(), 10)

    # The step is checked again at its recheck time (the beat's sweep; here, by hand).
    def ended() -> bool:
        engine.sweep()
        return StepRun.objects.get(pk=step.pk).status != "in-progress"

    wait_until(ended, 30, every=0.5)
    step.refresh_from_db()
    assert step.status == "failure"
    assert step.message.startswith("The worker running the script stopped (not heard of for 2 seconds)")
    assert ScriptRun.objects.get(pk=step.pk).status == "lost"
    assert finished(run).outcome == "failure"
    assert engine_worker.process.poll() is None
    # Its cgroups stayed (nobody was left to remove them): the next sandbox's setup removes
    # such empty ones once they are older than any step can run (here: at once).
    left = list((cgroups.ROOT / "pids" / settings.STEP_CGROUP_PARENT).glob("step-*"))
    assert left and all(not (path / "tasks").read_text() for path in left)
    assert cgroups.remove_stale(settings.STEP_CGROUP_PARENT, older_than=0) >= 3 * len(left)
    assert not list((cgroups.ROOT / "pids" / settings.STEP_CGROUP_PARENT).glob("step-*"))


@pytest.fixture
def own_mounts_and_cgroups():
    """A STEP_MOUNT_DIR and a STEP_CGROUP_PARENT of this test's own, which no other test's (or
    other test session's) workers write to. Under /run: every sandbox uid may reach it."""
    mount_dir = Path(tempfile.mkdtemp(prefix="relay-step-mounts-test-", dir="/run"))
    os.chmod(mount_dir, 0o755)
    parent = f"relay-steps-test-{uuid.uuid4().hex[:8]}"
    yield mount_dir, parent
    shutil.rmtree(mount_dir, ignore_errors=True)
    cgroups.remove_orphans(parent, lambda name: name.startswith("step-"))
    for controller in cgroups.CONTROLLERS:
        with contextlib.suppress(OSError):
            (cgroups.ROOT / controller / parent).rmdir()


def test_a_steps_worker_starting_removes_what_dead_workers_left_and_nothing_of_live_ones(
    start_workers, own_mounts_and_cgroups, owner, bao, live_server, tmp_path
):
    """A SIGKILLed steps worker leaves its step's network directory and cgroups, and its
    processes' generated /etc: the next steps worker to start on the machine removes them, and
    a third one starting while the second runs a script leaves the second's alone."""
    mount_dir, parent = own_mounts_and_cgroups
    env = {"STEP_MOUNT_DIR": str(mount_dir), "STEP_CGROUP_PARENT": parent}

    def leftovers() -> set[str]:
        return {path.name for path in mount_dir.glob("[ne][et][tc]-*")} | {
            path.name for path in (cgroups.ROOT / "pids" / parent).glob("step-*")
        }

    def steps_worker(name: str) -> EngineWorker:
        common = {
            "VAULT_ADDR": bao.addr,
            "VAULT_TOKEN": bao.root().token,
            "STEP_RUNTIME_URL": live_server.url,
        }
        limits = {**LIMITS, "STEP_WALL_TIME": "60"}
        return EngineWorker(
            tmp_path / f"{name}.log", concurrency=2, queues="steps", **common, **limits, **env
        )

    _, dead = start_workers(**env)
    run = run_of(
        owner,
        "apiVersion: v1\nsteps:\n- {name: long, image: relaysh/core, input: [echo started, sleep 60]}\n",
    )
    wait_until(lambda: "started" in log_of(run, "long"), 30)
    left = leftovers()
    assert {name.split("-")[0] for name in left} == {"net", "etc", "step"}, left
    crash(dead.process.pid)
    dead.process.wait(timeout=10)
    wait_until(lambda: not sandbox_processes(), 10)
    assert leftovers() == left  # nobody was left to remove them

    live = steps_worker("live")
    try:
        assert not leftovers() & left  # gone as the next steps worker started
        second = run_of(
            owner,
            "apiVersion: v1\nsteps:\n- {name: b, image: relaysh/core, input: [echo started, sleep 15]}\n",
            name="second",
        )
        wait_until(lambda: "started" in log_of(second, "b"), 30)
        running = leftovers()
        assert {name.split("-")[0] for name in running} == {"net", "etc", "step"}, running
        third = steps_worker("third")
        third.stop()
        assert leftovers() >= running  # a live worker's: kept
        assert StepRun.objects.get(run=second).status == "in-progress"  # (still running, so still its)
        assert finished(second, timeout=60).outcome == "success"
    finally:
        live.stop()


def test_a_script_whose_writes_meet_a_busy_database_keeps_its_log_and_its_end(start_workers, owner):
    """What `make run`'s SQLite does to a writer in a burst (it waits, then gives up with
    "database is locked"), made here with PostgreSQL: the workers give up on a lock after
    0.2 s, and the log's table is locked for longer, twice. Before, the write's error ended
    the step ("The sandbox failed") or left it to be declared lost."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}?options=-c%20lock_timeout%3D200"
    _, steps_worker = start_workers(DATABASE_URL=url)
    lines = [f"line {i}" for i in range(1, 41)]
    source = (
        "apiVersion: v1\nsteps:\n- name: talk\n  image: relaysh/core\n  input:\n"
        "  - for i in $(seq 1 40); do echo line $i; sleep 0.1; done\n"
    )
    run = run_of(owner, source)
    wait_until(lambda: "line 1\n" in log_of(run, "talk"), 60)
    for _ in range(2):
        with transaction.atomic(), connection.cursor() as cursor:
            # Inserts (a log's next chunk) wait, and give up after 0.2 s.
            cursor.execute("LOCK TABLE scriptsteps_logchunk IN SHARE MODE")
            time.sleep(1.5)
        time.sleep(0.3)
    run = finished(run, 60)
    step = run.steps.get(name="talk")
    assert (step.status, step.message) == ("success", "")
    assert log_of(run, "talk") == "".join(f"{line}\n" for line in lines)
    # It did meet the lock (and said so, as information: nothing was lost).
    said = steps_worker.log_path.read_text()
    assert "waited for the database" in said and "ERROR" not in said, said


def test_other_images_go_to_the_configured_container_runtime(start_workers, owner):
    start_workers(STEP_CONTAINER_RUNTIME="docker")
    source = """
apiVersion: v1
steps:
- name: alpine
  image: alpine:3
  input: [echo hello from alpine]
"""
    run = finished(run_of(owner, source))
    step = run.steps.get(name="alpine")
    # Nothing runs docker's engine here: its CLI says so, and the step fails with that.
    assert step.status == "failure"
    assert step.message == "The script exited with status 125."
    assert "Cannot connect to the Docker daemon" in log_of(run, "alpine")


def test_the_container_command_line_carries_the_program_and_limits_but_no_values():
    ctx = StepContext(
        step_run_id="s",
        run_id="r",
        owner_id=1,
        step_name="build",
        image="alpine:3",
        spec={},
        env={},
        state={},
        started_at=datetime.now(UTC),
    )
    program = sandbox.Program(argv=[], env={"METADATA_API_URL": "http://rlys_x@h", "TOKEN": "s3cret"})
    limits = sandbox.Limits(10, 5, 64 * 1024 * 1024, 32, 1000, 1000)
    argv = container.command("podman", ctx, program, limits, "relay-step-1", "/srv/s.sh")
    assert argv[:4] == ["podman", "run", "--rm", "--name=relay-step-1"]
    assert argv[-3:] == [f"--entrypoint={sandbox.SCRIPT_PATH}", "--", "alpine:3"]
    assert f"--volume=/srv/s.sh:{sandbox.SCRIPT_PATH}:ro" in argv
    for option in (
        "--pids-limit=32",
        f"--memory={64 * 1024 * 1024}b",
        "--ulimit=cpu=5:5",
        "--network=none",
        "--cap-drop=ALL",
    ):
        assert option in argv
    assert not any("s3cret" in arg or "rlys_" in arg for arg in argv)  # values: from the environment
    assert [arg for arg in argv if arg.startswith("--env")] == ["--env=METADATA_API_URL", "--env=TOKEN"]
    with_command = container.command(
        "docker",
        StepContext(**{**ctx.__dict__, "command": "/bin/run", "args": ("a", "b")}),
        sandbox.Program(argv=[], env={}, network=False),
        limits,
        "n",
        None,
    )
    assert with_command[-5:] == ["--entrypoint=/bin/run", "--", "alpine:3", "a", "b"]


def test_without_cgroups_a_process_flood_is_bounded_by_its_own_uids_process_limit(start_workers, owner):
    """RLIMIT_NPROC counts every process of a real uid: each sandbox has a uid of its own, so
    the limit is the step's, and the supervisor, counting that uid's processes every 0.25 s,
    stops a step it finds at the limit. (A bomb whose forks fail may also give up and exit
    between two looks; it was bounded all the same.)"""
    _, steps_worker = start_workers(STEP_CGROUPS="false", STEP_WALL_TIME="20")
    source = """
apiVersion: v1
steps:
- name: fork-bomb
  image: relaysh/core
  input: ["#!/bin/bash", "for i in $(seq 500); do sleep 30 & done", "wait"]
"""
    run = run_of(owner, source)
    most = 0
    while run.steps.get().status in ("pending", "in-progress"):
        most = max(most, len(sandbox_processes()))
    run = finished(run)
    step = run.steps.get()
    assert step.status == "failure", (most, log_of(run, "fork-bomb")[-2000:])
    assert step.message == (
        "The step tried to run more than 48 processes at once (STEP_MAX_PROCESSES); it was stopped."
    )
    assert 10 < most <= 48  # it forked as far as the limit let it, and no further
    wait_until(lambda: not sandbox_processes(), 10)
    assert steps_worker.process.poll() is None
    after = run_of(
        owner, "apiVersion: v1\nsteps:\n- {name: ok, image: relaysh/core, input: [echo fine]}\n", name="after"
    )
    assert finished(after).outcome == "success"


def test_with_the_network_off_a_step_has_no_proxy_but_its_runtime_api_and_a_worker_without_the_sdk_says_so(
    start_workers, owner
):
    start_workers(STEP_NETWORK="false", STEP_PYTHON_DIR="/nonexistent/step-python")
    source = """
apiVersion: v1
steps:
- name: offline
  image: relaysh/core
  spec: {greeting: hi}
  input:
  - grep -c ':' /proc/net/dev
  - env | grep -ci proxy || true
  - ls /run/relay
  - ni get -p '{.greeting}'; echo
  - 'curl -sS -m 5 http://93.184.216.34/ || echo "no way out: $?"'
- name: py
  image: relaysh/core:latest-python
  dependsOn: offline
  input: ["#!/usr/bin/env python3", "import relay_sdk"]
"""
    run = finished(run_of(owner, source))
    steps = {step.name: step for step in run.steps.all()}
    log = log_of(run, "offline")
    assert steps["offline"].status == "success", log
    # One interface (its own loopback), no proxy variables and no proxy's socket, the
    # runtime API all the same, and nothing else.
    lines = log.splitlines()
    assert lines[:4] == ["1", "0", "runtime.sock", "hi"], log
    assert "Failed to connect" in log or "Couldn't connect" in log
    assert lines[-1] == "no way out: 7"
    # The worker's lack, not the step's: system-error, which ends the run so.
    assert (steps["py"].status, run.outcome) == ("system-error", "system-error")
    assert steps["py"].message == (
        "relay_sdk for relaysh/core:latest-python is not installed on this worker "
        "(/nonexistent/step-python; `make .step-python/.installed` builds it)."
    )


CHECKOUT_STEPS = """
apiVersion: v1
steps:
- name: core
  image: relaysh/core
  spec: {greeting: hi}
  input: ['echo "core says $(ni get -p "{.greeting}")"']
- name: py
  image: relaysh/core:latest-python
  spec: {greeting: hello}
  input:
  - "#!/usr/bin/env python3"
  - "from relay_sdk import Interface, Dynamic as D"
  - "print('py says', Interface().get(D.greeting))"
"""


def test_script_steps_run_from_a_checkout_inside_a_0700_directory(start_workers, owner, tmp_path):
    """A clone in a home directory, /root or a `mktemp -d` (here: `ni` and `.step-python/` of
    a copy inside a 0700 directory, its files 0600 as a clone under umask 077 makes them):
    the sandbox's own uid cannot reach them there, yet every step runs."""
    home = tmp_path / "home"
    checkout = home / "relay"
    checkout.mkdir(parents=True)
    home.chmod(0o700)
    ni = checkout / "ni"
    shutil.copy2(settings.STEP_NI, ni)
    python = checkout / ".step-python"
    shutil.copytree(settings.STEP_PYTHON_DIR, python, symlinks=True)
    for path in [ni, *python.rglob("*")]:
        if path.is_file() and not path.is_symlink():
            path.chmod(0o700 if path == ni else 0o600)
    start_workers(STEP_NI=str(ni), STEP_PYTHON_DIR=str(python))
    run = finished(run_of(owner, CHECKOUT_STEPS), timeout=60)
    steps = {step.name: step for step in run.steps.all()}
    assert (steps["core"].status, steps["py"].status) == ("success", "success"), (
        [(step.name, step.message) for step in steps.values()],
        log_of(run, "core"),
        log_of(run, "py"),
    )
    assert log_of(run, "core") == "core says hi\n"
    assert log_of(run, "py") == "py says hello\n"

    # A new `ni` is what the next sandbox gets.
    ni.write_text("#!/bin/sh\necho new ni\n")
    source = "apiVersion: v1\nsteps:\n- {name: s, image: relaysh/core, input: [ni]}\n"
    again = finished(run_of(owner, source, name="again"), timeout=60)
    assert log_of(again, "s") == "new ni\n"


def test_a_sandbox_that_cannot_start_ends_its_step_system_error_with_bubblewraps_reason(start_workers, owner):
    # bubblewrap refuses to set the sandbox up (a /work of 0 bytes): nothing of the step runs.
    start_workers(STEP_WORK_DIR_BYTES="0")
    source = (
        "apiVersion: v1\nsteps:\n- {name: s, image: relaysh/core, input: [echo ran]}\n"
        "- {name: after, image: relaysh/core, dependsOn: s, input: [echo ran]}\n"
    )
    run = finished(run_of(owner, source), timeout=60)
    steps = {step.name: step for step in run.steps.all()}
    assert steps["s"].status == "system-error"
    assert steps["s"].message == "The sandbox could not start: bwrap: --size takes a non-zero number of bytes"
    assert "ran" not in log_of(run, "s")
    assert steps["after"].status == "skipped"
    assert run.outcome == "system-error"
    assert run.message == f"Step 's' could not be run: {steps['s'].message}"


def test_a_mount_directory_the_sandboxes_cannot_reach_is_said_as_such(start_workers, owner, tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    start_workers(STEP_MOUNT_DIR=str(hidden / "mounts"))
    source = "apiVersion: v1\nsteps:\n- {name: s, image: relaysh/core, input: [exit 0]}\n"
    run = finished(run_of(owner, source))
    step = run.steps.get()
    assert step.status == "system-error"
    assert step.message.startswith(f"The sandboxes' uid cannot reach STEP_MOUNT_DIR ({hidden / 'mounts'}): ")
    assert f"{hidden} is mode 0700" in step.message
