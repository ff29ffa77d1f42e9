"""The workflows admin: the document edited in place with its errors under it, write-only
secrets, run pages with their steps, and approvals answered only by approvers."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from runs.models import Run
from tests.workflow_helpers import NOOP, make_workflow, steps_of, waiting_at_gate
from workflows import engine
from workflows.models import StepRun, Workflow, WorkflowSecret

ADD = "/admin/workflows/workflow/add/"
VALID = f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n  spec: {{outputs: {{changes: 3}}}}\n"
INVALID = "apiVersion: v1\nsteps:\n- name: a\n  image: alpine\n- name: b\n  image: alpine\n  dependsOn: c\n"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form(owner: User, source: str, secrets: list[dict] | None = None, initial: int = 0, **extra) -> dict:
    data = {
        "owner": owner.pk,
        "name": "deploy",
        "description": "",
        "source": source,
        "secrets-TOTAL_FORMS": len(secrets or []),
        "secrets-INITIAL_FORMS": initial,
        "revisions-TOTAL_FORMS": 0,
        "revisions-INITIAL_FORMS": 0,
        **extra,
    }
    for i, secret in enumerate(secrets or []):
        data |= {f"secrets-{i}-{key}": value for key, value in secret.items()}
    return data


def test_a_document_with_errors_is_shown_again_with_them_and_not_saved(staff):
    page = logged_in(staff).post(ADD, form(staff, INVALID)).content.decode()
    assert "Line 7, column 14 (#/steps/1/dependsOn): dependsOn names &#x27;c&#x27;" in page
    assert "dependsOn: c" in page  # the text as typed, to fix in place
    assert not Workflow.objects.exists()


def test_saving_a_changed_document_makes_a_new_revision(staff):
    admin = logged_in(staff)
    assert admin.post(ADD, form(staff, VALID)).status_code == 302
    workflow = Workflow.objects.get()
    change = f"/admin/workflows/workflow/{workflow.pk}/change/"
    assert VALID.splitlines()[-1] in admin.get(change).content.decode()
    assert admin.post(change, form(staff, VALID)).status_code == 302  # unchanged: no revision
    assert admin.post(change, form(staff, VALID.replace("3", "4"))).status_code == 302
    assert [r.number for r in workflow.revisions.all()] == [1, 2]
    assert workflow.latest_revision().source == VALID.replace("3", "4")
    assert workflow.latest_revision().created_by == staff


def test_secret_values_go_to_vault_and_are_never_shown(staff, bao):
    admin = logged_in(staff)
    response = admin.post(ADD, form(staff, VALID, [{"name": "api-key", "value": "s3cr3t-value"}]))
    assert response.status_code == 302
    workflow = Workflow.objects.get()
    assert WorkflowSecret.value_of(workflow.pk, "api-key") == "s3cr3t-value"
    change = f"/admin/workflows/workflow/{workflow.pk}/change/"
    page = admin.get(change).content.decode()
    assert "api-key" in page and "s3cr3t-value" not in page
    secret = WorkflowSecret.objects.get()
    kept = form(staff, VALID, [{"id": secret.pk, "workflow": workflow.pk, "name": "api-key", "value": ""}], 1)
    assert admin.post(change, kept).status_code == 302  # a blank value keeps it
    assert WorkflowSecret.value_of(workflow.pk, "api-key") == "s3cr3t-value"


def test_the_run_page_lists_the_steps_with_statuses_and_outputs(staff, alice):
    workflow = make_workflow(alice, VALID + "- name: gate\n  type: approval\n  dependsOn: a\n")
    run = engine.create_run(workflow, {})
    engine.start_run(run.pk)
    engine.start_step(str(steps_of(run)["a"].pk))
    page = logged_in(staff).get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    assert "success" in page and "pending" in page and "&quot;changes&quot;: 3" in page


@pytest.fixture
def waiting(alice) -> StepRun:
    workflow = make_workflow(alice, VALID + "- name: gate\n  type: approval\n  dependsOn: a\n")
    return waiting_at_gate(engine.create_run(workflow, {}))


def with_perms(name: str, *codenames: str) -> User:
    user = User.objects.create_user(name, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def test_an_approver_sees_the_evidence_and_approves(waiting):
    approver = logged_in(with_perms("ann", "approve_steprun", "view_workflowrun"))
    page = approver.get(f"/admin/workflows/approval/{waiting.pk}/change/").content.decode()
    assert 'value="Approve"' in page and 'value="Reject"' in page
    assert "&quot;changes&quot;: 3" in page  # what the step before it found
    response = approver.post(f"/admin/workflows/approval/{waiting.pk}/approve/", follow=True)
    assert "Approved: gate." in response.content.decode()
    waiting.refresh_from_db()
    assert (waiting.status, waiting.decision, waiting.decided_by.username) == ("success", "approved", "ann")


def test_without_the_permission_an_approval_is_read_only(waiting):
    viewer = logged_in(with_perms("vic", "view_workflowrun"))
    page = viewer.get(f"/admin/workflows/approval/{waiting.pk}/change/").content.decode()
    assert 'value="Approve"' not in page and "waits for an answer from someone who may approve" in page
    assert viewer.post(f"/admin/workflows/approval/{waiting.pk}/reject/").status_code == 403
    waiting.refresh_from_db()
    assert waiting.status == "in-progress"


DRY_RUN = """apiVersion: v1
steps:
- name: dry-run
  image: relay-internal/noop
  spec:
    outputs:
      id: {run_id}
      outcome: finished
      results:
        nodes:
        - name: web-1.example.com
          changes_pending: true
          resources:
          - type: File
            title: /etc/motd
            changes:
            - {{property: content, from: "{{md5}}aaa", to: "{{md5}}bbb"}}
        - name: web-2.example.com
          changes_pending: false
          resources: []
        - name: web-3.example.com
          changes_pending: null
          report_error: "not available: PuppetDB had no report of this run for the node after 30 s"
- name: gate
  type: approval
  dependsOn: dry-run
"""


def test_the_approval_shows_what_the_dry_run_would_change_and_the_run_page_links_its_puppet_run(
    staff, alice, connection
):
    puppet_run = Run.create_for(connection[0], {"type": "run", "scope": {"nodes": ["web-1.example.com"]}})
    workflow = make_workflow(alice, DRY_RUN.format(run_id=puppet_run.pk))
    run = engine.create_run(workflow, {})
    engine.start_run(run.pk)
    engine.start_step(str(steps_of(run)["dry-run"].pk))
    gate = steps_of(run)["gate"]
    engine.start_step(str(gate.pk))

    page = logged_in(staff).get(f"/admin/workflows/approval/{gate.pk}/change/").content.decode()
    assert (
        "<strong>web-1.example.com</strong>: changes pending<br>File[/etc/motd] content: {md5}aaa → {md5}bbb"
        in page
    )
    assert "<strong>web-2.example.com</strong>: no changes pending" in page
    assert (
        "<strong>web-3.example.com</strong>: not available: PuppetDB had no report of this "
        "run for the node after 30 s" in page
    )

    page = logged_in(staff).get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    assert f'href="/admin/runs/run/{puppet_run.pk}/change/">{puppet_run.pk} (pending)</a>' in page


PUSHED = VALID.replace("steps:\n", "triggers:\n- name: reports\n  source: {type: push}\nsteps:\n")


def test_a_new_trigger_shows_its_first_token_once_on_the_page_that_saved_it(staff):
    from triggers.models import Trigger

    admin = logged_in(staff)
    response = admin.post(ADD, form(staff, PUSHED))
    assert response.status_code == 200  # no redirect: no URL to come back to
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    token = re.search(r'<code class="relay-token"[^>]*>([^<]+)</code>', page).group(1)
    trigger = Trigger.for_token(token)
    assert trigger is not None and trigger.name == "reports"  # the one that works, never stored
    workflow = Workflow.objects.get()
    change = f"/admin/workflows/workflow/{workflow.pk}/change/"
    assert token not in admin.get(change).content.decode()
    # Saved again unchanged: no new trigger, an ordinary save.
    assert admin.post(change, form(staff, PUSHED)).status_code == 302
    assert Trigger.for_token(token) == trigger
