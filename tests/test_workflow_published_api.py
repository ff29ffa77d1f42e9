"""Every workflow published in puppetlabs/relay-workflows, saved through the API as it stands:
accepted (201), the text kept verbatim, its push and webhook triggers made with tokens that
work and its schedules made, and the warnings the validator has for two of them shown by
`POST /api/workflows/validate`; and what a run does with what those two warnings are about."""

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.test_workflow_conformance import EVERY_PUBLISHED, PUBLISHED_WARNINGS
from tests.workflow_helpers import NOOP
from triggers.models import Event, EventState, Trigger, WorkflowStart
from workflows import engine, services
from workflows.dialect.validate import parse
from workflows.models import StepRun, Workflow, WorkflowRun

pytestmark = pytest.mark.django_db

# Those that declare schedule or webhook triggers.
SCHEDULE_OR_WEBHOOK = [
    path for path in EVERY_PUBLISHED if any(t.kind != "push" for t in parse(path.read_text()).triggers)
]


def declared(path: Path, kind: str) -> list[str]:
    return [t.name for t in parse(path.read_text()).triggers if t.kind == kind]


@pytest.mark.parametrize("path", EVERY_PUBLISHED, ids=lambda p: p.name)
def test_every_published_workflow_is_saved_with_its_push_triggers(alice_api: APIClient, path: Path) -> None:
    source = path.read_text()
    response = alice_api.post("/api/workflows/", {"name": path.stem, "source": source}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["revision"] == 1 and body["source"] == source
    workflow = Workflow.objects.get(owner__username="alice", name=path.stem)
    assert workflow.latest_revision().source == source
    # Its push and webhook triggers are made, each with its token shown once here, one that
    # finds it (a webhook's with its URL).
    tokened = [(t.name, t.kind) for t in parse(source).triggers if t.kind in ("push", "webhook")]
    assert [(t["name"], t["type"]) for t in body["triggers"]] == tokened
    rows = {t.name: t for t in Trigger.objects.filter(workflow=workflow)}
    assert sorted((t.name, t.kind) for t in rows.values()) == sorted(tokened)
    for answer in body["triggers"]:
        assert Trigger.for_token(answer["token"]) == rows[answer["name"]]
        assert answer.get("url", "") == rows[answer["name"]].webhook_url()


def test_the_published_set_declares_every_kind_of_trigger() -> None:
    # 3 push (the Puppet ones), 2 schedule, 13 webhook, 26 with none: the checks above and
    # below cover each kind.
    kinds = {
        kind: sum(bool(declared(p, kind)) for p in EVERY_PUBLISHED)
        for kind in ("push", "schedule", "webhook")
    }
    assert kinds == {"push": 3, "schedule": 2, "webhook": 13}
    assert len(SCHEDULE_OR_WEBHOOK) == 15


@pytest.mark.parametrize("path", EVERY_PUBLISHED, ids=lambda p: p.name)
def test_validate_answers_valid_with_the_published_warnings(alice_api: APIClient, path: Path) -> None:
    response = alice_api.post(
        "/api/workflows/validate", data=path.read_bytes(), content_type="application/yaml"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["valid"] is True
    expected = [pointer for pointer, _ in PUBLISHED_WARNINGS.get(path.name, [])]
    assert [w["pointer"] for w in body.get("warnings", [])] == expected


@pytest.mark.parametrize("path", SCHEDULE_OR_WEBHOOK, ids=lambda p: p.name)
def test_published_schedule_and_webhook_triggers_are_made(alice_api: APIClient, path: Path) -> None:
    response = alice_api.post(
        "/api/workflows/", {"name": path.stem, "source": path.read_text()}, format="json"
    )
    assert response.status_code == 201, response.content
    workflow = Workflow.objects.get(owner__username="alice", name=path.stem)
    # A Schedule row per schedule trigger (its cron read), a Trigger row of kind webhook per
    # webhook trigger. Only firehydrant-rollback's image (relaysh/stdlib-trigger-json) passes
    # the body through; the other images' URLs refuse events (docs/workflows.md "Webhook triggers").
    assert sorted(s.name for s in workflow.schedules.all()) == sorted(declared(path, "schedule"))
    webhooks = Trigger.objects.filter(workflow=workflow, kind="webhook")
    assert sorted(t.name for t in webhooks) == sorted(declared(path, "webhook"))
    assert any(t.passes_through for t in webhooks) == (path.name == "firehydrant-rollback.yaml")


# What the two relaxed checks do when a run meets them (in-process: no worker; the engine's
# functions are called as its tasks would call them).


def test_a_call_the_function_refuses_fails_its_step_naming_the_function(alice_api: APIClient) -> None:
    # terraform-continuous-deployment's `git: !Fn.merge {…}`, on a step that can run here.
    source = (
        "apiVersion: v1\nparameters: {branch: {default: main}}\nsteps:\n"
        f"- name: plan\n  image: {NOOP}\n  spec:\n    git: !Fn.merge\n      name: plan\n"
        "      branch: !Parameter branch\n"
    )
    assert (
        alice_api.post("/api/workflows/", {"name": "merge", "source": source}, format="json").status_code
        == 201
    )
    response = alice_api.post("/api/workflows/merge/runs/", {"parameters": {}}, format="json")
    assert response.status_code == 201, response.content
    run = WorkflowRun.objects.get(pk=response.json()["id"])
    engine.start_run(run.pk)
    step = StepRun.objects.get(run=run, name="plan")
    engine.start_step(str(step.pk))
    step.refresh_from_db()
    run.refresh_from_db()
    assert step.status == "failure"
    assert step.message == (
        "Its spec refers to what is not there: function 'merge' (fn: arg \"objects\": fn: arg not found)."
    )
    assert (run.status, run.outcome) == ("complete", "failure")


def test_an_event_s_binding_of_an_undeclared_parameter_is_left_out_and_the_run_starts(
    alice, alice_api
) -> None:
    # datadog-to-slack's eventDate, on a push trigger (webhook triggers are helper trig's).
    source = (
        "apiVersion: v1\nparameters: {title: {}}\ntriggers:\n- name: report\n  source: {type: push}\n"
        "  binding:\n    parameters:\n      title: !Data host\n      date: !Data time\n"
        f"steps:\n- name: tell\n  image: {NOOP}\n"
    )
    created = alice_api.post("/api/workflows/", {"name": "bound", "source": source}, format="json")
    assert created.status_code == 201, created.content
    trigger = Trigger.objects.get(workflow__name="bound")
    event = Event.objects.create(
        trigger=trigger,
        state=EventState.MATCHED,
        body_format="json",
        body_sha256="0" * 64,
        body_size=2,
        data={"host": "web1", "time": "2026-01-01T00:00:00+00:00"},
        workflow_start=WorkflowStart.PENDING,
    )
    run = services.start_run_for_event(str(event.pk))
    assert run is not None
    run.refresh_from_db()
    assert run.parameters == {"title": "web1"}
    assert run.message == "" and run.status == "initializing"
