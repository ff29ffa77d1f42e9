"""The permission table of workflows (docs/api.md "Who may do what to a workflow"), cell by cell, in
the admin and in the API alike: a workflow runs with its owner's connections, so its document,
secrets, triggers, owner and starting its runs are its owner's and superusers' alone; other
staff's permissions give view, delete, the view of runs, cancel and approvals, never more."""

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from tests.conftest import client_for, owner_as_actor
from tests.events_helpers import post
from tests.test_api_permissions import user_with
from tests.test_connection_api import assert_problem
from tests.test_workflow_admin import form, logged_in
from tests.test_workflow_webhooks import hook
from tests.workflow_helpers import NOOP, make_workflow, waiting_at_gate
from triggers.models import Trigger
from workflows import engine
from workflows.models import StepRun, Workflow, WorkflowRun, WorkflowSecret

SOURCE = f"""apiVersion: v1
triggers:
- name: hook
  source: {{type: webhook, image: relaysh/stdlib-trigger-json}}
- name: reports
  source: {{type: push}}
steps:
- name: a
  image: {NOOP}
- name: gate
  type: approval
  dependsOn: a
"""
# A new revision that names a new webhook trigger: its answer would hand out its token.
CHANGED = SOURCE.replace(
    "- name: reports", "- name: another\n  source: {type: webhook, image: x}\n- name: reports"
)

ALL = [
    "view_workflow",
    "add_workflow",
    "change_workflow",
    "delete_workflow",
    "view_workflowrun",
    "add_workflowrun",
    "change_workflowrun",
    "delete_workflowrun",
    "approve_steprun",
    "view_approval",
    "change_approval",
    "view_trigger",
    "add_trigger",
    "change_trigger",
    "delete_trigger",
    "view_workflowsecret",
    "add_workflowsecret",
    "change_workflowsecret",
]

# The table. Y: done; N: refused (API 403); H: not seen (API 404); -: no such door.
COLUMNS = [
    "view",  # the workflow, its revisions
    "runs",  # its runs, their steps and approvals
    "document",  # save a revision (which may make triggers, with their tokens)
    "secret",  # set a secret
    "owner",  # give the workflow to another user (admin; the API has no such route)
    "make_for",  # make a new workflow owned by another user
    "start",  # start a run (API; the admin has no such button)
    "cancel",  # cancel a run
    "delete",  # delete the workflow
    "approve",  # answer its approval
    "regenerate",  # a new token for its webhook trigger
    "trigger",  # change its push trigger's filters
]
TABLE = {
    #                                         view runs doc sec own mkf sta can del app reg trg
    "owner": ("owner", "Y Y Y Y N N Y Y Y N Y Y"),
    "owner with approve_steprun": ("owner+approve", "Y Y Y Y N N Y Y Y Y Y Y"),
    "superuser": ("superuser", "Y Y Y Y Y Y Y Y Y Y Y Y"),
    "staff with every permission": (ALL, "Y Y N N N N N Y Y Y N N"),
    "view_workflow": (["view_workflow"], "Y H N N N N N H N H H H"),
    "change_workflow": (["change_workflow"], "Y H N N N N N H N H H H"),
    "add_workflow": (["add_workflow"], "H H H H H N H H H H H H"),
    "view_workflow, delete_workflow": (["view_workflow", "delete_workflow"], "Y H N N N N N H Y H H H"),
    "delete_workflow": (["delete_workflow"], "H H H H H N H H H H H H"),
    "view_workflow, add_workflowrun": (["view_workflow", "add_workflowrun"], "Y H N N N N N H N H H H"),
    "view_workflowrun": (["view_workflowrun"], "H Y H H H N H N H N H H"),
    "change_workflowrun": (["change_workflowrun"], "H Y H H H N H Y H N H H"),
    "view_workflowrun, approve_steprun": (
        ["view_workflowrun", "approve_steprun"],
        "H Y H H H N H N H Y H H",
    ),
    "approve_steprun": (["approve_steprun"], "H H H H H N H H H H H H"),
    "view_approval": (["view_approval"], "H H H H H N H H H H H H"),
    "view_trigger, change_trigger": (["view_trigger", "change_trigger"], "H H H H H N H H H H N N"),
    "staff without permissions": ([], "H H H H H N H H H H H H"),
    "not staff, every permission": ("not staff", "H H H H H N H H H H H H"),
}
CELLS = [
    pytest.param(row, column, door, cells.split()[i], id=f"{door}-{row}-{column}")
    for row, (_, cells) in TABLE.items()
    for i, column in enumerate(COLUMNS)
    for door in ("api", "admin")
    if (door, column) not in {("api", "owner"), ("admin", "start")}
]


@dataclass
class World:
    alice: User
    bob: User
    workflow: Workflow
    run: WorkflowRun
    gate: StepRun
    hook: Trigger
    reports: Trigger


@pytest.fixture
def world(alice, bob, bao) -> World:
    """Alice's workflow, its webhook and push triggers, and a run waiting at its approval."""
    workflow = make_workflow(alice, SOURCE)
    run = engine.create_run(workflow, {}, created_by=alice)
    gate = waiting_at_gate(run)
    hook, reports = (workflow.push_triggers.get(name=name) for name in ("hook", "reports"))
    return World(alice, bob, workflow, run, gate, hook, reports)


def actor_for(row: str, world: World, door: str) -> User:
    who = TABLE[row][0]
    if who in ("owner", "owner+approve"):
        if who == "owner+approve":
            world.alice.user_permissions.set(Permission.objects.filter(codename="approve_steprun"))
        return owner_as_actor(world.alice, door)
    if who == "superuser":
        return User.objects.create_superuser("root")
    if who == "not staff":
        return user_with(*ALL, staff=False)
    return user_with(*who)


# Each cell: do it through the door, and say whether it was done (from the database, not the
# answer). The API's answers are checked against the cell too: Y a 2xx, N 403, H 404.


def api_view(api, w: World) -> tuple[Any, bool]:
    response = api.get("/api/workflows/wf/?owner=alice")
    revisions = api.get("/api/workflows/wf/revisions/?owner=alice")
    assert revisions.status_code == response.status_code
    return response, response.status_code == 200 and response.json()["id"] == str(w.workflow.pk)


def admin_view(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.get(f"/admin/workflows/workflow/{w.workflow.pk}/change/")
    return response, response.status_code == 200 and "dependsOn: a" in response.content.decode()


def api_runs(api, w: World) -> tuple[Any, bool]:
    response = api.get(f"/api/workflow-runs/{w.run.pk}/")
    listed = api.get("/api/workflow-runs/").json()["results"]
    seen = response.status_code == 200 and response.json()["steps"][1]["status"] == "in-progress"
    assert ([r["id"] for r in listed] == [str(w.run.pk)]) == seen
    return response, seen


def admin_runs(admin: Client, w: World) -> tuple[Any, bool]:
    approvals = admin.get("/admin/workflows/approval/")  # first: the pages below leave messages
    run_page = admin.get(f"/admin/workflows/workflowrun/{w.run.pk}/change/")
    approval_page = admin.get(f"/admin/workflows/approval/{w.gate.pk}/change/")
    seen = run_page.status_code == 200 and approval_page.status_code == 200
    # One rule for the run, its approval's page and the approvals' list.
    assert (approval_page.status_code == 200) == (run_page.status_code == 200)
    assert (approvals.status_code == 200 and str(w.gate.pk) in approvals.content.decode()) == seen
    return run_page, seen


def api_document(api, w: World) -> tuple[Any, bool]:
    response = api.put("/api/workflows/wf/?owner=alice", {"source": CHANGED}, format="json")
    done = w.workflow.revisions.count() == 2
    assert Trigger.objects.filter(workflow=w.workflow, name="another").exists() == done
    if done:
        assert [t["name"] for t in response.json()["triggers"]] == ["another"]
    else:
        assert b"rlyt_" not in response.content
    return response, done


def admin_document(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(
        f"/admin/workflows/workflow/{w.workflow.pk}/change/", form(w.alice, CHANGED, name="wf")
    )
    done = w.workflow.revisions.count() == 2
    assert Trigger.objects.filter(workflow=w.workflow, name="another").exists() == done
    return response, done


def api_secret(api, w: World) -> tuple[Any, bool]:
    response = api.put("/api/workflows/wf/secrets/api-key/?owner=alice", {"value": "s3cret"}, format="json")
    return response, WorkflowSecret.objects.filter(workflow=w.workflow).exists()


def admin_secret(admin: Client, w: World) -> tuple[Any, bool]:
    data = form(w.alice, SOURCE, [{"name": "api-key", "value": "s3cret"}], name="wf")
    response = admin.post(f"/admin/workflows/workflow/{w.workflow.pk}/change/", data)
    return response, WorkflowSecret.objects.filter(workflow=w.workflow).exists()


def admin_owner(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(
        f"/admin/workflows/workflow/{w.workflow.pk}/change/", form(w.bob, SOURCE, name="wf")
    )
    return response, Workflow.objects.get(pk=w.workflow.pk).owner_id == w.bob.pk


def api_make_for(api, w: World) -> tuple[Any, bool]:
    response = api.post("/api/workflows/?owner=bob", {"name": "new", "source": SOURCE}, format="json")
    done = Workflow.objects.filter(owner=w.bob, name="new").exists()
    if done:
        assert response.json()["owner"] == "bob"
    return response, done


def admin_make_for(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post("/admin/workflows/workflow/add/", form(w.bob, SOURCE, name="new"))
    return response, Workflow.objects.filter(owner=w.bob, name="new").exists()


def api_start(api, w: World) -> tuple[Any, bool]:
    response = api.post("/api/workflows/wf/runs/?owner=alice", {}, format="json")
    return response, w.workflow.runs.count() == 2


def api_cancel(api, w: World) -> tuple[Any, bool]:
    response = api.post(f"/api/workflow-runs/{w.run.pk}/cancel/")
    return response, WorkflowRun.objects.get(pk=w.run.pk).cancel_requested


def admin_cancel(admin: Client, w: World) -> tuple[Any, bool]:
    data = {"action": "cancel_runs", "_selected_action": [str(w.run.pk)]}
    response = admin.post("/admin/workflows/workflowrun/", data)
    return response, WorkflowRun.objects.get(pk=w.run.pk).cancel_requested


def complete(w: World) -> None:
    """A workflow with a run in progress is not deleted by anyone (409): end it first."""
    engine.cancel_run(w.run)
    assert WorkflowRun.objects.get(pk=w.run.pk).status == "complete"


def api_delete(api, w: World) -> tuple[Any, bool]:
    complete(w)
    response = api.delete("/api/workflows/wf/?owner=alice")
    return response, not Workflow.objects.filter(pk=w.workflow.pk).exists()


def admin_delete(admin: Client, w: World) -> tuple[Any, bool]:
    complete(w)
    response = admin.post(f"/admin/workflows/workflow/{w.workflow.pk}/delete/", {"post": "yes"})
    return response, not Workflow.objects.filter(pk=w.workflow.pk).exists()


def api_approve(api, w: World) -> tuple[Any, bool]:
    response = api.post(f"/api/workflow-runs/{w.run.pk}/steps/gate/approve/")
    return response, StepRun.objects.get(pk=w.gate.pk).decision == "approved"


def admin_approve(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(f"/admin/workflows/approval/{w.gate.pk}/approve/")
    return response, StepRun.objects.get(pk=w.gate.pk).decision == "approved"


def regenerated(w: World, response) -> bool:
    done = Trigger.objects.get(pk=w.hook.pk).token_digest != w.hook.token_digest
    assert (b"rlyt_" in response.content) == done  # the new token, to whoever did it
    return done


def api_regenerate(api, w: World) -> tuple[Any, bool]:
    response = api.post(f"/api/triggers/{w.hook.pk}/regenerate/")
    return response, regenerated(w, response)


def admin_regenerate(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(f"/admin/triggers/trigger/{w.hook.pk}/regenerate/")
    return response, regenerated(w, response)


def api_trigger(api, w: World) -> tuple[Any, bool]:
    response = api.patch(f"/api/triggers/{w.reports.pk}/", {"statuses": ["failed"]}, format="json")
    return response, Trigger.objects.get(pk=w.reports.pk).statuses == ["failed"]


def admin_trigger(admin: Client, w: World) -> tuple[Any, bool]:
    data = {"description": "", "statuses": '["failed"]'}
    data |= {field: "[]" for field in ("environments", "host_globs", "resource_types", "title_globs", "tags")}
    response = admin.post(f"/admin/triggers/trigger/{w.reports.pk}/change/", data)
    return response, Trigger.objects.get(pk=w.reports.pk).statuses == ["failed"]


API_SUCCESS = {"make_for": 201, "start": 201, "cancel": 202, "secret": 204, "delete": 204}


@pytest.mark.parametrize(("row", "column", "door", "cell"), CELLS)
def test_the_permission_table(row, column, door, cell, world):
    actor = actor_for(row, world, door)
    if door == "api":
        response, done = globals()[f"api_{column}"](client_for(actor), world)
        expected = {"Y": API_SUCCESS.get(column, 200), "N": 403, "H": 404}[cell]
        assert response.status_code == expected, response.content
        if cell != "Y":
            assert response["Content-Type"] == "application/problem+json"
    else:
        response, done = globals()[f"admin_{column}"](logged_in(actor), world)
        if cell == "Y":
            assert response.status_code in (200, 302), response.content
    assert done == (cell == "Y"), f"{row} / {column} / {door}: {response.status_code}"


# Around the table -----------------------------------------------------------------------------


def test_a_superuser_hands_a_workflow_over_and_its_old_trigger_tokens_stop(alice, bob, staff, bao):
    made = client_for(alice).post("/api/workflows/", {"name": "wf", "source": SOURCE}, format="json").json()
    old = {trigger["name"]: trigger for trigger in made["triggers"]}
    assert hook(old["hook"]["url"], old["hook"]["token"], {"a": 1}).status_code == 202
    workflow = Workflow.objects.get(pk=made["id"])
    reports = workflow.push_triggers.get(name="reports")
    reports.set_slack_webhook("https://hooks.slack.com/services/T0/B0/alices-channel")

    response = logged_in(staff).post(
        f"/admin/workflows/workflow/{workflow.pk}/change/", form(bob, SOURCE, name="wf")
    )
    assert response.status_code == 302, response.content
    assert Workflow.objects.get(pk=workflow.pk).owner == bob
    # Alice's tokens would start runs that run with bob's connections: they are gone.
    assert hook(old["hook"]["url"], old["hook"]["token"], {"a": 1}).status_code == 401
    assert post(old["reports"]["token"], b"{}", "application/json").status_code == 401
    assert set(workflow.push_triggers.values_list("owner__username", flat=True)) == {"bob"}
    # Alice's Slack channel would hear of bob's reports: it goes with her.
    reports = Trigger.objects.get(pk=reports.pk)
    assert not reports.has_slack_webhook and set(bao.read(reports.vault_path)) == {"token"}
    hook_id = workflow.push_triggers.get(name="hook").pk
    assert client_for(alice).post(f"/api/triggers/{hook_id}/regenerate/").status_code == 404
    new = client_for(bob).post(f"/api/triggers/{hook_id}/regenerate/").json()["token"]
    assert hook(old["hook"]["url"], new, {"a": 1}).status_code == 202


def test_a_rename_that_clashes_is_a_form_error_for_an_owner_without_the_owner_field(alice, bao):
    alice.is_staff = True
    alice.save()
    make_workflow(alice, SOURCE, name="other")
    workflow = make_workflow(alice, SOURCE, name="wf")
    page = logged_in(alice).post(
        f"/admin/workflows/workflow/{workflow.pk}/change/", form(alice, SOURCE, name="other")
    )
    assert (
        page.status_code == 200
        and "The owner already has a workflow with this name." in page.content.decode()
    )
    assert Workflow.objects.get(pk=workflow.pk).name == "wf"


def test_the_admin_s_add_form_offers_a_non_superuser_only_themselves_as_owner(alice, bob):
    carol = user_with("add_workflow")
    page = logged_in(carol).get("/admin/workflows/workflow/add/").content.decode()
    assert f'<option value="{carol.pk}" selected>carol</option>' in page
    assert ">alice<" not in page and ">bob<" not in page
    refused = logged_in(carol).post("/admin/workflows/workflow/add/", form(alice, SOURCE, name="theirs"))
    assert refused.status_code == 200 and "Select a valid choice." in refused.content.decode()
    assert not Workflow.objects.exists()
    saved = logged_in(carol).post("/admin/workflows/workflow/add/", form(carol, SOURCE, name="mine"))
    assert (
        saved.status_code == 200 and "Copy each token now" in saved.content.decode()
    )  # its triggers' tokens
    assert Workflow.objects.get(name="mine").owner == carol


def test_a_superuser_makes_a_workflow_for_a_user_who_exists(staff, alice):
    root = client_for(staff)
    response = root.post("/api/workflows/?owner=nobody", {"name": "wf", "source": SOURCE}, format="json")
    assert assert_problem(response, 400)["errors"][0]["pointer"] == "#/owner"
    # Naming oneself is no other user.
    own = client_for(alice).post(
        "/api/workflows/?owner=alice", {"name": "wf", "source": SOURCE}, format="json"
    )
    assert own.status_code == 201 and own.json()["owner"] == "alice"
    clash = root.post("/api/workflows/?owner=alice", {"name": "wf", "source": SOURCE}, format="json")
    assert assert_problem(clash, 400)["errors"][0]["detail"] == "alice already has a workflow with this name."


@pytest.mark.parametrize(
    ("url", "model", "codename", "data"),
    [
        ("/admin/puppet_connection/puppetconnection/add/", PuppetConnection, "add_puppetconnection", {}),
        ("/admin/triggers/trigger/add/", Trigger, "add_trigger", {}),
        (
            "/admin/connections/slackconnection/add/",
            SlackConnection,
            "add_slackconnection",
            {"token": "xoxb-" + "1" * 40},
        ),
    ],
    ids=["puppet connection", "trigger", "slack connection"],
)
def test_staff_with_the_add_permission_make_connections_and_triggers_for_themselves_only(
    url, model, codename, data, alice, bao
):
    # Alice's workflows would use a connection named as theirs, with a token this user holds.
    carol = logged_in(user_with(codename))
    carol.post(url, {"name": "prod", "description": "", "owner": alice.pk, **data})
    assert not model.objects.filter(owner=alice).exists()


def test_the_admin_deletes_a_workflow_only_when_its_runs_are_complete_as_the_api(world, staff):
    admin = logged_in(staff)
    url = f"/admin/workflows/workflow/{world.workflow.pk}/delete/"
    page = admin.post(url, {"post": "yes"})
    assert (
        page.status_code == 200
        and f"Run {world.run.pk} (in-progress): cancel it first" in page.content.decode()
    )
    assert Workflow.objects.filter(pk=world.workflow.pk).exists()
    assert_problem(client_for(staff).delete("/api/workflows/wf/?owner=alice"), 409)
    complete(world)
    assert admin.post(url, {"post": "yes"}).status_code == 302
    assert not Workflow.objects.exists() and not Trigger.objects.exists()  # its triggers went with it
