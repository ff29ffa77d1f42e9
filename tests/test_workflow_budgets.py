"""Expressions have budgets (steps, characters, the largest value), spent as values are
built; numbers too large for a float64 never raise out of the engine. On the dialect itself,
on a live server (validate, save, run start, the step runtime's /spec) and on real Celery
workers (a step's `when` and spec at run time)."""

import gc
import time
from datetime import timedelta

import pytest
import requests
from django.contrib.auth.models import User
from django.utils import timezone

from tests.conftest import api_token_for
from tests.runtime_helpers import start_step
from tests.workflow_helpers import NOOP, ended, finished, make_workflow, run_of, steps_of, vault_worker
from triggers.models import Event, Schedule, Trigger
from workflows import services, tasks
from workflows.dialect.budget import BudgetExceeded, exceeded
from workflows.dialect.errors import EvaluationError
from workflows.dialect.evaluate import Data, evaluate
from workflows.dialect.validate import validate
from workflows.models import WorkflowRevision, WorkflowRun

# The issue's document: 413 bytes that took 4.2 s and 290 MB to validate (each level of
# jsonMarshal doubles the string of quotes and backslashes).
NESTED = "jsonMarshal(" * 24 + "'\"'" + ")" * 24


def document(spec_value: str, parameters: str = "") -> str:
    return f"apiVersion: v1\n{parameters}steps:\n- name: a\n  image: {NOOP}\n  spec:\n    x: {spec_value}\n"


def quoted(expression: str) -> str:
    return "'${" + expression.replace("'", "''") + "}'"


def timed(work, *args):
    started = time.monotonic()
    try:
        value = work(*args)
    except Exception as exc:
        value = exc
    return value, time.monotonic() - started


# The dialect -----------------------------------------------------------------------------------

DOUBLING = {
    "jsonMarshal of jsonMarshal": NESTED,
    "concat in a pipe": "'ab' " + "|> concat($, $) " * 40,
    "+ in a pipe": "'ab' " + "|> $ + $ " * 40,
    "a list shared, then walked": "'ab' " + "|> [$, $] " * 40,
    "a map shared, then walked": "{'a': 'b'} " + "|> {'x': $, 'y': $} " * 40,
    "a shared list marshalled": "'ab' " + "|> [$, $] " * 40 + "|> jsonMarshal($)",
    "a shared list compared": "('ab' " + "|> [$, $] " * 40 + ") == ('ab' " + "|> [$, $] " * 40 + ")",
    "a shared list as text": "('ab' " + "|> [$, $] " * 40 + ") + 'x'",
    "a shared list matched": "('ab' " + "|> [$, $] " * 40 + ") =~ 'x'",
    "a shared list negated": "-('ab' " + "|> [$, $] " * 40 + ")",
    "merge copies": "{'a': 'b'} " + "|> merge({'x': $, 'y': $}) " * 40,
    "append": "[1] " + "|> append($, $) " * 40,
    "markdown": "'[' " + "|> concat($, $) " * 20 + "|> convertMarkdown('html', $)",
}


@pytest.mark.parametrize("expression", DOUBLING.values(), ids=DOUBLING.keys())
def test_a_value_that_doubles_stops_at_the_budget(expression):
    error, seconds = timed(evaluate, "${" + expression + "}")
    assert isinstance(error, EvaluationError) and exceeded(error) is not None, error
    assert seconds < 10  # the default budget: about a second of work on a quiet machine, never more


def test_the_largest_value_is_refused_before_it_is_built():
    # 20 levels make 3 MiB of text, the 21st would make 6 MiB: it is never built.
    assert len(evaluate("${" + "jsonMarshal(" * 20 + "'\"'" + ")" * 20 + "}").value) == 3_145_726
    error, _ = timed(evaluate, "${" + "jsonMarshal(" * 21 + "'\"'" + ")" * 21 + "}")
    assert isinstance(exceeded(error), BudgetExceeded)
    assert str(exceeded(error)) == (
        "a value would be over 4,194,304 characters (the largest an evaluation may build)"
    )


def test_the_budget_is_settable(settings):
    settings.EXPRESSION_MAX_STEPS = 1000
    error, _ = timed(
        evaluate,
        "${'ab' |> [$, $] |> [$, $] |> [$, $] |> [$, $] |> [$, $] |> [$, $]"
        " |> [$, $] |> [$, $] |> [$, $] |> [$, $]}",
    )
    assert (
        str(exceeded(error))
        == "the expression takes more than 1,000 steps to evaluate (the evaluation budget)"
    )
    settings.EXPRESSION_MAX_STEPS = 100_000
    assert len(evaluate("${'ab' |> [$, $] |> [$, $] |> [$, $] |> [$, $] |> [$, $]}").value) == 2


def test_what_fits_the_budget_evaluates_as_before():
    big = "x" * (1024 * 1024)
    data = Data(parameters={"big": big, "items": list(range(50_000))})
    assert evaluate("${jsonMarshal(parameters.big)}", data).value == f'"{big}"'
    assert evaluate("${concat(parameters.big, parameters.big)}", data).value == big * 2
    assert evaluate("${parameters.items}", data).value == list(range(50_000))
    assert evaluate("${parameters.items == parameters.items}", data).value is True


@pytest.mark.parametrize("number", [10**400, -(10**400)])
def test_a_number_too_large_for_a_float_is_an_evaluation_error(number):
    data = Data(parameters={"n": number})
    for expression in (
        "${parameters.n > 1}",
        "${parameters.n + 1}",
        "${-parameters.n}",
        "${parameters.n == 1}",
    ):
        with pytest.raises(EvaluationError, match=r"\(401 digits\) is too large for a float64"):
            evaluate(expression, data)
    # Where no arithmetic is asked for, the number is data like any other.
    assert evaluate("${parameters.n}", data).value == number


# Validating and saving ---------------------------------------------------------------------


def test_a_document_of_many_bombs_names_each_and_stays_quick():
    bombs = "".join(
        f"    x{i}: {quoted(NESTED.replace(chr(34), chr(34) * (i % 5 + 1)))}\n" for i in range(200)
    )
    text = f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n  spec:\n{bombs}"
    result, seconds = timed(validate, text)
    assert [p.pointer for p in result.problems] == [f"#/steps/0/spec/x{i}" for i in range(200)]
    assert all(
        p.detail.startswith("This expression is over the evaluation budget: ") for p in result.problems
    )
    assert seconds < 5


def test_what_a_validation_made_is_freed_without_the_cycle_collector():
    """A document's validation leaves no cycles behind: before, the cycle check's recursive
    closure held the checker (every parsed template), and a dry run over the budget kept its
    error, whose traceback held every frame and value the evaluation built, until the
    collector ran (800,000 objects for a 1 MiB document, 0.3 s of collection)."""
    shapes = [f"    y{i}: ${{concat('a', toString({i}))}}\n" for i in range(50)]
    shapes += [f"    x{i}: {quoted(f'{i} ' + '|> [$, $] ' * 40)}\n" for i in range(3)]
    text = f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n  spec:\n{''.join(shapes)}"
    gc.collect()
    gc.disable()
    try:
        result = validate(text)
        assert not gc.isenabled()  # validation leaves the collector as it found it
        left = gc.collect()
    finally:
        gc.enable()
    assert [p.pointer for p in result.problems] == [f"#/steps/0/spec/x{i}" for i in range(3)]
    assert left < 100, f"{left} objects were left in cycles"
    validate(text)
    assert gc.isenabled()


def test_a_pipe_s_input_is_not_data_so_its_expression_is_checked():
    result = validate(document(quoted("'ab' " + "|> concat($, $) " * 40)))
    assert [(p.pointer, p.detail) for p in result.problems] == [
        (
            "#/steps/0/spec/x",
            "This expression is over the evaluation budget: the document's constant expressions, "
            "together, builds more than 16,777,216 characters in all (the evaluation budget).",
        )
    ]


@pytest.fixture
def api(live_server, alice):
    session = requests.Session()
    session.headers["Authorization"] = f"Token {api_token_for(alice)}"
    session.base_url = live_server.url  # type: ignore[attr-defined]
    yield session
    session.close()


@pytest.mark.django_db(transaction=True)
def test_the_issue_s_document_is_a_400_at_its_pointer_on_validate_and_save(api):
    text = document(quoted(NESTED))
    assert len(text.encode()) < 450
    # CPU time of this process, which serves the request in a thread: the machine's load
    # (the tests share it) changes it much less than the wall clock.
    started = time.process_time()
    response = api.post(
        f"{api.base_url}/api/workflows/validate", data=text, headers={"Content-Type": "application/yaml"}
    )
    assert time.process_time() - started < 1
    assert response.status_code == 400 and response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["errors"] == [
        {
            "pointer": "#/steps/0/spec/x",
            "line": 6,
            "column": 8,
            "detail": "This expression is over the evaluation budget: a value would be over 4,194,304 "
            "characters (the largest an evaluation may build).",
        }
    ]
    saved = api.post(f"{api.base_url}/api/workflows/", json={"name": "bomb", "source": text})
    assert saved.status_code == 400, saved.text
    assert [e["pointer"] for e in saved.json()["errors"]] == ["#/steps/0/spec/x"]


# The API's JSON reader (relay.api.parsers.read_json) refuses these, 1e400 too, at their
# pointer before any serializer sees them.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("value", "pointer"),
    [
        ("1" + "0" * 400, "#/parameters/n"),
        ("-" + "9" * 309, "#/parameters/n"),
        ("1e400", "#/parameters/n"),
        ('{"deep": [1, ' + "2" * 400 + "]}", "#/parameters/n/deep/1"),
    ],
)
def test_a_run_start_refuses_a_number_too_large_for_a_float(api, alice, value, pointer):
    body = '{"parameters": {"n": ' + value + "}}"
    make_workflow(alice, document("${parameters.n}", "parameters:\n  n: {}\n"), name="numbers")
    response = api.post(
        f"{api.base_url}/api/workflows/numbers/runs/", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    errors = response.json()["errors"]
    assert [e["pointer"] for e in errors] == [pointer], errors
    assert "too large for a float64" in errors[0]["detail"]
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_run_of_a_revision_that_is_not_valid_any_more_is_a_409(api, alice):
    workflow = make_workflow(alice, document("plain"), name="old")
    WorkflowRevision.objects.filter(workflow=workflow).update(source=document(quoted(NESTED)))
    response = api.post(f"{api.base_url}/api/workflows/old/runs/", json={})
    assert response.status_code == 409, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["detail"].startswith("The workflow's newest revision is not valid any more: ")
    assert not WorkflowRun.objects.exists()


# The step runtime API ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_spec_answers_a_budget_exceeded_with_a_422_problem(live_server, alice):
    # The quote comes from a parameter: the expression reads data, so no dry run judged it.
    source = document(
        quoted(f"parameters.q |> {NESTED.replace(chr(39) + chr(34) + chr(39), '$')}"),
        "parameters:\n  q: {default: '\"'}\n",
    )
    assert validate(source).valid
    held = start_step(run_of(alice, source), "a", base=live_server.url)
    started = time.monotonic()
    response = requests.get(f"{held.url}/spec", timeout=30)
    assert time.monotonic() - started < 5
    assert response.status_code == 422, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:relay:problem:expression_evaluation_error"
    assert body["detail"].endswith(
        "a value would be over 4,194,304 characters (the largest an evaluation may build)"
    )


# The engine, on real workers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, bao, tmp_path_factory):
    with vault_worker(django_db_blocker, bao, tmp_path_factory.mktemp("budgets") / "worker.log") as process:
        yield process


@pytest.fixture
def owner(transactional_db) -> User:
    return User.objects.create_user("ops")


def test_a_huge_number_in_a_when_fails_the_step_instead_of_raising_for_ever(worker, owner):
    source = (
        f"apiVersion: v1\nparameters:\n  n: {{}}\nsteps:\n"
        f"- name: first\n  image: {NOOP}\n  spec: {{sleep: 1}}\n"
        f"- name: second\n  image: {NOOP}\n  dependsOn: first\n  when: ${{parameters.n > 1}}\n"
    )
    run = run_of(owner, source, {"n": 1})
    # A number the door refuses now, as a run stored before, or any other way in, holds it.
    WorkflowRun.objects.filter(pk=run.pk).update(parameters={"n": 10**400})
    run = finished(run, timeout=30)
    second = steps_of(run)["second"]
    assert second.status == "failure"
    assert second.message.startswith("The step cannot be decided: its `when` failed: ")
    assert "(401 digits) is too large for a float64" in second.message
    assert (run.outcome, run.message) == ("failure", "Failed: second.")
    assert "OverflowError" not in worker.log()


def test_a_spec_over_the_budget_fails_its_step_with_the_reason(worker, owner):
    source = document(
        quoted(f"parameters.q |> {NESTED.replace(chr(39) + chr(34) + chr(39), '$')}"),
        "parameters:\n  q: {default: '\"'}\n",
    )
    run = finished(run_of(owner, source), timeout=30)
    step = steps_of(run)["a"]
    assert step.status == "failure"
    assert step.message.startswith("Its spec could not be evaluated: ")
    assert step.message.endswith(
        "a value would be over 4,194,304 characters (the largest an evaluation may build)"
    )
    assert run.outcome == "failure"


def test_a_revision_that_is_not_valid_any_more_ends_its_run(worker, owner):
    workflow = make_workflow(owner, f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n")
    # As if saved under older rules: its text now fails validation (the budget).
    WorkflowRevision.objects.filter(workflow=workflow).update(source=document(quoted(NESTED)))
    run = WorkflowRun.objects.create(workflow=workflow, revision=workflow.latest_revision(), created_by=owner)
    run.steps.create(index=0, name="a", kind="container", image=NOOP)
    tasks.start_run.delay(str(run.pk))
    run = finished(run, timeout=30)
    step = steps_of(run)["a"]
    assert step.status == "skipped"
    assert step.message.startswith("Skipped: its workflow's revision is not valid any more: ")
    assert "over the evaluation budget" in step.message


HOOKED = f"""\
apiVersion: v1
parameters:
  n: {{}}
triggers:
- name: hook
  source:
    type: webhook
    image: relaysh/stdlib-trigger-json
  when: ${{event.m > 1}}
  binding:
    parameters:
      n: ${{event.n * 1e300}}
steps:
- name: a
  image: {NOOP}
"""


def matched_event(workflow, data: dict) -> str:
    """An event of the workflow's trigger, read and matched, its run not started yet: as the
    worker leaves it (a push report read from YAML can hold such numbers)."""
    event = Event.objects.create(
        trigger=Trigger.objects.get(workflow=workflow),
        state="matched",
        body_format="json",
        body_sha256="0" * 64,
        body_size=1,
        data=data,
        workflow_start="pending",
    )
    tasks.start_run_for_event.delay(str(event.pk))
    return str(event.pk)


def test_an_event_s_huge_number_is_no_run_or_a_failed_one_never_a_retry(worker, owner):
    workflow = make_workflow(owner, HOOKED, name="hooked")
    # `when` cannot be decided: the event is skipped, saying why.
    skipped = ended(matched_event(workflow, {"m": 10**400, "n": 1}))
    assert skipped.workflow_start == "skipped"
    assert skipped.filter_note.startswith("The trigger's `when` could not be decided: ")
    assert "(401 digits) is too large for a float64" in skipped.filter_note
    # A binding whose value is not finite: the run is made, and fails at once, saying why.
    started = ended(matched_event(workflow, {"m": 2, "n": 1e10}))
    run = finished(WorkflowRun.objects.get(event_id=started.pk))
    assert (started.workflow_start, run.outcome) == ("started", "failure")
    assert run.message == (
        "Missing required parameters: n. The trigger's binding of 'n' failed: its value cannot be "
        "a parameter: the number +Inf is not finite."
    )


def test_a_schedule_of_a_revision_that_is_not_valid_any_more_notes_why_and_moves_on(owner):
    workflow = make_workflow(
        owner,
        "apiVersion: v1\ntriggers:\n- name: often\n  source: {type: schedule, schedule: '* * * * *'}\n"
        f"steps:\n- name: a\n  image: {NOOP}\n",
    )
    WorkflowRevision.objects.filter(workflow=workflow).update(source=document(quoted(NESTED)))
    schedule = Schedule.objects.get(workflow=workflow)
    now = timezone.now()
    Schedule.objects.filter(pk=schedule.pk).update(next_due=now - timedelta(minutes=1))
    assert services.start_scheduled_run(schedule.pk, now) is None
    schedule.refresh_from_db()
    assert schedule.last_note.startswith("The workflow's newest revision is not valid any more: ")
    assert schedule.next_due > now  # the next tick does not try this slot again
    assert not WorkflowRun.objects.exists()
