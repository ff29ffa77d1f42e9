"""A schema-driven fuzz run (schemathesis) of every operation in the OpenAPI schema at
/api/schema/, against the live test server, authenticated as each operation's security says:
no answer is a 5xx, and every 4xx is an RFC 9457 problem document.

Path ids are swapped for real ones (valid UUIDs only; anything else is left for the 404
path), so the operations go past the lookup: each case that names a run gets a fresh one, in
turn pending, accepted and in progress, and a deleted connection or trigger is made again.
The size of the run (CASES_PER_OPERATION) keeps it near two minutes on 2 cores; the README
states the number of cases."""

import base64
import itertools
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
import requests
import schemathesis
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, settings
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from puppet_connection.models import PuppetConnection
from relay.api.pagination import LimitOffsetPagination
from runs.models import Run
from tests.conftest import api_token_for, bridge
from tests.events_helpers import fixture, post
from tests.runs_helpers import RUNS, accept, create_run, put_state
from tests.test_connection_api import assert_problem
from triggers import services
from triggers.models import Event, Trigger

CASES_PER_OPERATION = 30
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
HOSTILE_INTEGERS = [2**63, -(2**63) - 1, 10**23, -1, 0]
REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


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

    def aim(self, case: schemathesis.Case) -> None:
        """Swap each well-formed id in the path for a real one."""
        params = case.path_parameters or {}
        path = case.operation.path

        def real(name: str, value: object) -> None:
            try:
                uuid.UUID(str(params[name]))
            except (KeyError, ValueError):
                return  # malformed: left for the 404 path
            params[name] = str(value)

        if path.startswith("/_puppet/runs/"):
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
        return {"Authorization": f"Token {self.user_token}"}


@pytest.fixture
def target(transactional_db, live_server) -> Target:
    return Target(User.objects.create_user("fuzzer", password="fuzz-password-1"))


def served_schema() -> dict[str, Any]:
    """The schema exactly as /api/schema/ serves it (read at collection, before any server)."""
    response = Client().get("/api/schema/", {"format": "json"}, HTTP_HOST="127.0.0.1")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


schema = schemathesis.openapi.from_dict(
    served_schema(),
    config=schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",
                "max-examples": CASES_PER_OPERATION,
                "database": "none",
                # Besides what the schema describes: values that have broken web services.
                "dictionaries": {
                    "string": {"dictionary": "hostile-strings", "probability": 0.15},
                    "integer": {"dictionary": "hostile-integers", "probability": 0.15},
                },
            },
            "dictionaries": {
                "hostile-strings": {"values": HOSTILE_STRINGS},
                "hostile-integers": {"values": HOSTILE_INTEGERS},
            },
        }
    ),
)


@pytest.fixture(scope="module")
def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # straight to the live server, whatever proxy the machine has
    return session


@schema.parametrize()
@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_a_5xx_and_every_error_is_a_problem(case, target, http, live_server):
    target.aim(case)
    response = case.call(base_url=live_server.url, session=http, headers=target.auth(case), timeout=30)
    request = f"{case.method} {case.formatted_path}: {response.status_code}\n{case.as_curl_command()}"
    assert response.status_code < 500, f"{request}\n{response.text[:2000]}"
    if response.status_code >= 400:
        assert response.headers.get("content-type", [""])[0] == "application/problem+json", request
        problem = response.json()
        assert problem["status"] == response.status_code, request
        assert problem["type"].startswith("urn:relay:problem:") and problem["title"], request


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
