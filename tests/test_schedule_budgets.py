"""Schedule triggers' budgets (docs/security.md "Budgets"): per workflow document and per owner, a 400
at the trigger past them on validate and save; and a tick fair between owners, so that one
owner's many schedules due at once cannot hold it for everyone."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from tests.conftest import client_for, run_concurrently
from tests.workflow_helpers import NOOP, make_workflow
from triggers.models import Schedule
from workflows import engine, services
from workflows.admin import WorkflowForm
from workflows.models import Workflow, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def with_schedules(count: int, prefix: str = "s") -> str:
    triggers = "".join(
        f"- name: {prefix}{index}\n  source: {{type: schedule, schedule: '* * * * *'}}\n"
        for index in range(count)
    )
    return f"apiVersion: v1\ntriggers:\n{triggers}steps:\n- name: a\n  image: {NOOP}\n"


def assert_invalid_at(response, pointer: str, *words: str) -> None:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    (error,) = response.json()["errors"]
    assert error["pointer"] == pointer and error["line"] is not None
    for word in words:
        assert word in error["detail"]


def test_a_document_has_at_most_schedules_per_workflow(alice, settings):
    settings.SCHEDULES_PER_WORKFLOW = 20
    api = client_for(alice)
    validate = api.post("/api/workflows/validate", with_schedules(21), content_type="application/yaml")
    assert_invalid_at(validate, "#/triggers/20", "at most 20 schedule triggers", "SCHEDULES_PER_WORKFLOW")
    created = api.post("/api/workflows/", {"name": "many", "source": with_schedules(21)}, format="json")
    assert_invalid_at(created, "#/triggers/20", "SCHEDULES_PER_WORKFLOW")
    assert not Workflow.objects.exists() and not Schedule.objects.exists()

    ok = api.post("/api/workflows/", {"name": "many", "source": with_schedules(20)}, format="json")
    assert ok.status_code == 201, ok.content
    assert Schedule.objects.count() == 20
    # A budget lowered later stops no run of a revision saved before it.
    settings.SCHEDULES_PER_WORKFLOW = 5
    engine.parsed.clear()
    run = engine.create_run(Workflow.objects.get(), {}, created_by=alice)
    assert run.status == "initializing"


def test_an_owner_has_at_most_schedules_per_owner(alice, bob, settings):
    settings.SCHEDULES_PER_OWNER = 30
    api = client_for(alice)
    first = api.post("/api/workflows/", {"name": "first", "source": with_schedules(20)}, format="json")
    assert first.status_code == 201
    second = api.post("/api/workflows/", {"name": "second", "source": with_schedules(15)}, format="json")
    assert_invalid_at(second, "#/triggers/10", "at most 30 schedule triggers", "SCHEDULES_PER_OWNER", "35")
    assert not Workflow.objects.filter(name="second").exists()
    assert Schedule.objects.count() == 20

    second = api.post("/api/workflows/", {"name": "second", "source": with_schedules(10)}, format="json")
    assert second.status_code == 201
    more = api.put("/api/workflows/second/", {"source": with_schedules(11)}, format="json")
    assert_invalid_at(more, "#/triggers/10", "SCHEDULES_PER_OWNER")
    assert Schedule.objects.filter(workflow__name="second").count() == 10
    # Another owner's budget is their own.
    theirs = client_for(bob).post(
        "/api/workflows/", {"name": "b", "source": with_schedules(20)}, format="json"
    )
    assert theirs.status_code == 201

    # An owner past a budget lowered later may still save documents that add no schedule.
    settings.SCHEDULES_PER_OWNER = 10
    same = api.put("/api/workflows/first/", {"source": with_schedules(20) + "# edited\n"}, format="json")
    assert same.status_code == 200, same.content
    fewer = api.put("/api/workflows/first/", {"source": with_schedules(12)}, format="json")
    assert fewer.status_code == 200
    renamed = api.put("/api/workflows/first/", {"source": with_schedules(1, prefix="new")}, format="json")
    assert_invalid_at(renamed, "#/triggers/0", "SCHEDULES_PER_OWNER")


def test_the_admin_form_says_the_owners_schedule_budget(alice, settings):
    settings.SCHEDULES_PER_OWNER = 5
    make_workflow(alice, with_schedules(5), "first")
    form = WorkflowForm(
        data={"owner": alice.pk, "name": "second", "description": "", "source": with_schedules(1)}
    )
    assert not form.is_valid()
    assert "SCHEDULES_PER_OWNER" in form.errors["source"][0] and "#/triggers/0" in form.errors["source"][0]


def test_the_tick_is_fair_between_owners(alice, bob, settings):
    settings.SCHEDULES_PER_WORKFLOW = 50
    settings.SCHEDULES_PER_OWNER = 50
    settings.SCHEDULES_PER_TICK = 10
    settings.SCHEDULES_PER_OWNER_PER_TICK = 4
    carol = User.objects.create_user("carol")
    make_workflow(alice, with_schedules(30), "busy")
    make_workflow(bob, with_schedules(1), "one")
    make_workflow(carol, with_schedules(2), "two")
    now = timezone.now()
    # Alice's thirty have waited longest; bob's and carol's came due after all of them.
    for index, schedule in enumerate(Schedule.objects.filter(workflow__owner=alice).order_by("name")):
        Schedule.objects.filter(pk=schedule.pk).update(next_due=now - timedelta(minutes=10, seconds=index))
    Schedule.objects.exclude(workflow__owner=alice).update(next_due=now - timedelta(seconds=1))

    def started(user: User) -> int:
        return WorkflowRun.objects.filter(workflow__owner=user).count()

    assert services.start_due_schedules(now) == 7
    assert (started(alice), started(bob), started(carol)) == (4, 1, 2)
    # Alice's oldest went first.
    oldest = Schedule.objects.filter(workflow__owner=alice).order_by("-name")[:4]
    assert all(s.last_due is not None for s in oldest)

    assert services.start_due_schedules(now) == 4
    assert services.start_due_schedules(now) == 4
    assert started(alice) == 12


def test_owners_take_turns_within_a_tick(alice, bob, settings):
    settings.SCHEDULES_PER_TICK = 6
    settings.SCHEDULES_PER_OWNER_PER_TICK = 10
    make_workflow(alice, with_schedules(10), "busy")
    make_workflow(bob, with_schedules(10), "also")
    now = timezone.now()
    Schedule.objects.filter(workflow__owner=alice).update(next_due=now - timedelta(minutes=5))
    Schedule.objects.filter(workflow__owner=bob).update(next_due=now - timedelta(minutes=1))
    assert services.start_due_schedules(now) == 6
    # Turns: each owner's first, then each owner's second…: three each, although all of
    # alice's were due before any of bob's.
    assert WorkflowRun.objects.filter(workflow__owner=alice).count() == 3
    assert WorkflowRun.objects.filter(workflow__owner=bob).count() == 3


def test_an_owner_saving_many_workflows_at_once_is_counted_in_turn(alice, settings):
    # The owner's row lock must not wait on the owner's own foreign keys (a revision's
    # created_by, a trigger's owner): saves at once all end, none past the budget.
    settings.SCHEDULES_PER_OWNER = 12
    api = client_for(alice)

    def create(index: int) -> int:
        body = {"name": f"w{index}", "source": with_schedules(3)}
        return api.post("/api/workflows/", body, format="json").status_code

    codes = run_concurrently(8, create)
    assert sorted(codes) == [201] * 4 + [400] * 4, codes
    assert Schedule.objects.count() == 12


def test_runs_and_saves_of_one_owner_at_once_all_end(alice, settings):
    make_workflow(alice, with_schedules(1), "base")
    api = client_for(alice)

    def work(index: int) -> int:
        if index % 2:
            return api.post("/api/workflows/base/runs/", {}, format="json").status_code
        body = {"name": f"w{index}", "source": with_schedules(1)}
        return api.post("/api/workflows/", body, format="json").status_code

    assert run_concurrently(8, work) == [201] * 8
