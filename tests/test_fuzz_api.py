"""A schema-driven fuzz run (schemathesis) of every operation in the OpenAPI schema at
/api/schema/, and of the step runtime API (described for the fuzz in
tests/stepruntime_openapi.yaml: the service's schema leaves it out), against the live test
server on PostgreSQL, authenticated as each operation's security says (a user's token, a
connection's, a push or webhook trigger's own, the credential of a step in progress): no
answer is a 5xx, and every 4xx is an RFC 9457 problem document.

Path ids are swapped for real ones (valid UUIDs only; anything else is left for the 404
path), so the operations go past the lookup: each case that names a run gets a fresh one, in
turn pending, accepted and in progress, and a deleted connection or trigger is made again.
Besides what the schemas describe, values that have broken web services go in: hostile
strings and integers (a NUL, digits past 64 bits, a number past a float64), and request
bodies that hold what PostgreSQL cannot keep (a lone surrogate, a NUL in a key, 400 digits,
70 levels of nesting) as explicit examples of the bodies that are kept.

The size of the run (CASES_PER_OPERATION, RUNTIME_CASES_PER_OPERATION) keeps it near three
minutes on 2 cores; docs/getting-started.md states the number of cases."""

import base64
import copy
import itertools
import json
import re
import uuid
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, settings
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from puppet_connection.models import PuppetConnection
from relay.api.pagination import LimitOffsetPagination
from runs.models import Run
from stepruntime.models import StepLog
from tests.conftest import api_token_for, bridge
from tests.events_helpers import fixture, post
from tests.runs_helpers import RUNS, accept, create_run, put_state
from tests.runtime_helpers import Running, running, start_step
from tests.test_connection_api import assert_problem
from triggers import services
from triggers.models import Event, Trigger
from workflows import engine
from workflows.models import StepRun, StepStatus, Workflow, WorkflowSecret

CASES_PER_OPERATION = 30
RUNTIME_CASES_PER_OPERATION = 20
# NUL (PostgreSQL refuses it in text and JSON), digits that are not ASCII, numbers past 64
# bits, markup, a path, an empty and a blank value.
HOSTILE_STRINGS = [
    "\x00",
    "a\x00b",
    "\\u0000",
    "²",
    "٣",
    "99999999999999999999999",
    "-1",
    "",
    " ",
    "<!channel>",
    "../../etc/passwd",
    "%00",
    "\u202e",
]
HOSTILE_INTEGERS = [2**63, -(2**63) - 1, 10**23, 10**400, -1, 0]
HOSTILE_NUMBERS = [10**400, -(10**400), 1.7976931348623157e308, 5e-324, -0.0]
# JSON values a body may hold that Python's json reads but PostgreSQL or the engine cannot
# keep (a lone surrogate is sent as its `\ud800` escape).
HOSTILE_VALUES = [
    "\ud800",
    {"\udc00": 1},
    {"a\x00b": "c"},
    ["\x00"],
    -(10**400),
    {"deep": json.loads("[" * 70 + "]" * 70)},
]
REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")
# The step the step runtime API's fuzz runs as: a spec with a parameter, a secret, a query to
# evaluate, an env and a `when`; and the workflow whose webhook URL is fuzzed.
RUNTIME_WORKFLOW = """\
apiVersion: v1
parameters:
  who: {default: world}
steps:
- name: a
  image: relaysh/core
  spec:
    greeting: !Fn.concat ["hello ", !Parameter who]
    token: !Secret apiToken
    nested: {list: [1, 2.5, "three", true, null], deep: {x: "${parameters.who}"}}
  env:
    WHO: !Parameter who
  when: ${parameters.who != "nobody"}
"""
HOOKED_WORKFLOW = """\
apiVersion: v1
parameters:
  message: {default: hello}
triggers:
- name: hook
  source: {type: webhook, image: relaysh/stdlib-trigger-json}
  binding:
    parameters:
      message: !Data message
steps:
- name: echo
  image: relay-internal/noop
"""
# A path parameter that names something (no control character, no `/`): aimed at a real one.
PLAIN_NAME = re.compile(r"[\w.-]{1,64}", re.ASCII)


class Target:
    """The live objects the fuzz aims at, made again whenever a case has deleted them."""

    def __init__(self, owner: User) -> None:
        self.owner = owner
        self.user_token = api_token_for(owner)
        self.connection, token = PuppetConnection.create_with_token(owner=owner, name="fuzz")
        self.connection_token = str(token)
        # A pending run at all times: a long-poll (`wait`) then answers at once.
        Run.create_for(self.connection, {"scope": {"nodes": ["standing.example.com"]}})
        self.trigger, token = Trigger.create_with_token(owner=owner, name="fuzz-events")
        self.trigger_token = str(token)
        event_id = post(self.trigger_token, REPORT).json()["id"]
        services.process(event_id)
        self.event = Event.objects.get(pk=event_id)
        self.victims: dict[type, Any] = {}
        self.states = itertools.cycle(["pending", "accepted", "in-progress"])

    def victim(self, model: type) -> Any:
        """The connection or trigger that the CRUD operations may change, rename or delete."""
        current = self.victims.get(model)
        if current is None or not model.objects.filter(pk=current.pk).exists():
            current, _ = model.create_with_token(owner=self.owner, name=f"victim-{uuid.uuid4().hex[:8]}")
            self.victims[model] = current
        return current

    def fresh_run(self) -> Run:
        run = Run.create_for(self.connection, {"scope": {"nodes": ["node-a.example.com"]}})
        state = next(self.states)
        if state != "pending":
            run.accept(None, "fuzz")
        if state == "in-progress":
            Run.update_state_of(
                self.connection,
                run.pk,
                {"status": "in-progress", "next_update_before": timezone.now() + timedelta(minutes=5)},
                "fuzz",
            )
        return run

    @cached_property
    def webhook(self) -> tuple[Trigger, str]:
        """A workflow's webhook trigger, and its token."""
        hooked = Workflow.objects.create(owner=self.owner, name="fuzz-hooked")
        [made] = hooked.add_revision(HOOKED_WORKFLOW, self.owner).new_triggers
        return Trigger.objects.get(workflow=hooked, name="hook"), str(made.token)

    def aim(self, case: schemathesis.Case) -> None:
        """Swap each well-formed id in the path for a real one."""
        params = case.path_parameters or {}
        path = case.operation.path

        def real(name: str, value: object) -> None:
            real_uuid(params, name, value)

        if path.startswith("/api/webhooks/"):
            real("trigger_id", self.webhook[0].pk)
        elif path.startswith("/_puppet/runs/"):
            real("id", self.fresh_run().pk)
        elif path.startswith("/api/connections/puppet/{id}"):
            real("id", self.victim(PuppetConnection).pk)
        elif path.startswith("/api/triggers/{trigger_pk}"):
            real("trigger_pk", self.trigger.pk)
            real("id", self.event.pk)
        elif path.startswith("/api/triggers/{id}"):
            real("id", self.victim(Trigger).pk)

    def auth(self, case: schemathesis.Case) -> dict[str, str]:
        path = case.operation.path
        if path.startswith("/_puppet/"):
            return {"Authorization": f"Bearer {self.connection_token}"}
        if path == "/api/events":
            return {"Authorization": f"Bearer {self.trigger_token}"}
        if path.startswith("/api/webhooks/"):
            return {"Authorization": f"Bearer {self.webhook[1]}"}
        return {"Authorization": f"Token {self.user_token}"}


def real_uuid(params: dict[str, Any], name: str, value: object) -> None:
    try:
        uuid.UUID(str(params[name]))
    except (KeyError, ValueError):
        return  # malformed: left for the 404 path
    params[name] = str(value)


class StepTarget:
    """The step in progress whose credential the step runtime API's fuzz carries."""

    def __init__(self, owner: User, base_url: str) -> None:
        self.owner = owner
        self.base_url = base_url
        self.workflow = Workflow.objects.create(owner=owner, name="fuzz-steps")
        self.workflow.add_revision(RUNTIME_WORKFLOW, owner)
        WorkflowSecret.put(self.workflow, "apiToken", "fuzz-secret-value", owner)
        self.held: Running | None = None

    def step(self) -> Running:
        """Made again when the step is no longer in progress (nothing a case does should
        end it, but nothing is assumed)."""
        if (
            self.held is None
            or not StepRun.objects.filter(pk=self.held.step.pk, status=StepStatus.IN_PROGRESS).exists()
        ):
            run = engine.create_run(self.workflow, {"who": "fuzz"}, created_by=self.owner)
            self.held = start_step(run, "a", self.base_url)
            self.log = StepLog.objects.create(step_run=self.held.step, header=b"")
        return self.held

    def aim(self, case: schemathesis.Case) -> None:
        """A log's well-formed id becomes a real one; a plain name of a workflow or a step
        the real one (a hostile one is sent as it is)."""
        params = case.path_parameters or {}
        path = case.operation.path

        def named(name: str, value: str) -> None:
            if PLAIN_NAME.fullmatch(str(params.get(name, ""))):
                params[name] = value

        if path == "/workflows/{name}/run":
            named("name", self.workflow.name)
        elif path == "/outputs/{step}/{name}":
            named("step", "a")
        elif path == "/logs/{log_id}/messages":
            self.step()
            real_uuid(params, "log_id", self.log.pk)

    def auth(self, case: schemathesis.Case) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.step().token}"}


@pytest.fixture
def target(transactional_db, live_server) -> Target:
    return Target(User.objects.create_user("fuzzer", password="fuzz-password-1"))


@pytest.fixture
def step_target(transactional_db, live_server) -> StepTarget:
    return StepTarget(User.objects.create_user("fuzzer", password="fuzz-password-1"), live_server.url)


def served_schema() -> dict[str, Any]:
    """The schema as /api/schema/ serves it (read at collection, before any server), with
    hostile examples of the webhook URL's body."""
    response = Client().get("/api/schema/", {"format": "json"}, HTTP_HOST="127.0.0.1")
    assert response.status_code == 200, response.content
    return with_hostile_bodies(json.loads(response.content), lambda path: path.startswith("/api/webhooks/"))


def runtime_schema() -> dict[str, Any]:
    description = yaml.safe_load((Path(__file__).parent / "stepruntime_openapi.yaml").read_text())
    return with_hostile_bodies(description, lambda path: True)


def with_hostile_bodies(description: dict[str, Any], chosen: Any) -> dict[str, Any]:
    """Each JSON request body of the chosen paths gets HOSTILE_VALUES as explicit examples,
    put where an object body keeps a value (under each of its properties, else as `x`)."""
    for path, operations in description["paths"].items():
        if not chosen(path):
            continue
        for operation in operations.values():
            content = (operation.get("requestBody") or {}).get("content", {})
            for media_type, body in content.items():
                if media_type == "application/json":
                    body["examples"] = {
                        f"hostile-{i}": {"value": _hostile_body(body.get("schema", {}), value)}
                        for i, value in enumerate(HOSTILE_VALUES)
                    }
    return description


def _hostile_body(schema: dict[str, Any], value: Any) -> Any:
    if schema.get("type") != "object":
        return copy.deepcopy(value)
    extra = schema.get("additionalProperties")
    properties = schema.get("properties") or {"x": extra if isinstance(extra, dict) else {}}
    return {name: _hostile_body(inner, value) for name, inner in properties.items()}


def fuzz_config(cases: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",
                "max-examples": cases,
                "database": "none",
                # Besides what the schema describes: values that have broken web services.
                "dictionaries": {
                    "string": {"dictionary": "hostile-strings", "probability": 0.15},
                    "integer": {"dictionary": "hostile-integers", "probability": 0.15},
                    "number": {"dictionary": "hostile-numbers", "probability": 0.15},
                },
            },
            "dictionaries": {
                "hostile-strings": {"values": HOSTILE_STRINGS},
                "hostile-integers": {"values": HOSTILE_INTEGERS},
                "hostile-numbers": {"values": HOSTILE_NUMBERS},
            },
        }
    )


schema = schemathesis.openapi.from_dict(served_schema(), config=fuzz_config(CASES_PER_OPERATION))
runtime = schemathesis.openapi.from_dict(runtime_schema(), config=fuzz_config(RUNTIME_CASES_PER_OPERATION))


@pytest.fixture(scope="module")
def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # straight to the live server, whatever proxy the machine has
    return session


@schema.parametrize()
@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_a_5xx_and_every_error_is_a_problem(case, target, http, live_server):
    call_and_check(case, target, http, live_server)


@runtime.parametrize()
@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_runtime_operation_answers_a_5xx_and_every_error_is_a_problem(
    case, step_target, http, live_server
):
    call_and_check(case, step_target, http, live_server)


def call_and_check(
    case: schemathesis.Case, target: Target | StepTarget, http: requests.Session, live_server: Any
) -> None:
    target.aim(case)
    response = case.call(base_url=live_server.url, session=http, headers=target.auth(case), timeout=30)
    request = f"{case.method} {case.formatted_path}: {response.status_code}\n{case.as_curl_command()}"
    assert response.status_code < 500, f"{request}\n{response.text[:2000]}"
    if response.status_code >= 400:
        assert response.headers.get("content-type", [""])[0] == "application/problem+json", request
        problem = response.json()
        assert problem["status"] == response.status_code, request
        assert problem["type"].startswith("urn:relay:problem:") and problem["title"], request
    if case.operation.path.startswith("/api/webhooks/") and response.status_code == 202:
        # Taken at the door is taken: the worker keeps the event (it failed, after a 202, on
        # what the database refused).
        services.process(response.json()["id"])
        event = Event.objects.get(pk=response.json()["id"])
        assert event.state == "matched", f"{request}\n{event.state}: {event.failure_reason}"


# What the fuzz found, each pinned by a test of its own.


def test_a_huge_limit_is_a_bad_request_and_a_large_one_is_capped_not_a_database_error(alice_api, connection):
    for url in ("/api/connections/puppet/", "/api/triggers/"):
        response = alice_api.get(url, {"limit": str(10**23)})
        assert response.status_code == 400, response.content
        assert response.json()["errors"][0]["pointer"] == "#/limit"
        assert alice_api.get(url, {"limit": str(10**17)}).status_code == 200
    PuppetConnection.create_with_token(owner=connection[0].owner, name="second")
    page = alice_api.get("/api/connections/puppet/", {"limit": "1", "offset": "1"}).json()
    assert page["count"] == 2 and len(page["results"]) == 1
    # The database is asked for the ceiling, not the number given.
    asked = Request(APIRequestFactory().get("/api/connections/puppet/", {"limit": str(10**17)}))
    assert LimitOffsetPagination().get_limit(asked) == 1000


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"type": "task-run", "name": "x", "targets": ["n"], "params": {"x": "a\x00b"}}, "#/params/x"),
        ({"type": "task-run", "name": "x", "targets": ["n"], "params": {"a\x00b": 1}}, "#/params"),
        (
            {"type": "task-run", "name": "x", "targets": ["n"], "params": {"x": [{"y": ["\x00"]}]}},
            "#/params/x/0/y/0",
        ),
    ],
)
def test_a_null_character_in_a_json_document_is_a_400(connection, body, pointer):
    """PostgreSQL's jsonb cannot hold \\u0000: it was a database error, a 500. The body's
    reader refuses it where it is (a NUL in a key: at the object that holds it)."""
    _, token = connection
    problem = assert_problem(bridge(token).post(RUNS, body, format="json"), 400)
    assert problem["errors"][0]["pointer"] == pointer
    assert not Run.objects.exists()


def test_a_null_character_in_run_results_is_a_400(connection):
    _, token = connection
    run = create_run(token)
    accept(token, run["id"])
    complete = {"status": "complete", "run_results": {"node-a": {"output": "a\x00b"}}}
    problem = assert_problem(put_state(token, run["id"], complete), 400)
    assert problem["errors"][0]["pointer"] == "#/run_results/node-a/output"
    assert put_state(token, run["id"], {**complete, "run_results": {"node-a": "ok"}}).status_code == 202


@pytest.mark.parametrize(
    "position", ["garbage", "2026-13-45 00:00:00+00:00", "2026-11-23 00:00:00", "x" * 100, ""]
)
def test_a_forged_run_cursor_is_an_invalid_cursor(connection, position):
    """DRF took a cursor's position on trust: one that is no time (or no aware time) was a 500."""
    _, token = connection
    create_run(token)
    cursor = base64.b64encode(f"p={position}".encode()).decode()
    problem = assert_problem(bridge(token).get(RUNS, {"cursor": cursor, "limit": "1"}), 404)
    assert problem["detail"] == "Invalid cursor"


def test_a_cursor_the_service_made_still_pages(connection):
    _, token = connection
    for _ in range(3):
        create_run(token)
    first = bridge(token).get(RUNS, {"limit": 2}).json()
    second = bridge(token).get(first["next"])
    assert second.status_code == 200 and len(second.json()["runs"]) == 1


@pytest.mark.parametrize(
    ("query", "pointer"),
    [
        ({"state": "\x00"}, "#/state"),
        ({"state": "exploded"}, "#/state"),
        ({"status": "a\x00b"}, "#/status"),
        ({"host": "web\x00.example.com"}, "#/host"),
    ],
)
def test_event_filters_refuse_what_they_cannot_match(alice, alice_api, query, pointer):
    trigger, _ = Trigger.create_with_token(owner=alice, name="t")
    problem = assert_problem(alice_api.get(f"/api/triggers/{trigger.pk}/events/", query), 400)
    assert problem["errors"][0]["pointer"] == pointer


def test_event_filters_still_filter(alice, alice_api):
    trigger, token = Trigger.create_with_token(owner=alice, name="t")
    post(str(token), REPORT)
    url = f"/api/triggers/{trigger.pk}/events/"
    assert alice_api.get(url, {"state": "received", "host": ""}).json()["count"] == 1
    assert alice_api.get(url, {"state": "matched"}).json()["count"] == 0


def test_a_digit_that_is_not_ascii_in_a_query_is_a_422(alice):
    """str.isdigit() takes `²` and `٣`, which start no number: a failed assertion, a 500."""
    held = running(alice, RUNTIME_WORKFLOW, "a")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {held.token}")
    for q in ["²", "٣", "a[²]", "1 + ٣"]:
        for lang in ["", "path", "path-template"]:
            query = {"q": f"${{{q}}}" if lang == "path-template" else q, **({"lang": lang} if lang else {})}
            problem = assert_problem(client.get("/spec", query), 422)
            assert problem["type"] == "urn:relay:problem:expression_evaluation_error", query


def test_a_digit_that_is_not_ascii_in_a_workflow_s_expression_is_a_400(alice_api):
    source = "apiVersion: v1\nsteps:\n- name: a\n  image: relaysh/core\n  spec: {x: '${1 + ²}'}\n"
    response = alice_api.post("/api/workflows/validate", source, content_type="application/yaml")
    assert assert_problem(response, 400)["errors"][0]["pointer"] == "#/steps/0/spec/x"
