"""Workflows, runs, approvals and secrets over the API: the paths, the bodies, the problems,
and who may do what. (The engine's own behaviour, on real workers, is in
test_workflow_engine.py; here no worker runs, and steps are moved in-process when needed.)"""

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from relay.vault import VaultUnavailable
from tests.conftest import client_for, point_vault_at
from tests.test_api_permissions import user_with
from tests.test_connection_api import assert_problem
from tests.workflow_helpers import NOOP
from workflows import engine
from workflows.models import StepRun, Workflow, WorkflowRun, WorkflowSecret

SOURCE = f"""apiVersion: v1
parameters:
  host: {{description: which node}}
  noop: {{default: true}}
steps:
- name: dry-run
  image: {NOOP}
  spec: {{outputs: {{host: !Parameter host}}}}
- name: approve
  type: approval
  dependsOn: dry-run
"""
BROKEN = "apiVersion: v1\nsteps:\n- name: a\n  image: alpine\n- name: b\n  image: alpine\n  dependsOn: c\n"


@pytest.fixture
def workflow(alice_api) -> dict:
    response = alice_api.post("/api/workflows/", {"name": "deploy", "source": SOURCE}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def start(api, parameters: dict | None = None, name: str = "deploy"):
    return api.post(f"/api/workflows/{name}/runs/", {"parameters": parameters or {}}, format="json")


# Workflows -----------------------------------------------------------------------------------


def test_create_answers_the_workflow_with_its_first_revision(alice_api, workflow):
    assert workflow["name"] == "deploy" and workflow["owner"] == "alice"
    assert workflow["revision"] == 1 and workflow["source"] == SOURCE
    assert workflow["secrets"] == [] and workflow["triggers"] == []
    assert alice_api.get("/api/workflows/deploy/").json() == workflow


def test_an_invalid_document_is_not_saved_and_its_errors_have_places(alice_api):
    response = alice_api.post("/api/workflows/", {"name": "x", "source": BROKEN}, format="json")
    body = assert_problem(response, 400)
    assert body["type"] == "urn:relay:problem:invalid_workflow"
    assert body["errors"] == [
        {
            "pointer": "#/steps/1/dependsOn",
            "line": 7,
            "column": 14,
            "detail": "dependsOn names 'c', which is not a step of this workflow.",
        }
    ]
    assert not Workflow.objects.exists()


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"name": "x"}, "#/source"),
        ({"name": "x", "source": 7}, "#/source"),
        ({"name": "no spaces", "source": SOURCE}, "#/name"),
        ({"name": "x", "source": SOURCE, "sauce": SOURCE}, "#/sauce"),
    ],
)
def test_bad_fields_are_problems_pointing_at_them(alice_api, body, pointer):
    problem = assert_problem(alice_api.post("/api/workflows/", body, format="json"), 400)
    assert [e["pointer"] for e in problem["errors"]] == [pointer]


def test_a_second_workflow_with_the_same_name_is_refused(alice_api, workflow):
    problem = assert_problem(
        alice_api.post("/api/workflows/", {"name": "deploy", "source": SOURCE}, format="json"), 400
    )
    assert problem["errors"][0]["pointer"] == "#/name"


def test_put_saves_a_new_revision_and_an_invalid_one_changes_nothing(alice_api, workflow):
    changed = SOURCE.replace("which node", "the node")
    response = alice_api.put("/api/workflows/deploy/", {"source": changed}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["revision"], response.json()["source"]) == (2, changed)
    assert_problem(alice_api.put("/api/workflows/deploy/", {"source": BROKEN}, format="json"), 400)
    revisions = alice_api.get("/api/workflows/deploy/revisions/").json()["results"]
    assert [(r["number"], r["created_by"]) for r in revisions] == [(2, "alice"), (1, "alice")]
    assert revisions[1]["source"] == SOURCE


def test_another_user_s_workflow_is_not_found_unless_staff_may_view_it(alice_api, workflow, bob):
    bob_api = client_for(bob)
    assert_problem(bob_api.get("/api/workflows/deploy/"), 404)
    assert_problem(bob_api.get("/api/workflows/deploy/?owner=alice"), 404)
    assert_problem(start(bob_api), 404)
    assert bob_api.get("/api/workflows/").json()["results"] == []

    carol = client_for(user_with("view_workflow"))
    assert carol.get("/api/workflows/deploy/?owner=alice").json()["owner"] == "alice"
    assert [w["name"] for w in carol.get("/api/workflows/").json()["results"]] == ["deploy"]
    assert_problem(carol.put("/api/workflows/deploy/?owner=alice", {"source": SOURCE}, format="json"), 403)
    assert_problem(carol.delete("/api/workflows/deploy/?owner=alice"), 403)
    runs = "/api/workflows/deploy/runs/?owner=alice"
    assert_problem(carol.post(runs, {"parameters": {"host": "a"}}, format="json"), 403)
    # A run runs with the owner's connections: starting one is the owner's (test_workflow_permissions.py).
    starter = client_for(user_with("view_workflow", "add_workflowrun", name="erin"))
    assert_problem(starter.post(runs, {"parameters": {"host": "a"}}, format="json"), 403)


def test_delete_refuses_while_a_run_is_not_complete(alice_api, workflow):
    run_id = start(alice_api, {"host": "web1"}).json()["id"]
    assert_problem(alice_api.delete("/api/workflows/deploy/"), 409)
    assert alice_api.post(f"/api/workflow-runs/{run_id}/cancel/").status_code == 202
    assert alice_api.delete("/api/workflows/deploy/").status_code == 204
    assert not Workflow.objects.exists() and not WorkflowRun.objects.exists()


# Runs ----------------------------------------------------------------------------------------


def test_a_run_starts_with_its_parameters_bound_and_its_steps_pending(alice_api, workflow):
    response = start(alice_api, {"host": "web1.example.com"})
    assert response.status_code == 201, response.content
    run = response.json()
    assert run["workflow"] == "deploy" and run["revision"] == 1 and run["created_by"] == "alice"
    assert (run["status"], run["outcome"]) == ("initializing", "")
    assert run["parameters"] == {"host": "web1.example.com", "noop": True}
    assert [(s["name"], s["status"], s["kind"]) for s in run["steps"]] == [
        ("dry-run", "pending", "container"),
        ("approve", "pending", "approval"),
    ]
    assert set(run["steps"][0]) >= {"name", "status", "outputs", "started_at", "ended_at", "message"}
    assert alice_api.get(f"/api/workflow-runs/{run['id']}/").json() == run


def test_a_missing_or_unknown_parameter_is_a_400_and_no_run(alice_api, workflow):
    problem = assert_problem(start(alice_api, {"nope": 1}), 400)
    assert sorted((e["pointer"], e["code"]) for e in problem["errors"]) == [
        ("#/parameters/host", "required"),
        ("#/parameters/nope", "unknown"),
    ]
    problem = assert_problem(
        alice_api.post("/api/workflows/deploy/runs/", {"parameters": []}, format="json"), 400
    )
    assert problem["errors"][0]["pointer"] == "#/parameters"
    assert not WorkflowRun.objects.exists()


def test_runs_are_listed_newest_first_and_filtered(alice_api, workflow, bob):
    first = start(alice_api, {"host": "a"}).json()["id"]
    second = start(alice_api, {"host": "b"}).json()["id"]
    alice_api.post(f"/api/workflow-runs/{first}/cancel/")
    listed = alice_api.get("/api/workflow-runs/?workflow=deploy").json()["results"]
    assert [r["id"] for r in listed] == [second, first]
    assert [r["id"] for r in alice_api.get("/api/workflow-runs/?status=complete").json()["results"]] == [
        first
    ]
    assert alice_api.get("/api/workflow-runs/?workflow=other").json()["results"] == []
    assert_problem(alice_api.get("/api/workflow-runs/?status=done"), 400)
    bob_api = client_for(bob)
    assert bob_api.get("/api/workflow-runs/").json()["results"] == []
    assert_problem(bob_api.get(f"/api/workflow-runs/{first}/"), 404)
    assert_problem(bob_api.post(f"/api/workflow-runs/{second}/cancel/"), 404)


def test_cancel_skips_the_steps_of_a_run_that_has_not_started(alice_api, workflow):
    run_id = start(alice_api, {"host": "a"}).json()["id"]
    response = alice_api.post(f"/api/workflow-runs/{run_id}/cancel/")
    assert response.status_code == 202
    run = response.json()
    assert (run["status"], run["outcome"], run["cancel_requested"]) == ("complete", "cancelled", True)
    assert {s["status"] for s in run["steps"]} == {"skipped"}
    assert assert_problem(alice_api.post(f"/api/workflow-runs/{run_id}/cancel/"), 409)["detail"] == (
        "The run is complete (cancelled); there is nothing to cancel."
    )


# Approvals -----------------------------------------------------------------------------------


def waiting_approval(api) -> StepRun:
    """A run whose approval waits for its answer (moved along here, with no worker)."""
    run = WorkflowRun.objects.get(pk=start(api, {"host": "a"}).json()["id"])
    engine.start_run(run.pk)
    engine.start_step(str(StepRun.objects.get(run=run, name="dry-run").pk))
    approval = StepRun.objects.get(run=run, name="approve")
    engine.start_step(str(approval.pk))
    approval.refresh_from_db()
    assert approval.status == "in-progress"
    return approval


def answer_url(step: StepRun, verb: str) -> str:
    return f"/api/workflow-runs/{step.run_id}/steps/{step.name}/{verb}/"


def test_answering_needs_the_approve_permission_even_for_the_owner(alice, alice_api, workflow):
    approval = waiting_approval(alice_api)
    problem = assert_problem(alice_api.post(answer_url(approval, "approve")), 403)
    assert problem["detail"] == (
        "Answering approvals needs the permission to approve them (workflows.approve_steprun)."
    )
    alice.user_permissions.set(user_with("approve_steprun", name="x").user_permissions.all())
    response = client_for(User.objects.get(pk=alice.pk)).post(answer_url(approval, "approve"))
    assert response.status_code == 200, response.content
    step = next(s for s in response.json()["steps"] if s["name"] == "approve")
    assert (step["status"], step["decision"], step["decided_by"]) == ("success", "approved", "alice")
    assert_problem(alice_api.post(answer_url(approval, "reject")), 409)


def test_an_approver_rejects_and_the_run_fails(alice_api, workflow):
    approval = waiting_approval(alice_api)
    approver = client_for(user_with("approve_steprun", "view_workflowrun", name="dana"))
    response = approver.post(answer_url(approval, "reject"))
    assert response.status_code == 200, response.content
    engine.advance(approval.run_id)  # as the queued advance_run would
    run = alice_api.get(f"/api/workflow-runs/{approval.run_id}/").json()
    assert (run["status"], run["outcome"]) == ("complete", "failure")
    assert run["steps"][1]["message"] == "Rejected by dana."


def test_answering_what_is_not_a_waiting_approval_is_a_conflict(alice_api, workflow, staff):
    run_id = start(alice_api, {"host": "a"}).json()["id"]
    root = client_for(staff)
    assert assert_problem(root.post(f"/api/workflow-runs/{run_id}/steps/approve/approve/"), 409)[
        "detail"
    ] == ("Approval 'approve' is not waiting for an answer yet.")
    assert assert_problem(root.post(f"/api/workflow-runs/{run_id}/steps/dry-run/approve/"), 409)[
        "detail"
    ] == ("Step 'dry-run' is not an approval.")
    assert_problem(root.post(f"/api/workflow-runs/{run_id}/steps/nope/approve/"), 404)


# Secrets -------------------------------------------------------------------------------------


def test_secrets_are_write_only_and_kept_in_vault(
    alice_api, workflow, bao, django_capture_on_commit_callbacks
):
    url = "/api/workflows/deploy/secrets/api-key/"
    response = alice_api.put(url, {"value": "first"}, format="json")
    assert response.status_code == 204 and response.content == b""
    assert alice_api.put(url, {"value": "second"}, format="json").status_code == 204
    path = f"relay/workflows/{workflow['id']}/secrets/api-key"
    assert bao.read(path) == {"value": "second"}
    meta = bao.root().secrets.kv.v2.read_secret_metadata(path=path)["data"]
    assert meta["current_version"] == 2 and meta["custom_metadata"] == {
        "relay_deployment": settings.RELAY_DEPLOYMENT_ID
    }
    shown = alice_api.get("/api/workflows/deploy/")
    assert shown.json()["secrets"] == ["api-key"] and b"second" not in shown.content
    assert WorkflowSecret.value_of(workflow["id"], "api-key") == "second"

    with django_capture_on_commit_callbacks(execute=True):  # the value goes after the commit
        assert alice_api.delete(url).status_code == 204
    assert bao.read(path) is None
    assert_problem(alice_api.delete(url), 404)


def test_a_secret_read_once_is_kept_a_while_but_a_replaced_one_never_served(
    alice_api, workflow, bao, settings
):
    url = "/api/workflows/deploy/secrets/api-key/"
    assert alice_api.put(url, {"value": "first"}, format="json").status_code == 204
    assert WorkflowSecret.value_of(workflow["id"], "api-key") == "first"
    # Vault gone: the value read a moment ago is still known to this process.
    point_vault_at(bao, "a-token-vault-refuses")
    assert WorkflowSecret.value_of(workflow["id"], "api-key") == "first"
    point_vault_at(bao, bao.root().token)
    assert alice_api.put(url, {"value": "second"}, format="json").status_code == 204
    settings.SECRET_CACHE_SECONDS = 0  # nothing kept: each read is Vault's
    assert WorkflowSecret.value_of(workflow["id"], "api-key") == "second"  # not the kept one
    point_vault_at(bao, "a-token-vault-refuses")
    with pytest.raises(VaultUnavailable):
        WorkflowSecret.value_of(workflow["id"], "api-key")
    point_vault_at(bao, bao.root().token)


@pytest.mark.parametrize(
    ("secret", "body", "pointer"),
    [
        ("api-key", {"value": 7}, "#/value"),
        ("api-key", {}, "#/value"),
        ("api-key", {"value": "x", "other": 1}, "#/other"),
        ("-bad", {"value": "x"}, "#/secret"),
    ],
)
def test_bad_secrets_are_problems(alice_api, workflow, secret, body, pointer):
    problem = assert_problem(
        alice_api.put(f"/api/workflows/deploy/secrets/{secret}/", body, format="json"), 400
    )
    assert [e["pointer"] for e in problem["errors"]] == [pointer]
    assert not WorkflowSecret.objects.exists()


def test_another_user_cannot_set_or_delete_secrets(alice_api, workflow, bob):
    url = "/api/workflows/deploy/secrets/api-key/?owner=alice"
    assert_problem(client_for(bob).put(url, {"value": "x"}, format="json"), 404)
    assert_problem(client_for(user_with("view_workflow")).put(url, {"value": "x"}, format="json"), 403)
    assert not WorkflowSecret.objects.exists()


def test_a_secret_vault_cannot_store_leaves_nothing_behind(alice_api, workflow, own_bao):
    own_bao.stop()
    problem = assert_problem(
        alice_api.put("/api/workflows/deploy/secrets/api-key/", {"value": "x"}, format="json"), 503
    )
    assert "x" not in problem["detail"].split() and "127.0.0.1" not in problem["detail"]
    assert not WorkflowSecret.objects.exists()
