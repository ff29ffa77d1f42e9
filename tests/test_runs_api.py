import hashlib
import json
import uuid

import pytest

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition
from tests.conftest import bridge
from tests.runs_helpers import RUNS, accept, create_run, put_state, soon
from tests.test_connection_api import assert_problem


@pytest.fixture
def token(connection) -> str:
    return connection[1]


def test_create_answers_201_with_the_whole_run(token):
    body = {
        "environment": "staging",
        "scope": {"nodes": ["node-a.example.com", "node-b.example.com"]},
        "noop": True,
        "debug": True,
        "trace": False,
        "evaltrace": True,
    }
    run = create_run(token, body)
    uuid.UUID(run["id"])
    assert run["type"] == "run"
    assert run["state"]["status"] == "pending" and run["state"]["updated_at"].endswith("Z")
    assert set(run["state"]) == {"status", "updated_at"}
    assert {k: run[k] for k in body} == body
    assert run["no_noop"] is False
    assert bridge(token).get(f"{RUNS}/{run['id']}").json() == run


def test_task_and_plan_runs_carry_their_fields(token):
    task = create_run(
        token,
        {
            "type": "task-run",
            "name": "package::install",
            "params": {"name": "vim"},
            "targets": ["web1.example.com"],
            "environment": "production",
        },
    )
    # Certnames as targets (this service's shape before scopes) become the published shape.
    assert (task["name"], task["params"], task["scope"], task["targets"]) == (
        "package::install",
        {"name": "vim"},
        {"nodes": ["web1.example.com"]},
        [],
    )
    plan = create_run(token, {"type": "plan-run", "name": "deploy::app", "environment": "production"})
    assert (plan["name"], plan["params"]) == ("deploy::app", {})
    assert "targets" not in plan and "scope" not in plan


def test_the_list_offers_the_runs_nobody_holds_oldest_first_and_filters_by_status(token):
    first, second, third, fourth = (create_run(token) for _ in range(4))
    assert accept(token, second["id"]).status_code == 202
    assert put_state(token, third["id"], {"status": "complete"}).status_code == 409  # not accepted
    accept(token, third["id"])
    put_state(token, third["id"], {"status": "complete", "outcome": "failed"})
    accept(token, fourth["id"])
    put_state(token, fourth["id"], {"status": "in-progress", "next_update_before": soon()})

    # Without `status`, only what a bridge may still accept: the shipped agent starts a job
    # for every run listed `pending`, and an accepted run still shows `pending` (contract §1).
    # (Before issue 18 the accepted and in-progress runs were listed too.)
    listed = bridge(token).get(RUNS).json()
    assert [r["id"] for r in listed["runs"]] == [first["id"]]
    assert set(listed) == {"runs"}  # no next page
    assert (
        listed["runs"][0]["state"]["status"] == "pending" and "accepted_at" not in listed["runs"][0]["state"]
    )
    pending = bridge(token).get(RUNS, {"status": "pending"}).json()["runs"]
    assert [r["id"] for r in pending] == [first["id"]]
    # Held runs, to whoever asks for them by their recorded status. The accepted run shows
    # the RFC's `pending`, and when it was accepted.
    held = bridge(token).get(RUNS, {"status": "accepted"}).json()["runs"]
    assert [r["id"] for r in held] == [second["id"]]
    assert held[0]["state"]["status"] == "pending" and held[0]["state"]["accepted_at"]
    working = bridge(token).get(RUNS, {"status": "in-progress"}).json()["runs"]
    assert [(r["id"], r["state"]["status"]) for r in working] == [(fourth["id"], "in-progress")]
    # Paged, the same rule.
    assert [r["id"] for r in bridge(token).get(RUNS, {"limit": "10"}).json()["runs"]] == [first["id"]]
    assert_problem(bridge(token).get(RUNS, {"status": "complete"}), 400)
    assert_problem(bridge(token).get(RUNS, {"status": "nonsense"}), 400)


def test_cursor_pagination_keeps_the_runs_key(token):
    ids = [create_run(token)["id"] for _ in range(5)]
    seen, url = [], f"{RUNS}?limit=2"
    while url:
        response = bridge(token).get(url)
        page = response.json()
        assert len(page["runs"]) <= 2
        seen += [r["id"] for r in page["runs"]]
        url = page.get("next")
        if url:
            assert response["Link"] == f'<{url}>; rel="next"'
    assert seen == ids


def test_without_a_limit_the_list_holds_every_open_run(token, connection):
    """The shipped bridge ignores `next`: a page size of the service's own would hide the
    runs past it from that bridge for good."""
    conn, _ = connection
    Run.objects.bulk_create(Run(connection=conn, scope={"nodes": [f"n{i}"]}) for i in range(1200))
    listed = bridge(token).get(RUNS)
    assert listed.status_code == 200 and "Link" not in listed
    body = listed.json()
    assert set(body) == {"runs"} and len(body["runs"]) == 1200
    assert len(bridge(token).get(RUNS, {"status": "pending"}).json()["runs"]) == 1200
    page = bridge(token).get(RUNS, {"limit": "100"}).json()
    assert len(page["runs"]) == 100 and page["next"]


def test_a_connection_never_sees_another_connections_runs(token, alice):
    _, other_token = PuppetConnection.create_with_token(owner=alice, name="other")
    run = create_run(token)
    client = bridge(str(other_token))
    assert client.get(RUNS).json()["runs"] == []
    for response in (
        client.get(f"{RUNS}/{run['id']}"),
        client.post(f"{RUNS}/{run['id']}/accept"),
        client.put(f"{RUNS}/{run['id']}/state", {"status": "pending"}, format="json"),
        client.post(f"{RUNS}/{run['id']}/cancel"),
    ):
        assert_problem(response, 404)
    assert Run.objects.get(pk=run["id"]).status == "pending"


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({}, "#/scope"),
        ({"scope": {}}, "#/scope"),
        ({"scope": {"nodes": ["a"], "query": "nodes {}"}}, "#/scope"),
        ({"scope": {"nodes": []}}, "#/scope/nodes"),
        ({"scope": {"nodes": "node-a"}}, "#/scope/nodes"),
        ({"scope": {"nodes": ["Not A Certname!"]}}, "#/scope/nodes/0"),
        ({"scope": {"nodes": [7]}}, "#/scope/nodes/0"),
        ({"scope": {"hosts": ["a"]}}, "#/scope/hosts"),
        ({"scope": ["a"]}, "#/scope"),
        ({"scope": {"nodes": ["a"]}, "environment": "Bad-Env"}, "#/environment"),
        ({"scope": {"nodes": ["a"]}, "environment": "main"}, "#/environment"),
        ({"scope": {"nodes": ["a"]}, "noop": True, "no_noop": True}, "#/no_noop"),
        ({"scope": {"nodes": ["a"]}, "noop": "yes"}, "#/noop"),
        ({"scope": {"nodes": ["a"]}, "noopp": True}, "#/noopp"),
        ({"scope": {"nodes": ["a"]}, "type": "reboot"}, "#/type"),
        ({"type": "task-run", "targets": ["a"]}, "#/name"),
        ({"type": "task-run", "name": "x"}, "#/scope"),
        ({"type": "task-run", "name": "Bad Name", "targets": ["a"]}, "#/name"),
        ({"type": "task-run", "name": "x", "targets": ["a"], "params": [1]}, "#/params"),
        ({"type": "plan-run", "name": "x", "scope": {"nodes": ["a"]}}, "#/scope"),
        ({"type": "plan-run", "name": "x", "targets": ["a"]}, "#/targets"),
        ({"scope": {"nodes": ["a"]}, "name": "x"}, "#/name"),
    ],
)
def test_invalid_runs_are_400_with_field_paths(token, body, pointer):
    problem = assert_problem(bridge(token).post(RUNS, body, format="json"), 400)
    pointers = [e["pointer"] for e in problem["errors"]]
    assert any(p == pointer or p.startswith(pointer) for p in pointers), pointers
    assert Run.objects.count() == 0


def test_the_node_count_is_bounded(token, settings):
    most = [f"n{i}.example.com" for i in range(settings.RUN_MAX_NODES)]
    assert len(create_run(token, {"scope": {"nodes": most}})["scope"]["nodes"]) == settings.RUN_MAX_NODES
    too_many = {"scope": {"nodes": [*most, "one-more.example.com"]}}
    problem = assert_problem(bridge(token).post(RUNS, too_many, format="json"), 400)
    assert problem["errors"][0]["pointer"] == "#/scope/nodes"


def test_bad_bodies_are_4xx_problems(token, settings):
    client = bridge(token)
    assert_problem(client.post(RUNS, "{oops", content_type="application/json"), 400)
    assert_problem(client.post(RUNS, "[]", content_type="application/json"), 400)
    assert_problem(client.post(RUNS, '{"noop": NaN}', content_type="application/json"), 400)
    assert_problem(client.post(RUNS, b"\xff\xfe", content_type="application/json"), 400)
    assert_problem(client.post(RUNS, "scope=x", content_type="text/plain"), 415)
    settings.API_MAX_BODY_BYTES = 100
    assert_problem(client.post(RUNS, {"scope": {"nodes": ["a" * 200]}}, format="json"), 413)
    assert_problem(client.get(f"{RUNS}/not-a-uuid"), 404)
    assert_problem(client.get(f"{RUNS}/{uuid.uuid4()}"), 404)
    assert_problem(client.delete(RUNS), 405)
    assert_problem(bridge("rlyp_bad").get(RUNS), 401)


def test_a_body_over_the_limit_is_413_even_past_django_s_own_cap(token, settings):
    body = json.dumps({"scope": {"nodes": ["a"]}, "x": "y" * (3 * 1024 * 1024)})
    assert len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE > settings.API_MAX_BODY_BYTES
    problem = assert_problem(bridge(token).generic("POST", RUNS, body, content_type="application/json"), 413)
    assert str(settings.API_MAX_BODY_BYTES) in problem["detail"]


def test_pe_needs_an_environment_and_open_source_only_runs_on_nodes(token, connection):
    conn, _ = connection
    pe = bridge(token)
    pe.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_X_RELAY_PLATFORM="pe", HTTP_X_RELAY_BACKEND="orchestrator"
    )
    problem = assert_problem(pe.post(RUNS, {"scope": {"query": "nodes {}"}}, format="json"), 400)
    assert problem["errors"][0]["pointer"] == "#/environment"
    conn.refresh_from_db()
    assert (conn.reported_platform, conn.reported_backend) == ("pe", "orchestrator")
    assert (
        pe.post(
            RUNS, {"scope": {"query": "nodes {}"}, "environment": "production"}, format="json"
        ).status_code
        == 201
    )

    oss = bridge(token)
    oss.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_X_RELAY_PLATFORM="oss", HTTP_X_RELAY_BACKEND="ssh"
    )
    problem = assert_problem(oss.post(RUNS, {"scope": {"node_group": "abc"}}, format="json"), 400)
    assert problem["errors"][0]["pointer"] == "#/scope"
    problem = assert_problem(oss.post(RUNS, {"type": "plan-run", "name": "x"}, format="json"), 400)
    assert problem["errors"][0]["pointer"] == "#/type"
    assert oss.post(RUNS, {"scope": {"nodes": ["a"]}}, format="json").status_code == 201


def test_while_the_platform_is_unknown_any_scope_is_accepted(token):
    assert create_run(token, {"scope": {"application": "App[x]"}})["scope"] == {"application": "App[x]"}


def test_the_state_machine_from_pending_to_complete(token, connection):
    run = create_run(token)
    path = run["id"]
    assert_problem(put_state(token, path, {"status": "in-progress", "next_update_before": soon()}), 409)

    accepted = accept(token, path)
    assert accepted.status_code == 202
    lease = accepted.json()["lease_id"]
    # On the wire, the RFC's three statuses only: accepted shows pending, with accepted_at.
    assert accepted.json()["state"]["status"] == "pending"
    accepted_at = accepted.json()["state"]["accepted_at"]
    assert accepted_at.endswith("Z")
    assert_problem(accept(token, path), 409)
    assert Run.objects.get(pk=path).status == "accepted"  # recorded as accepted

    beat = put_state(token, path, {"status": "pending"})  # the shipped agent's first PUT
    assert beat.status_code == 202 and beat.json()["status"] == "pending"
    assert beat.json()["accepted_at"] == accepted_at
    shown = bridge(token).get(f"{RUNS}/{path}").json()["state"]
    assert (shown["status"], shown["accepted_at"]) == ("pending", accepted_at)

    due = soon(45)
    progress = put_state(
        token,
        path,
        {
            "status": "in-progress",
            "job_id": "81",
            "next_update_before": due,
            "updated_at": "1999-01-01T00:00:00Z",
        },
    )
    assert progress.status_code == 202
    state = progress.json()
    assert state["status"] == "in-progress" and state["job_id"] == "81"
    assert state["accepted_at"] == accepted_at
    assert state["updated_at"] != "1999-01-01T00:00:00Z"  # the server stamps its own
    assert state["next_update_before"].startswith(due[:19])

    later = put_state(token, path, {"status": "in-progress", "next_update_before": soon(50)})
    assert later.status_code == 202 and later.json()["job_id"] == "81"

    results = {"items": [{"name": "node-a.example.com", "state": "finished"}]}
    done = put_state(
        token, path, {"status": "complete", "outcome": "finished", "run_results": results, "lease_id": lease}
    )
    assert done.status_code == 202
    assert done.json()["status"] == "complete" and done.json()["run_results"] == results
    again = put_state(token, path, {"status": "complete", "outcome": "finished", "run_results": results})
    assert again.status_code == 202 and again.json() == done.json()
    assert_problem(put_state(token, path, {"status": "complete", "outcome": "failed"}), 409)
    assert_problem(put_state(token, path, {"status": "in-progress", "next_update_before": soon()}), 409)

    transitions = list(
        RunTransition.objects.filter(run_id=path).values_list("from_status", "to_status", "token_prefix")
    )
    prefix = connection[0].token_prefix
    assert transitions == [
        ("pending", "accepted", prefix),
        ("accepted", "in-progress", prefix),
        ("in-progress", "complete", prefix),
    ]


def test_complete_defaults_to_finished(token):
    run = create_run(token)
    accept(token, run["id"])
    assert put_state(token, run["id"], {"status": "complete"}).json()["outcome"] == "finished"


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ({"status": "in-progress"}, 400),
        ({"status": "in-progress", "next_update_before": "2000-01-01T00:00:00Z"}, 400),
        ({"status": "in-progress", "next_update_before": "not a time"}, 400),
        ({"status": "in-progress", "next_update_before": "2999-01-01T00:00:00Z"}, 400),
        ({"status": "done"}, 400),
        ({"status": "complete", "outcome": "great"}, 400),
        ({"status": "in-progress", "next_update_before": "+45s", "outcome": "failed"}, 400),
        ({"status": "complete", "outcome": "cancelled"}, 409),
        ({"status": "complete", "lease_id": "not-a-uuid"}, 400),
        ({"status": "complete", "lease_id": str(uuid.uuid4())}, 409),
        ({}, 400),
    ],
)
def test_bad_state_puts_are_4xx(token, state, code):
    run = create_run(token)
    accept(token, run["id"])
    assert_problem(put_state(token, run["id"], state), code)
    assert Run.objects.get(pk=run["id"]).status == "accepted"


def test_a_state_put_that_is_not_an_object_is_400(token):
    run = create_run(token)
    accept(token, run["id"])
    assert_problem(bridge(token).put(f"{RUNS}/{run['id']}/state", "[]", content_type="application/json"), 400)


def fleet_results(nodes: int) -> dict:
    """A final state's results as the bridges send them: a node item each, with the tail
    of what Puppet printed (up to 4,000 characters)."""
    return {
        "nodes": [
            {
                "name": f"node-{i}.example.com",
                "state": "failed" if i % 50 == 0 else "finished",
                "exit_code": 4 if i % 50 == 0 else 2,
                "duration": 31.5,
                "output": f"Notice: /Stage[main]/Profile::Web/File[/srv/www/{i}.html]/content: changed\n"
                * 50,
            }
            for i in range(nodes)
        ],
        "job": {"name": "81", "state": "finished"},
    }


def test_run_results_over_the_cap_are_stored_and_the_run_keeps_a_summary(token, alice, settings):
    """A fleet's results over RUN_RESULTS_MAX_BYTES (and a body over API_MAX_BODY_BYTES) still
    complete the run: the full results go to storage, the run keeps a summary and a link."""
    run = create_run(token)
    accept(token, run["id"])
    results = fleet_results(800)
    size = len(json.dumps(results, separators=(",", ":")).encode())
    # Over the cap, over other requests' body limit, and over Django's own (2.5 MiB).
    assert size > settings.RUN_RESULTS_MAX_BYTES and size > settings.API_MAX_BODY_BYTES
    assert size > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    final = {"status": "complete", "outcome": "failed", "job_id": "81", "run_results": results}

    done = put_state(token, run["id"], final)
    assert done.status_code == 202, done.content
    state = done.json()
    assert (state["status"], state["outcome"]) == ("complete", "failed")
    stored = state["run_results_stored"]
    assert stored["size"] == size
    assert stored["url"] == f"{settings.RELAY_PUBLIC_URL}/_puppet/runs/{run['id']}/results"
    summary = state["run_results"]
    assert summary["job"] == {"name": "81", "state": "finished"}  # small values as they are
    assert summary["nodes"] == {
        "omitted": "list",
        "items": 800,
        "bytes": len(json.dumps(results["nodes"], separators=(",", ":")).encode()),
        "states": {"finished": 784, "failed": 16},
    }
    assert len(json.dumps(state)) < 20_000
    assert bridge(token).get(f"{RUNS}/{run['id']}").json()["state"] == state

    full = bridge(token).get(f"{RUNS}/{run['id']}/results")
    assert full.status_code == 200 and full["Content-Type"] == "application/json"
    data = b"".join(full.streaming_content)
    assert json.loads(data) == results and hashlib.sha256(data).hexdigest() == stored["sha256"]

    # The bridge's answer was lost and it sends the same final state again: the same answer.
    again = put_state(token, run["id"], final)
    assert again.status_code == 202 and again.json() == state
    assert_problem(put_state(token, run["id"], {**final, "run_results": fleet_results(801)}), 409)
    # Only the run's own connection reads them.
    _, other = PuppetConnection.create_with_token(owner=alice, name="other")
    assert_problem(bridge(str(other)).get(f"{RUNS}/{run['id']}/results"), 404)


def test_the_summary_of_stored_results_counts_the_nodes_with_changes_pending(token, settings):
    """An approver reading a large fleet's summary still sees how many nodes a real run
    would change, and how many could not say (no report)."""
    settings.RUN_RESULTS_MAX_BYTES = 10_000
    run = create_run(token)
    accept(token, run["id"])
    results = fleet_results(40)
    for i, node in enumerate(results["nodes"]):
        node["changes_pending"] = None if i % 10 == 0 else i % 3 == 0
    done = put_state(token, run["id"], {"status": "complete", "run_results": results}).json()
    assert "run_results_stored" in done
    nodes = done["run_results"]["nodes"]
    assert (nodes["changes_pending"], nodes["changes_unknown"]) == (12, 4)


def test_the_results_endpoint_gives_small_results_too(token):
    run = create_run(token)
    assert_problem(bridge(token).get(f"{RUNS}/{run['id']}/results"), 404)  # none yet
    accept(token, run["id"])
    results = {"nodes": [{"name": "node-a.example.com", "state": "finished"}]}
    done = put_state(token, run["id"], {"status": "complete", "run_results": results}).json()
    assert done["run_results"] == results and "run_results_stored" not in done
    assert bridge(token).get(f"{RUNS}/{run['id']}/results").json() == results


def test_a_state_body_over_its_own_cap_is_413(token, settings):
    settings.RUN_STATE_MAX_BODY_BYTES = 10_000
    run = create_run(token)
    accept(token, run["id"])
    big = {"status": "complete", "run_results": fleet_results(5)}
    assert_problem(put_state(token, run["id"], big), 413)
    assert Run.objects.get(pk=run["id"]).status == "accepted"


def test_lease_fencing(token):
    run = create_run(token)
    mine = str(uuid.uuid4())
    first = accept(token, run["id"], lease_id=mine)
    assert first.status_code == 202 and first.json()["lease_id"] == mine
    # The answer was lost; the same bridge asks again with the same lease: still its run.
    assert accept(token, run["id"], lease_id=mine).status_code == 202
    assert_problem(accept(token, run["id"], lease_id=str(uuid.uuid4())), 409)
    assert_problem(put_state(token, run["id"], {"status": "pending", "lease_id": str(uuid.uuid4())}), 409)
    assert put_state(token, run["id"], {"status": "pending", "lease_id": mine}).status_code == 202
    assert put_state(token, run["id"], {"status": "pending"}).status_code == 202  # old clients: no lease


def test_cancel_a_pending_run_completes_it(token):
    run = create_run(token)
    cancelled = bridge(token).post(f"{RUNS}/{run['id']}/cancel")
    assert cancelled.status_code == 202
    assert (
        cancelled.json()["state"]["status"] == "complete"
        and cancelled.json()["state"]["outcome"] == "cancelled"
    )
    assert bridge(token).post(f"{RUNS}/{run['id']}/cancel").status_code == 202  # idempotent
    assert_problem(accept(token, run["id"]), 409)


def test_cancel_a_held_run_asks_the_bridge_in_every_answer(token):
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()})
    assert bridge(token).post(f"{RUNS}/{run['id']}/cancel").json()["state"]["cancel_requested"] is True
    beat = put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()})
    assert beat.json()["cancel_requested"] is True and beat.json()["status"] == "in-progress"
    done = put_state(token, run["id"], {"status": "complete", "outcome": "cancelled"})
    assert done.status_code == 202 and done.json()["outcome"] == "cancelled"


def test_cancel_a_finished_run_is_409(token):
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "complete"})
    assert_problem(bridge(token).post(f"{RUNS}/{run['id']}/cancel"), 409)
