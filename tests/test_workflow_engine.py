"""The workflow engine on real Celery worker processes (one prefork worker shared by the
module): steps start once whatever the messages, independent steps run side by side, RFC
0005's statuses and outcomes, parameters, approvals, cancel, wake-ups and images nothing runs."""

import logging
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.conftest import run_concurrently
from tests.workflow_helpers import (
    NOOP,
    EngineWorker,
    finished,
    make_workflow,
    run_of,
    statuses,
    step_in,
    steps_of,
    vault_worker,
    wait_until,
)
from workflows import engine, tasks
from workflows.models import Conflict, StepRun, WorkflowRun, WorkflowSecret

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, bao, tmp_path_factory):
    """One worker of four processes for the whole module (starting one takes seconds)."""
    log_path = tmp_path_factory.mktemp("engine") / "worker.log"
    with vault_worker(
        django_db_blocker, bao, log_path, concurrency=4, WORKFLOW_STEP_MAX_ATTEMPTS="2"
    ) as process:
        yield process


def starts_logged(worker: EngineWorker, step: StepRun) -> int:
    return worker.log().count(f"({step.pk}) started")


def test_outputs_flow_down_a_chain_and_the_run_succeeds(worker, owner):
    run = run_of(
        owner,
        f"""
apiVersion: v1
parameters:
  greeting: {{default: hello}}
steps:
- name: a
  image: {NOOP}
  spec: {{outputs: {{word: !Parameter greeting, n: 2}}}}
- name: b
  image: {NOOP}:latest
  spec:
    outputs:
      sentence: ${{outputs.a.word + ' world'}}
      twice: !Fn.concat [!Output [a, word], !Output [a, word]]
""",
    )
    run = finished(run)
    assert (run.outcome, run.message) == ("success", "")
    steps = steps_of(run)
    assert steps["a"].outputs == {"word": "hello", "n": 2}
    assert steps["b"].outputs == {"sentence": "hello world", "twice": "hellohello"}
    assert steps["a"].ended_at <= steps["b"].started_at  # b used a's output: it came after
    assert run.parameters == {"greeting": "hello"}


def test_a_step_starts_once_however_many_messages_ask(worker, owner):
    run = run_of(owner, f"apiVersion: v1\nsteps:\n- name: only\n  image: {NOOP}\n  spec: {{sleep: 0.2}}\n")
    step = steps_of(run)["only"]
    handled = handled_starts(worker)
    run.begin()  # as start_run would: now every message for the step finds it ready
    for _ in range(20):
        tasks.start_step.delay(str(step.pk))
        tasks.start_run.delay(str(run.pk))
    run = finished(run)
    assert run.outcome == "success"
    step.refresh_from_db()
    assert step.status == "success" and step.attempts == 1
    wait_until(lambda: handled_starts(worker) >= handled + 20)  # every message was handled
    assert starts_logged(worker, step) == 1


def test_a_step_starts_once_when_many_workers_claim_it_at_the_same_instant(worker, owner, caplog):
    run = run_of(owner, f"apiVersion: v1\nsteps:\n- name: only\n  image: {NOOP}\n")
    step = steps_of(run)["only"]
    run.begin()
    caplog.set_level(logging.INFO, logger="workflows.steps.noop")
    results = run_concurrently(16, lambda i: engine.start_step(str(step.pk)))
    assert results == [None] * 16
    step.refresh_from_db()
    assert step.status == "success" and step.attempts == 1
    # Here, or in the module's worker, which got the run's own start_run message.
    here = [r.getMessage() for r in caplog.records].count(f"noop step only ({step.pk}) started")
    assert here + starts_logged(worker, step) == 1


def handled_starts(worker: EngineWorker) -> int:
    return len(re.findall(r"Task workflows\.tasks\.start_step\[[^\]]+\] succeeded", worker.log()))


def test_independent_steps_run_side_by_side(worker, owner):
    names = ["one", "two", "three", "four"]
    body = "".join(f"- name: {n}\n  image: {NOOP}\n  spec: {{sleep: 1}}\n" for n in names)
    run = finished(run_of(owner, f"apiVersion: v1\nsteps:\n{body}"))
    assert run.outcome == "success"
    steps = steps_of(run).values()
    first_start = min(s.started_at for s in steps)
    assert max(s.started_at for s in steps) - first_start < timedelta(seconds=0.9)
    assert max(s.ended_at for s in steps) - first_start < timedelta(seconds=2)  # not 4 s in a row


FAILING = f"""
apiVersion: v1
steps:
- name: a
  image: {NOOP}
  spec: {{fail: boom}}
- name: needs-a
  image: {NOOP}
  dependsOn: a
- name: after-needs-a
  image: {NOOP}
  dependsOn: needs-a
"""


def test_a_failed_step_skips_its_dependents_and_fails_the_run(worker, owner):
    run = finished(run_of(owner, FAILING))
    assert run.outcome == "failure" and run.message == "Failed: a."
    steps = steps_of(run)
    assert {n: s.status for n, s in steps.items()} == {
        "a": "failure",
        "needs-a": "skipped",
        "after-needs-a": "skipped",
    }
    assert steps["a"].message == "boom"
    assert (
        steps["needs-a"].message == "Skipped: it depends on steps that did not succeed ('a' ended failure)."
    )
    assert steps["after-needs-a"].started_at is None


def test_a_true_condition_on_a_failed_status_keeps_the_run_from_failing(worker, owner):
    run = finished(
        run_of(
            owner,
            f"""
apiVersion: v1
parameters:
  prod: {{default: false}}
steps:
- name: a
  image: {NOOP}
  spec: {{fail: boom}}
- name: on-failure
  image: {NOOP}
  when: !Fn.equals [!Status a, failure]
  spec: {{outputs: {{status: !Status a}}}}
- name: on-success
  image: {NOOP}
  when: !Fn.equals [!Status a, success]
- name: always
  image: {NOOP}
  when: !Fn.notEquals [!Status a, skipped]
- name: not-in-prod
  image: {NOOP}
  when: ${{parameters.prod}}
""",
        )
    )
    steps = steps_of(run)
    assert {n: s.status for n, s in steps.items()} == {
        "a": "failure",
        "on-failure": "success",
        "on-success": "skipped",
        "always": "success",
        "not-in-prod": "skipped",
    }
    assert steps["on-failure"].outputs == {"status": "failure"}
    assert steps["on-failure"].excused == ["a"] and steps["always"].excused == ["a"]
    assert steps["on-failure"].started_at >= steps["a"].ended_at  # !Status: after it, whatever it did
    assert steps["not-in-prod"].message == "Skipped: its `when` is false."
    assert (run.outcome, run.message) == ("success", "")


def test_a_condition_that_is_not_true_or_false_fails_the_step(worker, owner):
    run = finished(run_of(owner, f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n  when: ${{'yes'}}\n"))
    step = steps_of(run)["a"]
    assert step.status == "failure" and step.started_at is not None
    assert step.message == "The step cannot be decided: its `when` is string, not true or false."
    assert run.outcome == "failure"


def test_an_image_nothing_runs_fails_its_step_naming_what_can(worker, owner):
    run = finished(
        run_of(owner, "apiVersion: v1\nsteps:\n- name: build\n  image: alpine:3\n  input: [make]\n")
    )
    step = steps_of(run)["build"]
    assert step.status == "failure"
    assert step.message == (
        "No step here runs the image 'alpine:3'. The images this service runs itself: "
        "relay-internal/noop, relaysh/core, relaysh/puppet-step-plan-run-start, relaysh/puppet-step-run, "
        "relaysh/puppet-step-run-start, relaysh/puppet-step-run-wait, "
        "relaysh/puppet-step-task-run-start, relaysh/slack-step-message-send "
        "(relaysh/core runs its script in a sandbox, any tag). Other images need a container "
        "runtime, and none is configured: set STEP_CONTAINER_RUNTIME=podman (or docker) on the "
        "workers to run them."
    )
    assert run.outcome == "failure" and run.message == "Failed: build."


def test_a_missing_parameter_fails_the_run_before_any_step_starts(owner):
    workflow = make_workflow(
        owner, f"apiVersion: v1\nparameters:\n  host: {{}}\nsteps:\n- name: a\n  image: {NOOP}\n"
    )
    with pytest.raises(engine.ParameterError, match=r"^Missing required parameters: host\.$"):
        engine.create_run(workflow, {})
    assert not WorkflowRun.objects.exists()
    run = engine.create_run(workflow, {}, strict=False)  # as an event would
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("complete", "failure")
    assert run.message == "Missing required parameters: host."
    assert statuses(run) == {"a": "skipped"} and steps_of(run)["a"].started_at is None


def test_secrets_are_read_from_vault_when_the_step_starts(worker, owner, bao):
    workflow = make_workflow(
        owner,
        f"""
apiVersion: v1
steps:
- name: a
  image: {NOOP}
  spec: {{outputs: {{length: !Fn.jsonMarshal [!Secret api-key]}}}}
- name: b
  image: {NOOP}
  spec:
    outputs:
      x: ${{secrets.unset}}
- name: c
  image: {NOOP}
  spec:
    puppet: !Connection {{type: puppet, name: nowhere}}
    outputs: {{x: !Output [a, nothing], y: !Output [a, length]}}
""",
    )
    WorkflowSecret.put(workflow, "api-key", "s3cr3t", owner)
    assert bao.read(f"relay/workflows/{workflow.pk}/secrets/api-key") == {"value": "s3cr3t"}
    run = finished(engine.create_run(workflow, {}))
    steps = steps_of(run)
    assert steps["a"].outputs == {"length": '"s3cr3t"'}
    assert steps["b"].status == "failure"
    assert (
        steps["b"].message
        == "Its spec refers to what is not there: secret 'unset' (not set for this workflow)."
    )
    assert steps["c"].status == "failure"
    assert steps["c"].message == (
        "Its spec refers to what is not there: connection puppet 'nowhere' (the workflow's owner has none "
        "by that name); output 'nothing' of step 'a' (never set)."
    )
    assert "s3cr3t" not in run.message + steps["b"].message + steps["c"].message


def test_a_handler_that_keeps_raising_ends_in_system_error_after_bounded_attempts(worker, owner):
    puppet = puppet_run(owner)
    run = finished(
        run_of(
            owner,
            f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n  spec: {{raise: no database}}\n"
            f"- name: b\n  image: {NOOP}\n  dependsOn: a\n"
            f"- name: c\n  image: {NOOP}\n  spec: {{waitForPuppetRun: '{puppet.pk}'}}\n",
        ),
        timeout=60,
    )
    steps = steps_of(run)
    assert steps["a"].status == "system-error" and steps["a"].attempts == 2
    assert steps["a"].message == "Gave up after 2 attempts: Attempt 2 failed: RuntimeError: no database"
    assert steps["b"].status == "skipped"
    assert steps["c"].status == "cancelled"  # a system error stops the run
    assert run.outcome == "system-error"
    assert run.message.startswith("Step 'a' could not be run: Gave up after 2 attempts")


# Approvals -----------------------------------------------------------------------------------

APPROVAL = f"""
apiVersion: v1
steps:
- name: dry-run
  image: {NOOP}
  spec: {{sleep: 0.5}}
- name: approve
  type: approval
  dependsOn: dry-run
- name: real-run
  image: {NOOP}
  dependsOn: approve
"""


def test_an_approval_waits_for_its_dependencies_then_an_answer(worker, owner):
    run = run_of(owner, APPROVAL)
    approval = steps_of(run)["approve"]
    step_in(run, "dry-run", "in-progress")
    with pytest.raises(Conflict, match="not waiting for an answer yet"):
        approval.approve(owner)
    approval = step_in(run, "approve", "in-progress")
    assert steps_of(run)["dry-run"].status == "success"
    assert approval.recheck_at - approval.started_at == timedelta(seconds=settings.APPROVAL_TIMEOUT)
    assert steps_of(run)["real-run"].status == "pending"
    engine.answer(approval, owner, approve=True)
    run = finished(run)
    steps = steps_of(run)
    assert run.outcome == "success" and steps["real-run"].status == "success"
    assert (steps["approve"].decision, steps["approve"].decided_by, steps["approve"].message) == (
        "approved",
        owner,
        "Approved by ops.",
    )
    with pytest.raises(Conflict, match="is success; it can no longer be answered"):
        steps["approve"].reject(owner)


def test_a_rejected_approval_fails_the_run_and_nothing_after_it_runs(worker, owner):
    run = run_of(owner, APPROVAL)
    engine.answer(step_in(run, "approve", "in-progress"), owner, approve=False)
    run = finished(run)
    assert statuses(run) == {"dry-run": "success", "approve": "failure", "real-run": "skipped"}
    assert run.outcome == "failure" and steps_of(run)["approve"].decision == "rejected"


def test_an_approval_nobody_answers_in_time_fails_the_run(worker, owner):
    run = run_of(owner, APPROVAL)
    approval = step_in(run, "approve", "in-progress")
    engine.sweep()  # not due yet
    assert StepRun.objects.get(pk=approval.pk).status == "in-progress"
    # An hour passes.
    StepRun.objects.filter(pk=approval.pk).update(recheck_at=timezone.now() - timedelta(seconds=1))
    engine.sweep()
    run = finished(run)
    approval.refresh_from_db()
    assert approval.status == "failure" and approval.message == "No answer within 3600 seconds."
    assert statuses(run)["real-run"] == "skipped" and run.outcome == "failure"


# Waiting on Puppet, and cancelling -----------------------------------------------------------


def puppet_run(owner: User) -> Run:
    connection, _ = PuppetConnection.create_with_token(owner=owner, name="dc")
    return Run.create_for(connection, {"scope": {"nodes": ["web1.example.com"]}})


def test_a_step_waiting_on_a_puppet_run_holds_no_worker_and_wakes_when_it_ends(worker, owner):
    puppet = puppet_run(owner)
    run = run_of(
        owner,
        f"apiVersion: v1\nsteps:\n- name: wait\n  image: {NOOP}\n"
        f"  spec: {{waitForPuppetRun: '{puppet.pk}'}}\n",
    )
    wait_until(lambda: StepRun.objects.get(run=run, name="wait").wake_key == str(puppet.pk))
    step = StepRun.objects.get(run=run, name="wait")
    assert step.status == "in-progress" and step.lease_id is None  # no worker holds it
    assert step.recheck_at > timezone.now() + timedelta(minutes=50)  # only a wake-up ends it soon
    puppet.accept(None, "test")
    Run.update_state_of(puppet.connection, puppet.pk, {"status": "complete", "outcome": "finished"}, "test")
    run = finished(run, timeout=10)
    assert run.outcome == "success" and steps_of(run)["wait"].outputs == {"outcome": "finished"}


def test_cancel_skips_what_has_not_started_and_cancels_what_has(worker, owner):
    puppet = puppet_run(owner)
    run = run_of(
        owner,
        f"""
apiVersion: v1
steps:
- name: wait
  image: {NOOP}
  spec: {{waitForPuppetRun: '{puppet.pk}'}}
- name: after-wait
  image: {NOOP}
  dependsOn: wait
- name: gate
  type: approval
""",
    )
    wait_until(lambda: StepRun.objects.get(run=run, name="wait").wake_key != "")
    step_in(run, "gate", "in-progress")
    engine.cancel_run(WorkflowRun.objects.get(pk=run.pk))
    run = finished(run, timeout=10)
    steps = steps_of(run)
    assert statuses(run) == {"wait": "cancelled", "after-wait": "skipped", "gate": "cancelled"}
    assert steps["wait"].message == "Cancelled with the run."
    assert steps["gate"].message == "Cancelled with the run before anyone answered."
    assert (run.outcome, run.message) == ("cancelled", "Cancelled.")
    assert f"({steps['wait'].pk}) cancelled" in worker.log()  # through the handler's cancel
    with pytest.raises(Conflict, match="nothing to cancel"):
        engine.cancel_run(run)


def test_an_error_that_quotes_a_secret_shows_it_masked_in_the_step_s_message(worker, owner):
    """relay-core's arithmetic error quotes the value it met: the step's message, which the
    API, the admin and approvers see, masks what the evaluation read."""
    workflow = make_workflow(
        owner,
        f"""
apiVersion: v1
steps:
- name: a
  image: {NOOP}
  when: ${{-secrets.pw > 1}}
- name: b
  image: {NOOP}
  spec:
    x: ${{-secrets.pw}}
""",
    )
    WorkflowSecret.put(workflow, "pw", "hunter2-the-password", owner)
    run = finished(engine.create_run(workflow, {}))
    steps = steps_of(run)
    assert steps["a"].message.startswith("The step cannot be decided: its `when` failed: ")
    assert steps["b"].message.startswith('Its spec could not be evaluated: path "x": ')
    for step in steps.values():
        assert step.status == "failure"
        assert step.message.endswith("unexpected ***(string) expected number")
    assert "hunter2" not in run.message + steps["a"].message + steps["b"].message
