"""Budgets on runs (docs/security.md "Budgets"): how deep runs started by steps may go (RUN_MAX_DEPTH),
and how many runs one owner may have in progress (RUN_MAX_IN_PROGRESS), at each door that
starts runs: the API (429), the step runtime API (429, relay_sdk on a live server with the
step's real credential), and a schedule or webhook (the run fails at once, saying why)."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.utils import timezone
from relay_sdk import Interface

from tests.conftest import api_token_for, client_for
from tests.runtime_helpers import start_step
from tests.workflow_helpers import NOOP, make_workflow
from triggers.models import Event, EventState, Schedule, Trigger, WorkflowStart
from workflows import engine, services
from workflows.models import WorkflowRun

CHAIN = """
apiVersion: v1
steps:
- name: s
  image: relaysh/core:latest-python
"""
SCHEDULED = f"""
apiVersion: v1
triggers:
- name: often
  source: {{type: schedule, schedule: '* * * * *'}}
steps:
- name: s
  image: {NOOP}
"""

NOT_STARTED = (
    "Not started: its owner has the most runs in progress one owner may have, 1 (RUN_MAX_IN_PROGRESS);"
)


def assert_problem(response: requests.Response, status: int, code: str, *words: str) -> None:
    assert response.status_code == status, response.text[:500]
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"] == f"urn:relay:problem:{code}"
    for word in words:
        assert word in body["detail"]


@pytest.mark.django_db(transaction=True)
def test_runs_started_by_steps_go_at_most_run_max_depth_deep(alice, live_server, settings):
    settings.RUN_MAX_DEPTH = 2
    workflow = make_workflow(alice, CHAIN, "chain")
    run = engine.create_run(workflow, {}, created_by=alice)
    assert run.depth == 0 and run.parent_step is None
    for depth in (1, 2):
        held = start_step(run, "s", base=live_server.url)
        started = Interface(api_url=held.url).workflows.run("chain", {})
        assert started.name == "chain"
        run = WorkflowRun.objects.get(parent_step=held.step)
        assert run.depth == depth
    held = start_step(run, "s", base=live_server.url)
    with pytest.raises(requests.HTTPError) as caught:
        Interface(api_url=held.url).workflows.run("chain", {})
    assert_problem(caught.value.response, 429, "run_budget_exceeded", "at most 2 runs deep", "RUN_MAX_DEPTH")
    assert WorkflowRun.objects.count() == 3
    assert sorted(WorkflowRun.objects.values_list("depth", flat=True)) == [0, 1, 2]


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_429_past_the_owners_runs_in_progress(alice, bob, settings):
    settings.RUN_MAX_IN_PROGRESS = 2
    make_workflow(alice, CHAIN, "chain")
    make_workflow(bob, CHAIN, "chain")
    api = client_for(alice)
    assert api.post("/api/workflows/chain/runs/", {}, format="json").status_code == 201
    assert api.post("/api/workflows/chain/runs/", {}, format="json").status_code == 201
    response = api.post("/api/workflows/chain/runs/", {}, format="json")
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:relay:problem:runs_in_progress_exceeded"
    assert body["detail"] == (
        "Its owner has the most runs in progress one owner may have, 2 (RUN_MAX_IN_PROGRESS); "
        "start it again when some have ended."
    )
    assert WorkflowRun.objects.filter(workflow__owner=alice).count() == 2

    # Another owner's runs are theirs to count.
    assert client_for(bob).post("/api/workflows/chain/runs/", {}, format="json").status_code == 201
    # A run that ended makes room.
    engine.cancel_run(WorkflowRun.objects.filter(workflow__owner=alice).first())
    assert api.post("/api/workflows/chain/runs/", {}, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_runs_started_at_once_never_pass_the_owners_budget_together(alice, live_server, settings):
    settings.RUN_MAX_IN_PROGRESS = 3
    make_workflow(alice, CHAIN, "chain")
    headers = {"Authorization": f"Token {api_token_for(alice)}"}

    def start(_: int) -> int:
        url = f"{live_server.url}/api/workflows/chain/runs/"
        return requests.post(url, json={}, headers=headers, timeout=60).status_code

    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(start, range(10)))
    assert codes.count(201) == 3 and codes.count(429) == 7, codes
    assert WorkflowRun.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_step_is_answered_429_past_its_owners_runs_in_progress(alice, live_server, settings):
    settings.RUN_MAX_IN_PROGRESS = 2
    workflow = make_workflow(alice, CHAIN, "chain")
    held = start_step(engine.create_run(workflow, {}, created_by=alice), "s", base=live_server.url)
    relay = Interface(api_url=held.url)
    relay.workflows.run("chain", {})
    with pytest.raises(requests.HTTPError) as caught:
        relay.workflows.run("chain", {})
    assert_problem(caught.value.response, 429, "run_budget_exceeded", "RUN_MAX_IN_PROGRESS")
    assert WorkflowRun.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_run_past_the_owners_budget_fails_at_once_saying_why(alice, settings):
    settings.RUN_MAX_IN_PROGRESS = 1
    make_workflow(alice, CHAIN, "chain")
    engine.create_run(alice.workflows.get(name="chain"), {}, created_by=alice)
    make_workflow(alice, SCHEDULED, "often")
    now = timezone.now()
    Schedule.objects.update(next_due=now - timedelta(seconds=1))
    run = services.start_scheduled_run(Schedule.objects.get().pk, now)
    assert run is not None
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("complete", "failure")
    assert run.message.startswith(
        "Not started: its owner has the most runs in progress one owner may have, 1 "
    )
    assert set(run.steps.values_list("status", flat=True)) == {"skipped"}
    # It is on record, and counts for nothing: the owner's one run in progress is still one.
    assert engine.runs_in_progress(alice.pk) == 1


@pytest.mark.django_db(transaction=True)
def test_a_webhooks_run_past_the_owners_budget_fails_at_once_saying_why(alice, settings):
    settings.RUN_MAX_IN_PROGRESS = 1
    source = (
        "apiVersion: v1\ntriggers:\n- name: hook\n"
        "  source: {type: webhook, image: relaysh/stdlib-trigger-json}\n"
        f"steps:\n- name: s\n  image: {NOOP}\n"
    )
    workflow = make_workflow(alice, source, "hooked")
    engine.create_run(workflow, {}, created_by=alice)
    event = Event.objects.create(
        trigger=Trigger.objects.get(workflow=workflow),
        state=EventState.MATCHED,
        body_format="json",
        body_sha256="0" * 64,
        body_size=2,
        data={},
        workflow_start=WorkflowStart.PENDING,
    )
    run = services.start_run_for_event(str(event.pk))
    assert run is not None
    run.refresh_from_db()
    assert (run.status, run.outcome, run.event_id) == ("complete", "failure", event.pk)
    assert run.message.startswith(
        "Not started: its owner has the most runs in progress one owner may have, 1 "
    )
    event.refresh_from_db()
    assert event.workflow_start == WorkflowStart.STARTED


@pytest.mark.django_db(transaction=True)
def test_run_listings_leave_outputs_to_each_runs_own_page(alice, live_server):
    workflow = make_workflow(alice, CHAIN, "chain")
    runs = [engine.create_run(workflow, {}, created_by=alice) for _ in range(3)]
    big = "o" * (1024 * 1024)
    for run in runs:
        held = start_step(run, "s", base=live_server.url)
        relay = Interface(api_url=held.url)
        relay.outputs.set("big", big)
        relay.decorators.set_link("pr", "The pull request", "https://example.com/pr/7")
    headers = {"Authorization": f"Token {api_token_for(alice)}"}

    listing = requests.get(f"{live_server.url}/api/workflow-runs/", headers=headers, timeout=60)
    assert listing.status_code == 200
    assert len(listing.content) < 10_000
    listed = listing.json()["results"]
    assert len(listed) == 3
    for run in listed:
        (step,) = run["steps"]
        assert step["name"] == "s" and step["status"] == "in-progress"
        assert "outputs" not in step and "decorators" not in step

    detail = requests.get(f"{live_server.url}/api/workflow-runs/{runs[0].pk}/", headers=headers, timeout=60)
    (step,) = detail.json()["steps"]
    # The step still runs: what it set shows masked until it has ended (it may yet mark the
    # output sensitive), but the detail carries it.
    assert step["outputs"] == {"big": "***"}
    assert step["decorators"]["pr"]["uri"] == "https://example.com/pr/7"
