"""Rollouts (issue 21 §5) through the runs API: a run with a `rollout` section is worked by
the service in batches, each an ordinary run a bridge works over `/_puppet/runs` (played
here with the bridge's own client on a live server). The rollout is moved on in process
(runs.rollouts.advance, what the Celery task calls; tests/test_rollouts_workers.py has the
workers and real bridges)."""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from relay_bridge.api import RelayClient

from puppet_connection.models import PuppetConnection
from runs import rollouts
from runs.models import Rollout, RolloutBatch, Run, expire_runs
from tests.conftest import bridge, run_concurrently
from tests.runs_helpers import RUNS, accept, create_run, put_state, soon
from tests.step_helpers import Connection, Step
from tests.test_connection_api import assert_problem
from tests.workflow_helpers import run_of, steps_of
from workflows import engine
from workflows.steps.base import Done, Wait

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [f"web{i:02}.example.com" for i in range(1, 11)]


@pytest.fixture
def token(connection) -> str:
    return connection[1]


def rollout_of(token: str, rollout: dict[str, Any], nodes: list[str] = NODES, **more: Any) -> dict:
    return create_run(
        token, {"environment": "production", "scope": {"nodes": nodes}, "rollout": rollout, **more}
    )


def pending(token: str) -> list[dict]:
    return bridge(token).get(RUNS).json()["runs"]


def work(token: str, failing: set[str] = frozenset(), outcome: str | None = None) -> list[str]:
    """Play the bridge on the one pending run: accept, start, complete with a node item per
    node (`failed` for those in `failing`). Returns the run's nodes."""
    [run] = pending(token)
    assert accept(token, run["id"]).status_code == 202
    assert (
        put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()}).status_code
        == 202
    )
    nodes = run["scope"]["nodes"]
    items = [{"name": n, "state": "failed" if n in failing else "finished"} for n in nodes]
    final = outcome or ("failed" if failing & set(nodes) else "finished")
    done = put_state(
        token, run["id"], {"status": "complete", "outcome": final, "run_results": {"nodes": items}}
    )
    assert done.status_code == 202, done.content
    return nodes


def roll(run_id: str, now=None) -> str:
    return rollouts.advance(run_id, now)


def test_a_rollout_is_a_run_in_progress_whose_batches_are_ordinary_runs(token):
    made = rollout_of(token, {"canary": 1, "batch": "30%", "max_failures": 0})
    assert made["state"]["status"] == "in-progress" and "next_update_before" not in made["state"]
    assert made["rollout"] == {
        "state": "running",
        "batch": 1,
        "batches": 4,  # the canary, then 3 at a time (30% of 10): 1 + 3 + 3 + 3
        "canary": 1,
        "batch_size": 3,
        "nodes": 10,
        "nodes_done": 0,
        "nodes_failed": 0,
        "max_failures": 0,
        "batch_run": made["rollout"]["batch_run"],
    }
    # The bridge is offered the canary's run only, an ordinary run; never the rollout's own.
    [canary] = pending(token)
    assert canary["id"] == made["rollout"]["batch_run"] != made["id"]
    assert canary["scope"] == {"nodes": ["web01.example.com"]} and canary["environment"] == "production"
    assert "rollout" not in canary
    for status in ("accepted", "in-progress"):
        assert bridge(token).get(RUNS, {"status": status}).json()["runs"] == []
    # Nor can a bridge take it or report its state.
    assert_problem(accept(token, made["id"]), 409)
    refused = put_state(token, made["id"], {"status": "in-progress", "next_update_before": soon()})
    assert "rollout" in assert_problem(refused, 409)["detail"]
    assert bridge(token).get(f"{RUNS}/{made['id']}").json()["rollout"]["batch"] == 1


def test_percentage_batches_run_in_turn_and_the_run_completes_with_the_report(token):
    made = rollout_of(token, {"canary": 1, "batch": "30%"})
    ran = []
    for k in range(4):
        ran.append(work(token))
        assert roll(made["id"]) == ("running" if k < 3 else "complete")
        assert pending(token) == [] if k == 3 else len(pending(token)) == 1
    assert ran == [NODES[:1], NODES[1:4], NODES[4:7], NODES[7:]]
    run = bridge(token).get(f"{RUNS}/{made['id']}").json()
    assert run["state"]["status"] == "complete" and run["state"]["outcome"] == "finished"
    report = run["state"]["run_results"]
    assert report["stopped"] == "" and report["nodes"] == dict.fromkeys(NODES, "finished")
    assert [(b["batch"], b["canary"], b["outcome"], len(b["nodes"])) for b in report["batches"]] == [
        (1, True, "finished", 1),
        (2, False, "finished", 3),
        (3, False, "finished", 3),
        (4, False, "finished", 3),
    ]
    assert run["rollout"]["state"] == "complete" and run["rollout"]["nodes_done"] == 10


@pytest.mark.parametrize(
    ("batch", "sizes"),
    [(4, [4, 4, 2]), ("25%", [2, 2, 2, 2, 2]), ("5%", [1] * 10), ("100%", [10])],
)
def test_batch_sizes_without_a_canary(token, batch, sizes):
    # A percentage of the scope's nodes, rounded down as Ansible's `serial`, at least 1.
    made = rollout_of(token, {"batch": batch})
    seen = []
    while True:
        seen.append(len(work(token)))
        if roll(made["id"]) == "complete":
            break
    assert seen == sizes


def test_a_failed_canary_stops_the_rollout_whatever_the_budget(token):
    made = rollout_of(token, {"canary": 2, "batch": 4, "max_failures": "50%"})
    work(token, failing={"web02.example.com"})
    assert roll(made["id"]) == "complete"
    assert pending(token) == [] and Run.objects.count() == 2  # the rollout's and the canary's
    state = bridge(token).get(f"{RUNS}/{made['id']}").json()["state"]
    assert state["outcome"] == "failed"
    report = state["run_results"]
    assert report["stopped"].startswith("The canary failed on web02.example.com (run ")
    assert (
        report["nodes"]["web01.example.com"] == "finished"
        and report["nodes"]["web02.example.com"] == "failed"
    )
    assert [report["nodes"][n] for n in NODES[2:]] == ["not-run"] * 8
    assert report["batches"] == [
        {
            "batch": 1,
            "canary": True,
            "run": report["batches"][0]["run"],
            "nodes": NODES[:2],
            "outcome": "failed",
            "failed": ["web02.example.com"],
        }
    ]


def test_it_stops_before_the_next_batch_once_failures_exceed_the_budget(token):
    made = rollout_of(token, {"batch": 2, "max_failures": 1})
    work(token, failing={"web01.example.com"})  # 1 failure: within the budget
    assert roll(made["id"]) == "running"
    work(token, failing={"web04.example.com"})  # 2: over it
    assert roll(made["id"]) == "complete"
    assert pending(token) == []
    report = Run.objects.get(pk=made["id"]).run_results
    assert report["stopped"] == (
        "2 nodes failed in all, over the budget of 1: batch 2 failed on web04.example.com"
        f" (run {report['batches'][1]['run']}: failed)."
    )
    assert [b["outcome"] for b in report["batches"]] == ["failed", "failed"]
    assert list(report["nodes"].values()).count("not-run") == 6


def test_a_budget_in_percent_and_failures_within_it_run_every_batch(token):
    made = rollout_of(token, {"batch": 5, "max_failures": "10%"})  # 1 of 10
    work(token, failing={"web03.example.com"})
    assert roll(made["id"]) == "running"
    work(token)
    assert roll(made["id"]) == "complete"
    run = Run.objects.get(pk=made["id"])
    # Every batch ran, yet not every node finished: the run's outcome is `failed`, as a
    # bridge's is when a node failed; `stopped` says it did not stop early.
    assert run.outcome == "failed" and run.run_results["stopped"] == ""
    assert run.run_results["nodes_failed"] == 1 and run.run_results["max_failures"] == 1


def test_a_batch_run_without_node_items_gives_its_nodes_the_run_s_outcome(token):
    made = rollout_of(token, {"batch": 5, "max_failures": 5})
    [run] = pending(token)
    assert accept(token, run["id"]).status_code == 202
    error = {"status": "complete", "outcome": "error", "run_results": {"result": {"msg": "ssh: no route"}}}
    assert put_state(token, run["id"], error).status_code == 202
    assert roll(made["id"]) == "running"
    work(token)
    assert roll(made["id"]) == "complete"
    report = Run.objects.get(pk=made["id"]).run_results
    assert [report["nodes"][n] for n in NODES] == ["error"] * 5 + ["finished"] * 5


def test_a_batch_whose_bridge_goes_silent_times_out_and_stops_the_rollout(token):
    made = rollout_of(token, {"batch": 5})
    [run] = pending(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon(1)})
    assert expire_runs(timezone.now() + timedelta(hours=1)) == 1
    assert roll(made["id"]) == "complete"
    report = Run.objects.get(pk=made["id"]).run_results
    assert "(run " in report["stopped"] and ": timed-out, No heartbeat from the bridge" in report["stopped"]
    assert set(report["nodes"].values()) == {"timed-out", "not-run"}


def test_the_pause_between_batches_is_honoured(token):
    made = rollout_of(token, {"canary": 1, "batch": 9, "pause": "2m"})
    work(token)
    start = timezone.now()
    assert roll(made["id"], start) == "paused"
    progress = bridge(token).get(f"{RUNS}/{made['id']}").json()["rollout"]
    assert progress["state"] == "paused" and progress["batch"] == 1 and progress["nodes_done"] == 1
    assert "next_batch_at" in progress
    assert roll(made["id"], start + timedelta(seconds=119)) == "paused"
    assert pending(token) == []
    assert roll(made["id"], start + timedelta(seconds=121)) == "running"
    assert len(pending(token)) == 1
    assert bridge(token).get(f"{RUNS}/{made['id']}").json()["rollout"]["batch"] == 2


def test_the_sweep_finds_pauses_that_are_over_and_batches_that_ended(token):
    made = rollout_of(token, {"batch": 5, "pause": 60})
    now = timezone.now()
    assert rollouts.sweep(now) == 0  # its batch is out
    work(token)
    assert rollouts.sweep(now) == 1  # ended, not yet recorded (its message lost)
    roll(made["id"], now)
    assert rollouts.sweep(now) == 0  # paused
    assert rollouts.sweep(now + timedelta(seconds=61)) == 1


def test_two_workers_seeing_a_batch_end_start_the_next_batch_once(token):
    made = rollout_of(token, {"batch": 1})  # ten batches, no pause
    for k in range(1, 10):
        work(token)
        states = run_concurrently(8, lambda i: roll(made["id"]))
        assert not [s for s in states if isinstance(s, Exception)], states
        assert RolloutBatch.objects.filter(rollout_id=made["id"]).count() == k + 1
        assert len(pending(token)) == 1
    work(token)
    run_concurrently(8, lambda i: roll(made["id"]))
    assert Run.objects.get(pk=made["id"]).outcome == "finished"
    assert Run.objects.filter(is_rollout=False).count() == 10


def test_cancelling_a_rollout_cancels_its_batch_in_flight_and_starts_no_other(token):
    made = rollout_of(token, {"batch": 5})
    [run] = pending(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()})
    answer = bridge(token).post(f"{RUNS}/{made['id']}/cancel")
    assert answer.status_code == 202
    assert answer.json()["state"]["outcome"] == "cancelled"
    assert answer.json()["rollout"]["stopped"].startswith("Cancelled")
    assert Run.objects.get(pk=run["id"]).cancel_requested
    put_state(token, run["id"], {"status": "complete", "outcome": "cancelled"})
    assert roll(made["id"]) == "complete"
    assert Run.objects.filter(is_rollout=False).count() == 1
    again = bridge(token).post(f"{RUNS}/{made['id']}/cancel")  # as for any run: the same answer
    assert again.status_code == 202 and again.json()["state"]["outcome"] == "cancelled"


BAD = [
    ({"canary": 1}, "/rollout/batch", "This field is required."),
    ({"batch": 0}, "/rollout/batch", "At least 1."),
    ({"batch": "0%"}, "/rollout/batch", "A percentage from 1% to 100%."),
    ({"batch": "150%"}, "/rollout/batch", "A percentage from 1% to 100%."),
    ({"batch": "20"}, "/rollout/batch", "A whole number of nodes"),
    ({"batch": 2.5}, "/rollout/batch", "A whole number of nodes"),
    ({"batch": True}, "/rollout/batch", "A whole number of nodes"),
    ({"batch": 2, "max_failures": -1}, "/rollout/max_failures", "At least 0."),
    ({"batch": 10**6}, "/rollout/batch", "At most 10000 (RUN_MAX_NODES)."),
    ({"batch": 2, "max_failures": "5 %"}, "/rollout/max_failures", "A whole number of nodes"),
    ({"batch": 2, "canary": -1}, "/rollout/canary", "A whole number of nodes"),
    ({"batch": 2, "canary": 11}, "/rollout/canary", "More than the scope's 10 nodes."),
    ({"batch": 2, "pause": "30x"}, "/rollout/pause", "Seconds (30), or a duration"),
    ({"batch": 2, "pause": "2d"}, "/rollout/pause", "Seconds (30), or a duration"),
    ({"batch": 2, "pause": 86401}, "/rollout/pause", "From 0 to 86400 seconds."),
    ({"batch": 2, "pause": "25h"}, "/rollout/pause", "From 0 to 86400 seconds."),
    ({"batch": 2, "serial": 3}, "/rollout/serial", "Unknown field."),
    ([2], "/rollout", "Invalid data."),
]


@pytest.mark.parametrize(("rollout", "pointer", "detail"), BAD)
def test_a_bad_rollout_is_a_400_that_points_at_it(token, rollout, pointer, detail):
    response = bridge(token).post(
        RUNS, {"environment": "production", "scope": {"nodes": NODES}, "rollout": rollout}, format="json"
    )
    body = assert_problem(response, 400)
    assert [(e["pointer"], e["detail"][: len(detail)]) for e in body["errors"]] == [(f"#{pointer}", detail)]
    assert Run.objects.count() == 0


def test_a_rollout_of_a_query_scope_starts_from_the_nodes_the_bridge_resolved_it_to(connection):
    conn, token = connection
    PuppetConnection.objects.filter(pk=conn.pk).update(platform="oss", backend="ssh", puppetdb=True)
    body = {"scope": {"query": 'inventory[certname] { facts.os.family = "Debian" }'}}
    assert create_run(token, body)["scope"] == body["scope"]  # without a rollout: the bridge resolves it
    # Before the bridge has resolved it: refused, saying the bridge has been asked.
    response = bridge(token).post(RUNS, {**body, "rollout": {"batch": 2}}, format="json")
    [error] = assert_problem(response, 400)["errors"]
    assert error["pointer"] == "#/scope" and "it has been asked" in error["detail"]
    assert Run.objects.count() == 1
    # The bridge finds the query among those waiting and answers it (its inventory check).
    [asked] = bridge(token).get("/_puppet/inventory").json()["queries"]
    answers = [{"key": asked["key"], "certnames": ["db-1", "db-2", "db-3"]}]
    taken = bridge(token).post("/_puppet/inventory/queries", {"answers": answers}, format="json")
    assert taken.json() == {"taken": 1}
    started = bridge(token).post(RUNS, {**body, "rollout": {"batch": 2}}, format="json")
    assert started.status_code == 201, started.content
    rollout = Rollout.objects.get(run_id=started.json()["id"])
    assert rollout.nodes == ["db-1", "db-2", "db-3"]
    # PuppetDB refusing the query: the reason, not a wait.
    other = {"scope": {"query": "nodes[certname] { bad"}}
    bridge(token).post(RUNS, {**other, "rollout": {"batch": 2}}, format="json")
    [asked] = bridge(token).get("/_puppet/inventory").json()["queries"]
    failed = [{"key": asked["key"], "error": "PQL parse error at line 1"}]
    bridge(token).post("/_puppet/inventory/queries", {"answers": failed}, format="json")
    refused = bridge(token).post(RUNS, {**other, "rollout": {"batch": 2}}, format="json")
    [error] = assert_problem(refused, 400)["errors"]
    assert "PQL parse error at line 1" in error["detail"]


def test_a_rollout_of_a_query_that_matches_no_node_is_a_400_not_a_run_of_no_nodes(connection):
    conn, token = connection
    PuppetConnection.objects.filter(pk=conn.pk).update(platform="oss", backend="ssh", puppetdb=True)
    body = {"scope": {"query": 'inventory[certname] { facts.os.family = "Plan9" }'}, "rollout": {"batch": 2}}
    bridge(token).post(RUNS, body, format="json")
    [asked] = bridge(token).get("/_puppet/inventory").json()["queries"]
    answers = [{"key": asked["key"], "certnames": []}]
    assert bridge(token).post("/_puppet/inventory/queries", {"answers": answers}, format="json").json() == {
        "taken": 1
    }
    response = bridge(token).post(RUNS, body, format="json")
    [error] = assert_problem(response, 400)["errors"]
    assert error["pointer"] == "#/scope" and "matches no node" in error["detail"]
    assert Run.objects.count() == 0  # no batch with an empty node list for a bridge


def test_only_runs_with_a_node_list_take_a_rollout(connection):
    conn, token = connection
    PuppetConnection.objects.filter(pk=conn.pk).update(platform="pe", backend="orchestrator")
    group = bridge(token).post(
        RUNS,
        {"environment": "production", "scope": {"node_group": "web"}, "rollout": {"batch": 2}},
        format="json",
    )
    [error] = assert_problem(group, 400)["errors"]
    assert error["pointer"] == "#/scope" and "node_group" in error["detail"]
    task = bridge(token).post(
        RUNS,
        {"type": "task-run", "name": "package", "scope": {"nodes": NODES}, "rollout": {"batch": 2}},
        format="json",
    )
    [error] = assert_problem(task, 400)["errors"]
    assert error["pointer"] == "#/rollout" and "Only runs" in error["detail"]


def test_a_large_batch_s_stored_results_give_its_nodes_outcomes(token, settings):
    settings.RUN_RESULTS_MAX_BYTES = 2000
    nodes = [f"node-{i:04}.example.com" for i in range(200)]
    made = rollout_of(token, {"batch": "50%"}, nodes=nodes)
    [run] = pending(token)
    accept(token, run["id"])
    items = [{"name": n, "state": "finished", "output": "x" * 50} for n in nodes[:100]]
    items[7]["state"] = "failed"
    put_state(token, run["id"], {"status": "complete", "outcome": "failed", "run_results": {"nodes": items}})
    assert Run.objects.get(pk=run["id"]).results_sha256  # stored, a summary in the row
    assert roll(made["id"]) == "complete"
    report = Rollout.objects.get(pk=made["id"]).report()
    assert report["batches"][0]["failed"] == ["node-0007.example.com"]
    # The rollout's own report is large too: stored the same way, readable whole.
    whole = json.loads(b"".join(bridge(token).get(f"{RUNS}/{made['id']}/results").streaming_content))
    assert whole["nodes"]["node-0007.example.com"] == "failed" and len(whole["nodes"]) == 200


def test_the_bridge_s_client_sees_a_rollout_as_a_run(live_server, connection):
    _, token = connection
    client = RelayClient(live_server.url, token, attempts=1)
    try:
        made = client.create_run({"scope": {"nodes": NODES[:2]}, "rollout": {"batch": 1}})
        assert client.get_run(made["id"])["state"]["status"] == "in-progress"
        assert [run["scope"]["nodes"] for run in client.list_runs(status="pending")] == [NODES[:1]]
    finally:
        client.close()


# The native puppet-run step, driven as the engine drives it (tests/step_helpers.py).

PUPPET_RUN = "relaysh/puppet-step-run"


def puppet_run(alice, **spec: Any) -> Step:
    return Step(
        PUPPET_RUN,
        {"connection": Connection("puppet", "prod"), "scope": {"nodes": NODES[:4]}, **spec},
        alice.pk,
    )


@pytest.fixture
def prod(alice) -> str:
    return str(PuppetConnection.create_with_token(owner=alice, name="prod")[1])


def test_the_puppet_run_step_rolls_out_and_says_which_batches_ran_and_why_it_stopped(prod, alice):
    step = puppet_run(
        alice, rollout={"canary": 1, "batch": 2.0, "max_failures": 0}
    )  # 2.0: a number from an expression
    first = step.start()
    assert isinstance(first, Wait) and first.wake_on == ("puppet-run", first.outputs["id"])
    assert first.outputs["rollout"]["batch"] == 1 and first.outputs["rollout"]["batches"] == 3
    work(prod)
    step_id = first.outputs["id"]
    assert roll(step_id) == "running"
    assert step.check().outputs["rollout"]["batch"] == 2
    work(prod, failing={NODES[2]})
    assert roll(step_id) == "complete"
    done = step.check()
    assert isinstance(done, Done) and not done.success
    assert done.outputs["outcome"] == "failed" and done.outputs["id"] == step_id
    assert [(b["batch"], b["outcome"], b.get("failed")) for b in done.outputs["batches"]] == [
        (1, "finished", []),
        (2, "failed", [NODES[2]]),
    ]
    assert done.outputs["nodes"] == {
        NODES[0]: "finished",
        NODES[1]: "finished",
        NODES[2]: "failed",
        NODES[3]: "not-run",
    }
    assert done.outputs["stopped"].startswith(
        f"1 nodes failed in all, over the budget of 0: batch 2 failed on {NODES[2]}"
    )
    assert done.message == done.outputs["stopped"]
    assert done.outputs["rollout"]["state"] == "complete" and done.outputs["rollout"]["nodes_done"] == 3


def test_the_puppet_run_step_succeeds_when_every_node_finished(prod, alice):
    step = puppet_run(alice, rollout={"batch": "50%", "pause": 0})
    step_id = step.start().outputs["id"]
    for _ in range(2):
        work(prod)
        roll(step_id)
    done = step.check()
    assert (
        done.success and done.outputs["stopped"] == "" and set(done.outputs["nodes"].values()) == {"finished"}
    )
    assert done.message == f"Rollout {step_id}: 2 batches ran, 0 of 4 nodes failed (at most 0 allowed)."


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        (
            {"batch": "20"},
            'spec.rollout.batch: A whole number of nodes, or a percentage of them as a string ("20%").',
        ),
        (
            {"batch": 1, "pause": "soon"},
            'spec.rollout.pause: Seconds (30), or a duration with its unit: "30s", "5m", "1h".',
        ),
        ({"batch": 1, "canary": 5}, "spec.rollout.canary: More than the scope's 4 nodes."),
        ({"batch": 1, "serial": 1}, "spec.rollout.serial: Unknown field."),
        ("20%", "spec.rollout: Invalid data. Expected a dictionary, but got str."),
    ],
)
def test_a_bad_rollout_fails_the_step_with_its_place_in_the_spec(prod, alice, rollout, message):
    done = puppet_run(alice, rollout=rollout).start()
    assert isinstance(done, Done) and not done.success and done.message == message
    assert not Run.objects.exists()


def test_the_step_waits_for_the_bridge_to_resolve_a_query_then_rolls_out(prod, alice):
    # The API says "ask again later"; a step cannot be started again, so it waits (bounded).
    PuppetConnection.objects.filter(name="prod").update(platform="oss", backend="ssh", puppetdb=True)
    query = 'inventory[certname] { facts.os.family = "Debian" }'
    step = puppet_run(alice, scope={"query": query}, rollout={"batch": 2})
    first = step.start()
    assert isinstance(first, Wait) and not Run.objects.exists()
    step.cancel()  # while it waits there is no run to cancel: nothing fails
    assert isinstance(step.check(), Wait)
    [asked] = bridge(prod).get("/_puppet/inventory").json()["queries"]
    answers = [{"key": asked["key"], "certnames": ["db-1", "db-2", "db-3"]}]
    bridge(prod).post("/_puppet/inventory/queries", {"answers": answers}, format="json")
    rolling = step.check()
    assert isinstance(rolling, Wait) and rolling.outputs["rollout"]["batches"] == 2
    assert Rollout.objects.get(run_id=rolling.outputs["id"]).nodes == ["db-1", "db-2", "db-3"]


def test_the_step_gives_up_on_a_query_the_bridge_never_resolves(prod, alice):
    PuppetConnection.objects.filter(name="prod").update(platform="oss", backend="ssh", puppetdb=True)
    step = puppet_run(alice, scope={"query": "nodes[certname] {}"}, rollout={"batch": 2})
    assert isinstance(step.start(), Wait)
    step.started_at -= timedelta(hours=1)
    done = step.check()
    assert isinstance(done, Done) and not done.success
    assert done.message.startswith("spec.scope: The connection's bridge did not resolve the query")
    assert not Run.objects.exists()


def test_cancelling_the_step_cancels_the_rollout(prod, alice):
    step = puppet_run(alice, rollout={"batch": 2})
    step_id = step.start().outputs["id"]
    step.cancel()
    run = Run.objects.get(pk=step_id)
    assert run.outcome == "cancelled" and run.rollout.stop_reason.startswith("Cancelled (workflow:")
    assert Run.objects.get(rollout_batch__rollout_id=step_id).outcome == "cancelled"  # it was pending


ROLLOUT_STEP = """
apiVersion: v1
steps:
- name: deploy
  image: relaysh/puppet-step-run
  spec:
    connection: !Connection {type: puppet, name: prod}
    scope: {nodes: [web1, web2, web3]}
    rollout: {canary: 1, batch: 1}
"""


def test_the_run_page_shows_a_rollout_s_progress(prod, alice):
    run = run_of(alice, ROLLOUT_STEP)
    engine.start_run(run.pk)
    engine.start_step(str(steps_of(run)["deploy"].pk), inline=True)
    client = Client()
    client.force_login(alice)
    live = client.get(f"/app/runs/{run.pk}/live/").content.decode()
    assert "Rollout: batch 1 of 3 (running), 0 of 3 nodes done, 0 failed" in live
