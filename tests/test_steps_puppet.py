"""The Puppet steps the engine runs itself, driven as the engine drives them
(tests/step_helpers.py), against the real runs model, with a bridge played over the real
`/_puppet` API of a live server. (tests/test_steps_bridge.py: with `relay-bridge` itself.)"""

import time
from datetime import UTC, datetime, timedelta

import pytest
from relay_bridge.api import ApiError, RelayClient

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition, expire_runs
from tests.step_helpers import Connection, Step
from workflows.steps import registry
from workflows.steps.base import Done, Wait, image_name
from workflows.steps.puppet import RECHECK
from workflows.steps.puppet_run_start import RunStart

pytestmark = pytest.mark.django_db(transaction=True)

RUN_START = "relaysh/puppet-step-run-start"
RUN_WAIT = "relaysh/puppet-step-run-wait"
RUN = "relaysh/puppet-step-run"
TASK_RUN_START = "relaysh/puppet-step-task-run-start"
PLAN_RUN_START = "relaysh/puppet-step-plan-run-start"
PUPPET = Connection("puppet", "prod")


@pytest.fixture
def puppet(live_server, alice):
    """alice's `prod` connection, and a bridge for it played over the API."""
    connection, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    bridge = RelayClient(live_server.url, str(token), attempts=1)
    yield connection, bridge
    bridge.close()


def step(image: str, owner, **spec) -> Step:
    return Step(image, {"connection": PUPPET, **spec}, owner.pk)


def soon(seconds: float = 45) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def the_run() -> Run:
    return Run.objects.get()


def test_every_image_has_its_handler_and_tags_are_tolerated():
    # Each app's ready() registered its kinds: workflows' own (noop: WORKFLOW_NOOP_STEPS is
    # on in the tests), and scriptsteps' relaysh/core.
    assert registry.runnable_images() == sorted(
        [
            RUN_START,
            RUN_WAIT,
            RUN,
            TASK_RUN_START,
            PLAN_RUN_START,
            "relaysh/slack-step-message-send",
            "relaysh/core",
            "relay-internal/noop",
        ]
    )
    assert registry.HANDLERS[RUN_START] is RunStart
    assert isinstance(registry.handler_for("relaysh/puppet-step-run-start:latest"), RunStart)
    assert image_name("docker.io/relaysh/puppet-step-run-wait@sha256:ab12") == f"docker.io/{RUN_WAIT}"


# run-start


def test_run_start_makes_the_run_outputs_its_id_at_once_and_waits_for_the_bridge(puppet, alice):
    connection, bridge = puppet
    start = step(RUN_START, alice, environment="production", scope={"nodes": ["web1", "web2"]}, noop=True)
    first = start.start()
    run = the_run()
    assert isinstance(first, Wait) and first.outputs == {"id": str(run.id)}
    assert first.wake_on == ("puppet-run", str(run.id))
    assert first.recheck_at <= datetime.now(UTC) + RECHECK
    assert first.state == {"run": str(run.id), "connection": str(connection.pk)}  # ids, no token
    assert (run.connection, run.type, run.environment, run.scope, run.noop, run.no_noop, run.debug) == (
        connection,
        "run",
        "production",
        {"nodes": ["web1", "web2"]},
        True,
        False,
        False,
    )
    # Accepted, the run still shows `pending` on the wire: the step waits on, as the published loop.
    lease = bridge.accept(str(run.id))
    assert isinstance(start.check(), Wait)
    bridge.put_state(
        str(run.id), {"status": "in-progress", "job_id": "81", "next_update_before": soon()}, lease
    )
    done = start.check()
    assert isinstance(done, Done) and done.success
    assert start.outputs == {"id": str(run.id), "jobID": "81"}
    assert "taken by its bridge (in-progress, job 81)" in done.message


def test_run_start_is_done_without_a_job_id_when_the_bridge_has_none(puppet, alice):
    _, bridge = puppet

    def bridge_starts_it():
        run = Run.objects.filter(status="pending").first()
        if run is not None:
            lease = bridge.accept(str(run.id))
            bridge.put_state(str(run.id), {"status": "in-progress", "next_update_before": soon()}, lease)

    start = step(RUN_START, alice, scope={"nodes": ["web1"]})
    done = start.until_done(between=bridge_starts_it)
    assert done.success and start.outputs == {"id": str(the_run().id)}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"scope": {"nodes": ["Not A Certname"]}}, "spec.scope.nodes[0]: Not a valid certname"),
        ({}, "spec.scope: A run needs a scope."),
        (
            {"scope": {"nodes": ["a"], "query": "nodes {}"}},
            "spec.scope: Give exactly one of nodes, query, node_group or application.",
        ),
        ({"scope": {"nodes": ["a"]}, "noop": True, "no_noop": True}, "spec.no_noop: noop and no_noop cannot"),
        ({"scope": {"nodes": ["a"]}, "noop": "yes"}, "spec.noop: Must be true or false."),
        (
            {"scope": {"nodes": ["a"]}, "environment": "main"},
            "spec.environment: 'main' is reserved by Puppet.",
        ),
        ({"scope": {"nodes": []}}, "spec.scope.nodes: This list may not be empty."),
        (
            {"scope": {"nodes": ["a"]}, "noOp": True},
            "spec.noOp: relaysh/puppet-step-run-start takes no such field",
        ),
    ],
)
def test_run_start_refuses_what_post_puppet_runs_refuses(puppet, alice, spec, message):
    _, bridge = puppet
    with pytest.raises(ApiError) as refused:
        bridge.create_run(spec)
    assert refused.value.status == 400
    done = step(RUN_START, alice, **spec).start()
    assert isinstance(done, Done) and not done.success
    assert message in done.message
    assert not Run.objects.exists()


def test_a_bridge_on_open_source_puppet_limits_the_runs_as_the_api_does(puppet, alice):
    _, _ = puppet
    PuppetConnection.objects.update(platform="oss")  # the setting (issue 18 §3), no backend
    done = step(RUN_START, alice, scope={"query": "nodes { }"}).start()
    assert (
        "spec.scope: This connection runs open source Puppet: only the nodes scope"
        " (scope `query` needs the PE orchestrator)." in done.message
    )
    done = step(TASK_RUN_START, alice, name="package", scope={"nodes": ["a"]}).start()
    assert (
        "spec: This connection runs open source Puppet: only type 'run'"
        " (tasks need Bolt or the PE orchestrator, plans the orchestrator)." in done.message
    )
    assert not Run.objects.exists()


def test_a_missing_wrong_or_stale_connection_fails_the_step(puppet, alice):
    connection, _ = puppet
    assert (
        "spec.connection: give a puppet connection"
        in Step(RUN_START, {"scope": {"nodes": ["a"]}}, alice.pk).start().message
    )
    SlackConnection.create_with_token(owner=alice, name="team", token="xoxb-1-2-abc")
    slack = Step(RUN_START, {"connection": Connection("slack", "team"), "scope": {"nodes": ["a"]}}, alice.pk)
    assert "spec.connection: give a puppet connection" in slack.start().message
    old = connection.secret_value("token")
    connection.regenerate_token()
    stale = Step(
        RUN_START,
        {"connection": {"relayAPIURL": "x", "token": str(old)}, "scope": {"nodes": ["a"]}},
        alice.pk,
    )
    assert "its token is no puppet connection's" in stale.start().message
    assert not Run.objects.exists()


def test_run_start_ends_when_the_run_ended_before_a_bridge_took_it(puppet, alice):
    _, bridge = puppet
    start = step(RUN_START, alice, scope={"nodes": ["web1"]})
    start.start()
    bridge.cancel(str(the_run().id))
    done = start.check()
    assert done.success and "ended before a bridge took it: cancelled." in done.message


def test_run_start_ends_when_a_bridge_took_the_run_and_finished_it_between_two_checks(puppet, alice):
    _, bridge = puppet
    start = step(RUN_START, alice, scope={"nodes": ["web1"]})
    start.start()
    lease = bridge.accept(str(the_run().id))
    bridge.put_state(str(the_run().id), {"status": "complete", "outcome": "finished"}, lease)
    done = start.check()
    assert done.success and "was taken by a bridge and ended: finished." in done.message


def test_cancelling_a_waiting_run_start_cancels_its_run(puppet, alice):
    start = step(RUN_START, alice, scope={"nodes": ["web1"]})
    start.start()
    start.cancel()
    run = the_run()
    assert (run.status, run.outcome) == ("complete", "cancelled")
    assert RunTransition.objects.get(run=run).token_prefix == f"workflow:{start.run_id}"


def test_a_run_gone_with_its_connection_fails_the_waiting_step(puppet, alice):
    connection, _ = puppet
    start = step(RUN_START, alice, scope={"nodes": ["web1"]})
    start.start()
    state = start.state
    connection.delete()
    start.spec = {"connection": {"relayAPIURL": "x", "token": "gone"}, "scope": {"nodes": ["web1"]}}
    assert start.state == state
    done = start.check()
    assert not done.success and "its puppet connection was deleted" in done.message


# task-run-start and plan-run-start


def test_task_run_start_takes_the_published_spec_schema(puppet, alice):
    """relay-puppet's task-run-start spec.schema.json: connection, scope and name required;
    environment, params, noop and targets (Bolt target objects) optional."""
    targets = [{"name": "db1", "uri": "ssh://db1.example.com", "config": {"ssh": {"user": "deploy"}}}]
    full = step(
        TASK_RUN_START,
        alice,
        environment="production",
        scope={"query": "inventory[certname] { facts.os.family = 'RedHat' }"},
        name="package",
        params={"name": "nginx", "action": "status"},
        noop=True,
        targets=targets,
    )
    assert isinstance(full.start(), Wait)
    run = Run.objects.get(pk=full.outputs["id"])
    assert (run.type, run.environment, run.scope, run.name, run.params, run.noop, run.targets) == (
        "task-run",
        "production",
        {"query": "inventory[certname] { facts.os.family = 'RedHat' }"},
        "package",
        {"name": "nginx", "action": "status"},
        True,
        targets,
    )
    least = step(TASK_RUN_START, alice, scope={"nodes": ["web1"]}, name="package")
    assert isinstance(least.start(), Wait)
    run = Run.objects.get(pk=least.outputs["id"])
    assert (run.scope, run.params, run.noop, run.targets, run.environment) == (
        {"nodes": ["web1"]},
        {},
        False,
        [],
        "",
    )
    assert isinstance(step(TASK_RUN_START, alice, scope={"node_group": "ab12"}, name="x").start(), Wait)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "package"}, "spec.scope: give the task's nodes"),
        ({"name": "package", "targets": [{"name": "a"}]}, "spec.scope: give the task's nodes"),
        ({"scope": {"application": "App[x]"}, "name": "x"}, "spec.scope: A task run's scope is one of"),
        ({"scope": {"nodes": ["a"]}, "name": "x", "targets": ["a"]}, "spec.targets: With a scope, targets"),
        (
            {"scope": {"nodes": ["a"]}, "name": "x", "targets": [{"config": {"ssh": {"password": "p"}}}]},
            "spec.targets[0]: `password` is a credential",
        ),
    ],
)
def test_task_run_start_says_what_is_wrong_in_its_spec(puppet, alice, spec, message):
    done = step(TASK_RUN_START, alice, **spec).start()
    assert isinstance(done, Done) and not done.success
    assert message in done.message, done.message
    assert Run.objects.count() == 0


def test_plan_run_start_makes_a_plan_run(puppet, alice):
    _, bridge = puppet
    plan = step(
        PLAN_RUN_START, alice, name="deploy::app", params={"version": "1.2"}, environment="production"
    )
    assert isinstance(plan.start(), Wait)
    run = the_run()
    assert (run.type, run.name, run.params, run.environment, run.targets) == (
        "plan-run",
        "deploy::app",
        {"version": "1.2"},
        "production",
        None,
    )
    lease = bridge.accept(str(run.id))
    bridge.put_state(
        str(run.id), {"status": "in-progress", "job_id": "7", "next_update_before": soon()}, lease
    )
    assert plan.check().success and plan.outputs == {"id": str(run.id), "jobID": "7"}
    assert (
        "spec.targets: relaysh/puppet-step-plan-run-start takes no such field"
        in step(PLAN_RUN_START, alice, name="deploy", targets=["a"]).start().message
    )


# run-wait


def started_run(bridge: RelayClient, nodes=("web1",), interval: float = 45) -> tuple[str, str]:
    run_id = bridge.create_run({"scope": {"nodes": list(nodes)}})["id"]
    lease = bridge.accept(run_id)
    bridge.put_state(
        run_id, {"status": "in-progress", "job_id": "81", "next_update_before": soon(interval)}, lease
    )
    return run_id, lease


def test_run_wait_outputs_the_job_the_outcome_and_the_results(puppet, alice):
    _, bridge = puppet
    run_id, lease = started_run(bridge)
    wait = step(RUN_WAIT, alice, id=run_id)
    first = wait.start()
    assert isinstance(first, Wait) and first.wake_on == ("puppet-run", run_id) and first.outputs == {}
    results = {"nodes": [{"name": "web1", "state": "finished", "exit_code": 2}]}
    bridge.put_state(run_id, {"status": "complete", "outcome": "finished", "run_results": results}, lease)
    done = wait.check()
    assert done.success and wait.outputs == {"jobID": "81", "outcome": "finished", "results": results}


def test_run_wait_succeeds_with_a_failed_outcome_as_the_published_step(puppet, alice):
    _, bridge = puppet
    run_id, lease = started_run(bridge)
    bridge.put_state(run_id, {"status": "complete", "outcome": "failed"}, lease)
    done = step(RUN_WAIT, alice, id=run_id).start()
    assert done.success and done.outputs == {"jobID": "81", "outcome": "failed"}


def test_run_wait_fails_a_run_the_service_expired(puppet, alice, settings):
    _, bridge = puppet
    run_id = bridge.create_run({"scope": {"nodes": ["web1"]}})["id"]
    wait = step(RUN_WAIT, alice, id=run_id)
    assert isinstance(wait.start(), Wait)
    expire_runs(datetime.now(UTC) + timedelta(seconds=settings.RUN_PENDING_TIMEOUT + 1))
    done = wait.check()
    assert not done.success and done.outputs["outcome"] == "timed-out"
    assert "No bridge accepted the run" in done.message


def test_run_wait_gives_up_after_the_missed_heartbeats_and_cancels_the_run(puppet, alice):
    _, bridge = puppet
    run_id, _ = started_run(bridge, interval=1.0)
    run = Run.objects.get(pk=run_id)
    deadline = run.updated_at + 2 * (run.next_update_before - run.updated_at)
    wait = step(RUN_WAIT, alice, id=run_id, timeoutAfterMissedHeartbeats=2)
    first = wait.start()
    # No worker held, and looked at again just after the moment it would give up.
    assert isinstance(first, Wait) and deadline < first.recheck_at <= deadline + timedelta(seconds=1)
    done = wait.until_done(timeout=10)
    assert datetime.now(UTC) > deadline
    assert not done.success and done.outputs == {"jobID": "81", "outcome": "timed-out"}
    assert "The bridge missed 2 heartbeats" in done.message
    assert Run.objects.get(pk=run_id).cancel_requested is True


def test_heartbeats_keep_run_wait_waiting(puppet, alice):
    _, bridge = puppet
    run_id, lease = started_run(bridge, interval=1.0)
    wait = step(RUN_WAIT, alice, id=run_id, timeoutAfterMissedHeartbeats=1)
    wait.start()
    for _ in range(5):  # 2.5 s, well past one interval after the first update
        time.sleep(0.5)
        bridge.put_state(run_id, {"status": "in-progress", "next_update_before": soon(1.0)}, lease)
        assert isinstance(wait.check(), Wait)
    bridge.put_state(run_id, {"status": "complete", "outcome": "finished"}, lease)
    assert wait.check().success


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"id": "not-a-uuid"}, "spec.id: give the id of a Puppet run"),
        ({}, "spec.id: give the id of a Puppet run"),
        ({"id": "8e659097-254a-4b27-bb93-88efea9a9f0e"}, "spec.id: the puppet connection has no run"),
        ({"id": "8e659097-254a-4b27-bb93-88efea9a9f0e", "timeoutAfterMissedHeartbeats": 0}, "a whole number"),
        (
            {"id": "8e659097-254a-4b27-bb93-88efea9a9f0e", "timeoutAfterMissedHeartbeats": True},
            "a whole number",
        ),
        (
            {"id": "8e659097-254a-4b27-bb93-88efea9a9f0e", "timeoutAfterMissedHeartbeats": "3"},
            "a whole number",
        ),
    ],
)
def test_run_wait_refuses_a_bad_spec(puppet, alice, spec, message):
    done = step(RUN_WAIT, alice, **spec).start()
    assert not done.success and message in done.message


def test_run_wait_sees_only_its_connection_s_runs(puppet, alice, live_server):
    _, token = PuppetConnection.create_with_token(owner=alice, name="other")
    theirs = RelayClient(live_server.url, str(token), attempts=1).create_run({"scope": {"nodes": ["a"]}})
    done = step(RUN_WAIT, alice, id=theirs["id"]).start()
    assert not done.success and "has no run" in done.message


def test_cancelling_a_waiting_run_wait_asks_the_bridge_to_stop(puppet, alice):
    _, bridge = puppet
    run_id, lease = started_run(bridge)
    wait = step(RUN_WAIT, alice, id=run_id)
    wait.start()
    wait.cancel()
    assert Run.objects.get(pk=run_id).cancel_requested is True
    assert bridge.put_state(run_id, {"status": "in-progress", "next_update_before": soon()}, lease)[
        "cancel_requested"
    ]


# run: the RFC's one step


def test_run_takes_the_rfc_spec_and_follows_the_run_to_its_outcome(puppet, alice):
    _, bridge = puppet
    run_step = step(
        RUN,
        alice,
        timeoutAfterMissedHeartbeats=3,
        environment="staging",
        scope={"nodes": ["web1"]},
        noOp=True,
        debug=False,
        trace=True,
        evalTrace=True,
    )
    first = run_step.start()
    run = the_run()
    assert isinstance(first, Wait) and first.outputs == {"id": str(run.id)}
    assert (run.environment, run.noop, run.trace, run.evaltrace, run.debug) == (
        "staging",
        True,
        True,
        True,
        False,
    )
    lease = bridge.accept(str(run.id))
    bridge.put_state(
        str(run.id), {"status": "in-progress", "job_id": "81", "next_update_before": soon()}, lease
    )
    assert isinstance(run_step.check(), Wait)
    bridge.put_state(str(run.id), {"status": "complete", "outcome": "finished"}, lease)
    done = run_step.check()
    assert done.success and run_step.outputs == {"id": str(run.id), "jobID": "81", "outcome": "finished"}


@pytest.mark.parametrize(
    ("outcome", "success"), [("finished", True), ("success", True), ("failed", False), ("error", False)]
)
def test_run_succeeds_only_for_finished_or_success(puppet, alice, outcome, success):
    _, bridge = puppet
    run_step = step(RUN, alice, scope={"nodes": ["web1"]}, noop=True)
    run_step.start()
    lease = bridge.accept(str(the_run().id))
    bridge.put_state(str(the_run().id), {"status": "complete", "outcome": outcome}, lease)
    done = run_step.check()
    assert done.success is success and done.outputs["outcome"] == outcome and done.outputs["jobID"] == ""


def test_run_gives_up_after_the_missed_heartbeats(puppet, alice):
    _, bridge = puppet
    run_step = step(RUN, alice, scope={"nodes": ["web1"]}, timeoutAfterMissedHeartbeats=1)

    def bridge_starts_then_goes_silent():
        run = the_run()
        if run.status == "pending":
            lease = bridge.accept(str(run.id))
            bridge.put_state(str(run.id), {"status": "in-progress", "next_update_before": soon(1.0)}, lease)

    done = run_step.until_done(timeout=10, between=bridge_starts_then_goes_silent)
    assert not done.success and done.outputs["outcome"] == "timed-out"
    assert "missed 1 heartbeats" in done.message and the_run().cancel_requested


def test_run_refuses_both_spellings_of_one_flag(puppet, alice):
    done = step(RUN, alice, scope={"nodes": ["a"]}, noOp=True, noop=False).start()
    assert "spec.noOp: give noOp or noop, not both." in done.message
    assert not Run.objects.exists()
