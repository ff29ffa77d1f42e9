"""Script steps (`relaysh/core`, `relaysh/core:latest-python`) end to end: real bubblewrap
sandboxes on a real worker of the `steps` queue, the engine on its own worker, the step
runtime API on the live server, PostgreSQL and OpenBao. What a step can do (ni, jq, relay_sdk,
command/args), what it cannot see (the service, another step's /work), its limits (a fork
bomb, endless output, a step that never ends, memory, CPU: each fails the step with its
reason and the worker lives), its log (stored as it runs, tailed over the API, secrets
masked) and cancel."""

import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from scriptsteps.models import LogChunk, ScriptRun
from tests.conftest import client_for
from tests.events_helpers import wait_until
from tests.script_helpers import running_script_workers, sandbox_processes
from tests.workflow_helpers import finished, make_workflow, run_of, step_in, steps_of
from workflows import engine
from workflows.models import WorkflowSecret

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, bao, live_server, tmp_path_factory):
    scripts = tmp_path_factory.mktemp("scripts")
    with running_script_workers(django_db_blocker, bao, live_server.url, scripts) as workers:
        yield workers


def log_of(run, name: str) -> str:
    return "".join(
        LogChunk.objects.filter(script_id=steps_of(run)[name].pk)
        .order_by("start")
        .values_list("text", flat=True)
    )


CORE_STEP = """
apiVersion: v1
parameters:
  statuses:
    default:
      "File[/etc/motd]": {corrective_change: true}
      "File[/tmp/x]": {corrective_change: false}
steps:
- name: detect
  image: relaysh/core
  spec:
    resourceStatuses: !Parameter statuses
  input:
  - ni get | jq .resourceStatuses
  - CHANGES=$(ni get | jq -r '.resourceStatuses | to_entries[] | select(.value.corrective_change) | .key')
  - 'echo "Detected changes, if any: ${CHANGES}"'
  - ni output set -k detectedChanges -v "$CHANGES"
- name: after
  image: relay-internal/noop
  spec:
    outputs: {seen: !Output [detect, detectedChanges]}
"""


def test_a_core_step_reads_its_spec_with_ni_and_jq_and_sets_an_output(workers, owner):
    run = finished(run_of(owner, CORE_STEP))
    steps = steps_of(run)
    assert run.outcome == "success", (run.message, steps["detect"].message, log_of(run, "detect"))
    assert steps["detect"].outputs == {"detectedChanges": "File[/etc/motd]"}
    assert steps["after"].outputs == {"seen": "File[/etc/motd]"}
    log = log_of(run, "detect")
    assert '"corrective_change": true' in log
    assert "Detected changes, if any: File[/etc/motd]" in log
    script = ScriptRun.objects.get(pk=steps["detect"].pk)
    assert script.status == "exited" and script.exit_code == 0 and script.first_output_ms is not None


def test_a_python_step_uses_the_official_sdk(workers, owner):
    source = """
apiVersion: v1
steps:
- name: py
  image: relaysh/core:latest-python
  spec: {name: relay}
  input:
  - "#!/usr/bin/env python3"
  - from relay_sdk import Interface, Dynamic as D
  - relay = Interface()
  - relay.outputs.set("greeting", "hello " + relay.get(D.name))
  - print("the sdk says", relay.get(D.name))
"""
    run = finished(run_of(owner, source))
    step = steps_of(run)["py"]
    assert (run.outcome, step.status) == ("success", "success"), (step.message, log_of(run, "py"))
    assert step.outputs == {"greeting": "hello relay"}
    assert "the sdk says relay" in log_of(run, "py")


def test_command_and_args_run_without_a_shell_and_a_failing_script_fails_its_step(workers, owner):
    source = """
apiVersion: v1
steps:
- name: echo
  image: relaysh/core
  command: /bin/echo
  args: [hello, "$HOME", "a b"]
- name: fails
  image: relaysh/core
  input: ["echo about to fail", "exit 3"]
- name: nothing
  image: relaysh/core:latest
"""
    run = finished(run_of(owner, source))
    steps = steps_of(run)
    assert steps["echo"].status == "success"
    assert log_of(run, "echo") == "hello $HOME a b\n"
    assert (steps["fails"].status, steps["fails"].message) == ("failure", "The script exited with status 3.")
    assert log_of(run, "fails") == "about to fail\n"
    assert steps["nothing"].status == "failure"
    assert "has nothing to run: give `input`" in steps["nothing"].message


def test_the_sandbox_sees_nothing_of_the_service(workers, owner, tmp_path):
    beside = tmp_path / "host-file"
    beside.write_text("host")
    beside.chmod(0o644)
    paths = [
        settings.BASE_DIR,
        settings.BASE_DIR / "manage.py",
        settings.VAR_DIR,
        settings.BASE_DIR / ".venv",
        settings.STEP_PYTHON_DIR,  # mounted elsewhere, for the python image only
        "/root",
        "/etc/shadow",
        "/var/run/postgresql",
        "/work/wt",
        beside,
    ]
    checks = [f'[ -e "{path}" ] && echo "VISIBLE {path}"' for path in paths]
    source = f"""
apiVersion: v1
steps:
- name: look
  image: relaysh/core
  input:
{chr(10).join(f"  - '{line}'" for line in checks)}
  - env | grep -E "^(VAULT|DATABASE|SECRET|CELERY|REDIS|TOKEN_PEPPERS|DJANGO)" && echo LEAKED
  - touch /usr/x 2>/dev/null && echo WROTE-USR
  - touch /x 2>/dev/null && echo WROTE-ROOT
  - echo "uid $(id -u) gid $(id -g)"
  - grep CapEff /proc/self/status
  - echo "processes $(ls /proc | grep -cE '^[0-9]+$')"
  - echo here > /work/mine && cat /work/mine
"""
    run = finished(run_of(owner, source))
    log = log_of(run, "look")
    assert steps_of(run)["look"].status == "success", log
    for bad in ("VISIBLE", "LEAKED", "WROTE"):
        assert bad not in log, log
    assert "uid 1000 gid 1000" in log
    assert "CapEff:\t0000000000000000" in log
    assert "here" in log
    # Its own pid namespace: bwrap, the two listeners of its network (socat), the script, and
    # what the script runs (ls, grep).
    processes = int(log.split("processes ")[1].split()[0])
    assert processes <= 7, log


def test_a_step_cannot_read_another_steps_work_directory(workers, owner):
    """b searches the whole machine while a holds its files: a waits, b starts only once the
    test has seen a ready (an approval between them), so the two overlap however slow the
    machine is."""
    source = """
apiVersion: v1
steps:
- name: a
  image: relaysh/core
  input:
  - echo secret-of-a > /work/mine
  - echo secret-of-a > /tmp/mine
  - echo ready
  - sleep 300
- name: gate
  type: approval
- name: b
  image: relaysh/core
  dependsOn: gate
  input:
  - find / -name mine 2>/dev/null | sed 's/^/FOUND /'
  - grep -rs "secret-of-[a]" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr | sed 's/^/FOUND /'
  - grep -l "slee[p]" /proc/[0-9]*/cmdline 2>/dev/null | sed 's/^/FOUND /'
  - echo searched
"""
    run = run_of(owner, source)
    wait_until(lambda: "ready" in log_of(run, "a"), 60)
    wait_until(lambda: steps_of(run)["gate"].status == "in-progress", 30)
    engine.answer(steps_of(run)["gate"], owner, approve=True)
    wait_until(lambda: steps_of(run)["b"].status in ("success", "failure"), 120)
    steps = steps_of(run)
    assert steps["b"].status == "success", log_of(run, "b")
    assert steps["a"].status == "in-progress"  # b looked while a held its files
    assert log_of(run, "b") == "searched\n"
    engine.cancel_run(run)
    run = finished(run, 60)
    assert steps_of(run)["a"].status == "cancelled"


LIMITED = """
apiVersion: v1
steps:
- name: fork-bomb
  image: relaysh/core
  input: ["#!/bin/bash", "bomb() { bomb | bomb & }; bomb", "wait", "sleep 30"]
- name: endless-output
  image: relaysh/core
  input: ["yes 'spam spam spam'"]
- name: never-ends
  image: relaysh/core
  input: ["echo sleeping", "sleep 1000"]
- name: memory
  image: relaysh/core
  input: ["python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'"]
"""
# On its own: beside the others on 2 cores it could not spend 3 CPU seconds in the 8 s the
# wall-time limit gives it, and met that limit instead.
CPU_BOUND = """
apiVersion: v1
steps:
- name: cpu
  image: relaysh/core
  input: ["while :; do :; done"]
"""


def test_limits_end_their_steps_with_the_reason_and_the_worker_lives(workers, owner):
    # The fork bomb's `wait` returns once its first two processes have forked theirs: its
    # `sleep` keeps the script (and so the sandbox) alive until the bomb meets the limit,
    # which a loaded machine could otherwise let it outrun (the script ended 0 first).
    _, steps_worker = workers
    run = finished(run_of(owner, LIMITED), timeout=60)
    steps = steps_of(run)
    assert {name: step.status for name, step in steps.items()} == dict.fromkeys(steps, "failure")
    assert steps["fork-bomb"].message == (
        "The step tried to run more than 48 processes at once (STEP_MAX_PROCESSES); it was stopped."
    ) or steps["fork-bomb"].message == (
        "The step tried to run more than 48 processes at once (STEP_MAX_PROCESSES)."
    )
    assert steps["endless-output"].message == (
        f"The step printed more than {64 * 1024} bytes of output (STEP_OUTPUT_BYTES); it was stopped."
    )
    output = log_of(run, "endless-output")
    assert len(output) == 64 * 1024 and output.startswith("spam spam spam\n")
    assert (
        steps["never-ends"].message == "The step ran longer than 8 seconds (STEP_WALL_TIME); it was stopped."
    )
    assert log_of(run, "never-ends") == "sleeping\n"
    assert steps["memory"].message == (
        "The step ran out of memory: its processes used more than 96 MiB (STEP_MEMORY_BYTES)."
    )
    cpu = steps_of(finished(run_of(owner, CPU_BOUND, name="cpu"), timeout=60))["cpu"]
    assert (cpu.status, cpu.message) in (
        ("failure", "The step used more than 3 seconds of CPU (STEP_CPU_SECONDS); it was stopped."),
        ("failure", "The step used more than 3 seconds of CPU (STEP_CPU_SECONDS)."),
    )
    # Nothing of them is left, and the worker goes on running steps.
    wait_until(lambda: not sandbox_processes(), 10)
    assert steps_worker.process.poll() is None
    after = finished(
        run_of(
            owner,
            "apiVersion: v1\nsteps:\n- {name: ok, image: relaysh/core, input: [echo fine]}\n",
            name="after",
        )
    )
    assert after.outcome == "success"


def test_secrets_the_step_received_are_masked_in_its_log_even_split_across_reads(workers, owner):
    secret = 'Sup3r-s3cret-"Valu3"'
    source = """
apiVersion: v1
steps:
- name: leak
  image: relaysh/core
  spec: {token: !Secret apiToken, connection: !Connection {type: puppet, name: prod}}
  env: {TOKEN: !Secret apiToken}
  input:
  - 'echo "whole: $TOKEN"'
  - 'printf "split: %s" "$(printf %s "$TOKEN" | cut -c1-6)"; sleep 0.7'
  - 'printf "%s\\n" "$(printf %s "$TOKEN" | cut -c7-)"'
  - ni get
  - 'echo "url: $METADATA_API_URL"'
"""
    workflow = make_workflow(owner, source)
    WorkflowSecret.put(workflow, "apiToken", secret, owner)
    _, connection_token = PuppetConnection.create_with_token(owner=owner, name="prod")
    run = finished(engine.create_run(workflow, {}, created_by=owner))
    log = log_of(run, "leak")
    assert steps_of(run)["leak"].status == "success", log
    assert "whole: ***\n" in log and "split: ***\n" in log
    compact = log.replace(" ", "")
    assert '"token":"***"' in compact  # the secret, as `ni get` prints it (JSON-escaped)
    assert '"connection":{"relayAPIURL":"http://' in compact and '"token":"***"}' in compact
    assert str(connection_token) not in log
    assert "url: http://***:@" in log
    chunks = list(LogChunk.objects.filter(script_id=steps_of(run)["leak"].pk).values_list("text", flat=True))
    assert len(chunks) >= 2  # it was stored in pieces, while it ran
    for text in chunks:
        assert "s3cret" not in text and "Valu3" not in text and "rlys_" not in text, chunks


def test_the_log_api_shows_a_growing_tail_while_the_step_runs(workers, owner):
    source = """
apiVersion: v1
steps:
- name: slow
  image: relaysh/core
  input: ["for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"]
"""
    run = run_of(owner, source)
    api = client_for(owner)
    url = f"/api/workflow-runs/{run.pk}/steps/slow/log"
    seen, offset, texts = [], 0, []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = api.get(url, {"offset": offset}).json()
        assert body["offset"] == offset
        texts.append(body["text"])
        seen.append((body["status"], body["next_offset"], body["complete"]))
        offset = body["next_offset"]
        if body["complete"]:
            break
        time.sleep(0.2)
    assert seen[-1][2] and seen[-1][0] == "success"
    assert "".join(texts) == "".join(f"line {i}\n" for i in range(1, 7))
    growing = [next_offset for status, next_offset, _ in seen if status == "in-progress" and next_offset]
    assert len(set(growing)) >= 3  # several partial tails while it ran
    # A reader that starts late gets only what follows its offset.
    assert api.get(url, {"offset": 7}).json()["text"] == "".join(f"line {i}\n" for i in range(2, 7))


def test_the_log_api_refuses_what_it_cannot_answer(workers, owner):
    run = run_of(owner, "apiVersion: v1\nsteps:\n- {name: ok, image: relaysh/core, input: [echo fine]}\n")
    api = client_for(owner)
    base = f"/api/workflow-runs/{run.pk}/steps"
    for bad in ("-1", "x", "\u0661", "99999999999999999999"):  # \u0661: an Arabic-Indic 1
        response = api.get(f"{base}/ok/log", {"offset": bad})
        assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"
    response = api.get(f"{base}/missing/log")
    assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"
    other = User.objects.create_user("other")
    assert client_for(other).get(f"{base}/ok/log").status_code == 404
    finished(run)


def test_a_cancelled_run_stops_its_script_at_once(workers, owner):
    run = run_of(
        owner,
        "apiVersion: v1\nsteps:\n- {name: long, image: relaysh/core, input: [echo started, sleep 60]}\n",
    )
    step = step_in(run, "long", "in-progress")
    wait_until(lambda: "started" in log_of(run, "long"), 30)
    engine.cancel_run(run)
    run = finished(run, timeout=15)
    step.refresh_from_db()
    assert (run.outcome, step.status) == ("cancelled", "cancelled")
    script = ScriptRun.objects.get(pk=step.pk)
    wait_until(lambda: ScriptRun.objects.get(pk=step.pk).status == "exited", 10)
    script.refresh_from_db()
    assert script.reason == "Cancelled with the run."
    assert (script.ended_at - script.started_at).total_seconds() < 10
    wait_until(lambda: not sandbox_processes(), 10)


def test_the_admin_run_page_shows_each_script_steps_log_tail(workers, owner, client):
    run = finished(run_of(owner, CORE_STEP))
    admin = User.objects.create_superuser("boss", password="boss-password-1")
    client.force_login(admin)
    page = client.get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    assert "Detected changes, if any: File[/etc/motd]" in page
    assert f'data-log-url="/api/workflow-runs/{run.pk}/steps/detect/log"' in page
    assert "scriptsteps/log-tail.js" in page
    assert Path(settings.BASE_DIR / "scriptsteps/static/scriptsteps/log-tail.js").exists()
