"""No 500s, anywhere (issue 17, §8): what Python's json reads but PostgreSQL or the engine
cannot keep (NUL, lone surrogates, numbers past a float64), what is no JSON (NaN), nesting
past 64, and control characters in a URL's path are 4xx problems at every door, before
anything is stored. (The webhook door's cases: tests/test_workflow_webhooks.py.)"""

import base64
import http.client
import json
from urllib.parse import urlsplit

import pytest
from django.test import Client
from rest_framework.test import APIClient

from stepruntime.models import EmittedEvent, StepCredential
from tests.conftest import api_token_for
from tests.runtime_helpers import Running, running
from tests.test_connection_api import assert_problem
from tests.workflow_helpers import make_workflow
from triggers.models import Trigger
from workflows import engine
from workflows.models import StepRun, Workflow, WorkflowRun

pytestmark = pytest.mark.django_db

SOURCE = """\
apiVersion: v1
parameters:
  who: {default: world}
steps:
- name: a
  image: relaysh/core
  spec:
    greeting: !Fn.concat ["hello ", !Parameter who]
"""
# A JSON value each, as sent (bytes), and what the problem says of it.
UNKEEPABLE = {
    "a NUL in a string": (b'"a\\u0000b"', "A string holds a NUL character (U+0000)"),
    "a NUL in a key": (b'{"a\\u0000": 1}', "A key holds a NUL character (U+0000)"),
    "a lone high surrogate": (b'"\\ud800"', "A string holds a lone surrogate (U+D800)"),
    "a lone low surrogate in a key": (b'{"\\udc00": 1}', "A key holds a lone surrogate (U+DC00)"),
    "a surrogate pair cut short": (b'"\\ud83d!"', "A string holds a lone surrogate (U+D83D)"),
    "1e400": (b"1e400", "A number is too large for a float64"),
    "-1e400": (b"-1e400", "A number is too large for a float64"),
    "400 digits": (b"9" * 400, "A number is too large for a float64"),
    "250 digits and e99": (b"9" * 250 + b"e99", "A number is too large for a float64"),
    "an exponent of 0400": (b"1E+0400", "A number is too large for a float64"),
    "NaN": (b"NaN", "NaN is not JSON"),
    "-Infinity": (b"-Infinity", "-Infinity is not JSON"),
    "65 levels": (b"[" * 65 + b"]" * 65, "nested deeper than 64 levels"),
    "900 levels": (b"[" * 900 + b"]" * 900, "nested deeper than 64 levels"),
}
# Each body-taking route of the step runtime API, with the value put where it keeps it.
RUNTIME_ROUTES = {
    "PUT /outputs/x": ("put", "/outputs/x", b"%s"),
    "PUT /outputs/x/metadata": ("put", "/outputs/x/metadata", b'{"sensitive": true, "x": %s}'),
    "POST /decorators/x": ("post", "/decorators/x", b'{"type": "link", "description": %s}'),
    "POST /events": ("post", "/events", b'{"data": {"x": %s}, "key": "k"}'),
    "PUT /status": ("put", "/status", b'{"process_state": {"exit_code": 0, "detail": %s}}'),
    "POST /workflows/wf/run": ("post", "/workflows/wf/run", b'{"parameters": {"who": {"value": %s}}}'),
}


def step_client(held: Running) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{held.token}:".encode()).decode())
    return c


@pytest.fixture
def held(alice) -> Running:
    return running(alice, SOURCE, "a")


@pytest.mark.parametrize("value", UNKEEPABLE.values(), ids=UNKEEPABLE.keys())
@pytest.mark.parametrize("route", RUNTIME_ROUTES.values(), ids=RUNTIME_ROUTES.keys())
def test_the_step_runtime_api_refuses_what_it_cannot_keep_with_422_and_stores_nothing(held, route, value):
    method, path, template = route
    body, detail = value
    response = getattr(step_client(held), method)(path, template % body, content_type="application/json")
    problem = assert_problem(response, 422)
    assert problem["type"] == "urn:relay:problem:malformed_request_error"
    assert detail in problem["detail"], problem["detail"]
    step = StepRun.objects.get(pk=held.step.pk)
    assert (step.outputs, step.decorators, step.output_metadata) == ({}, {}, {})
    assert StepCredential.objects.get(step_run=step).reported_status is None
    assert not EmittedEvent.objects.exists()
    assert WorkflowRun.objects.count() == 1  # no run started


def test_the_step_runtime_api_still_takes_what_it_can_keep(held):
    c = step_client(held)
    # An escaped backslash before u0000 (text, no NUL), a surrogate pair (an emoji), a whole
    # number of 302 digits (a float64 holds it), and a number too small for one (it is 0).
    big = 2**1000
    value = b'{"text": "\\\\u0000 \\ud83d\\ude00", "big": %d, "tiny": 1e-400}' % big
    assert c.put("/outputs/x", value, content_type="application/json").status_code == 201
    assert StepRun.objects.get(pk=held.step.pk).outputs["x"] == {
        "text": "\\u0000 \U0001f600",
        "big": big,
        "tiny": 0,
    }


def test_a_text_output_with_a_nul_is_422(held):
    problem = assert_problem(step_client(held).put("/outputs/x", b"a\x00b", content_type="text/plain"), 422)
    assert "NUL character" in problem["detail"]
    assert StepRun.objects.get(pk=held.step.pk).outputs == {}


@pytest.mark.parametrize(
    ("parameters", "pointer"),
    [
        (b'{"who": "\\udc00"}', "#/parameters/who"),  # the issue's
        (b'{"who": {"deep": ["a\\u0000"]}}', "#/parameters/who/deep/0"),
        (b'{"who\\u0000": 1}', "#/parameters"),
        (b'{"who": 1e400}', "#/parameters/who"),
        (b'{"who": -' + b"9" * 400 + b"}", "#/parameters/who"),
    ],
)
def test_the_workflows_api_refuses_unkeepable_run_parameters_at_their_pointer(
    alice, alice_api, parameters, pointer
):
    make_workflow(alice, SOURCE)
    body = b'{"parameters": ' + parameters + b"}"
    problem = assert_problem(
        alice_api.post("/api/workflows/wf/runs/", body, content_type="application/json"), 400
    )
    assert problem["type"] == "urn:relay:problem:validation_error"
    assert problem["errors"][0]["pointer"] == pointer
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize(
    ("extra", "pointer"),
    [
        (b'"description": "\\ud800"', "#/description"),
        (b'"description": "a\\u0000"', "#/description"),
        (b'"labels": {"n": 1e400}', "#/labels/n"),  # no such field: refused all the same
    ],
)
def test_the_workflows_api_refuses_unkeepable_documents_at_their_pointer(alice_api, extra, pointer):
    body = b'{"name": "x", "source": %s, %s}' % (json.dumps(SOURCE).encode(), extra)
    problem = assert_problem(alice_api.post("/api/workflows/", body, content_type="application/json"), 400)
    assert problem["errors"][0]["pointer"] == pointer
    source = b'{"name": "x", "source": "apiVersion: v1\\nsteps: []\\n# \\udc00"}'
    problem = assert_problem(alice_api.post("/api/workflows/", source, content_type="application/json"), 400)
    assert problem["errors"][0]["pointer"] == "#/source"
    assert not Workflow.objects.exists()


def test_a_nul_from_a_yaml_escape_in_a_workflow_is_a_400_at_its_line(alice, alice_api):
    """A `"\\0"` in the document: it validated, then starting a run was a database error."""
    source = SOURCE.replace("{default: world}", '{default: "a\\0b"}')
    response = alice_api.post("/api/workflows/validate", source.encode(), content_type="application/yaml")
    problem = assert_problem(response, 400)
    [error] = problem["errors"]
    assert error["detail"] == "A string holds a NUL character (U+0000), which cannot be stored."
    assert (error["line"], error["column"]) == (3, 18)
    created = alice_api.post("/api/workflows/", {"name": "nul", "source": source}, format="json")
    assert_problem(created, 400)
    # Said as text (`\\0` in single quotes) it is text, and starts a run.
    source = SOURCE.replace("{default: world}", "{default: 'a\\0b'}")
    created = alice_api.post("/api/workflows/", {"name": "text", "source": source}, format="json")
    assert created.status_code == 201, created.content
    run = alice_api.post("/api/workflows/text/runs/", {}, format="json")
    assert run.status_code == 201 and run.json()["parameters"] == {"who": "a\\0b"}


def test_the_reader_says_where():
    from relay.api.parsers import RefusedJSON, read_json

    assert read_json(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    with pytest.raises(RefusedJSON) as refused:
        read_json(b'{"a": [0, {"b\\u0000c": 1}]}')
    assert refused.value.pointer == "#/a/1" and str(refused.value).startswith("#/a/1: A key holds a NUL")
    with pytest.raises(RefusedJSON) as refused:
        read_json(b'{"a/b": {"~": 1e999}}')
    assert refused.value.pointer == "#/a~1b/~0"
    with pytest.raises(RefusedJSON) as refused:
        read_json(b"{")
    assert refused.value.path is None


# Control characters in a URL's path, over HTTP to the live server (uvicorn decodes the path).


def raw_request(live_server, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, dict]:
    """The path sent exactly as written (http.client quotes nothing)."""
    url = urlsplit(live_server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        body = b"{}" if method in ("POST", "PUT") else None
        connection.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), json.loads(response.read() or b"null")
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("character", ["%00", "%0A", "%1F", "%7F", "%C2%85"])
def test_a_control_character_in_a_path_segment_is_a_400_problem(live_server, alice, character):
    workflow = make_workflow(alice, SOURCE)
    run = engine.create_run(workflow, {}, created_by=alice)
    held = running(alice, SOURCE, "a", base=live_server.url, name="held")
    step = {"Authorization": f"Bearer {held.token}"}
    user = {"Authorization": f"Token {api_token_for(alice)}"}
    for method, path, headers in [
        ("POST", f"/workflows/{character}/run", step),
        ("GET", f"/outputs/{character}/x", step),
        ("GET", f"/outputs/a/{character}", step),
        ("PUT", f"/outputs/a{character}b", step),
        ("GET", f"/secrets/{character}", step),
        ("POST", f"/logs/{character}/messages", step),
        ("GET", f"/api/workflows/{character}/", user),
        ("PUT", f"/api/workflows/{character}/", user),
        ("GET", f"/api/workflows/wf{character}/revisions/", user),
        ("POST", f"/api/workflows/{character}/runs/", user),
        ("GET", f"/api/workflow-runs/{run.pk}/steps/{character}/log", user),
        ("POST", f"/api/workflow-runs/{run.pk}/steps/{character}/approve/", user),
        ("GET", f"/api/connections/puppet/{character}/", user),
    ]:
        status, content_type, problem = raw_request(live_server, method, path, headers)
        assert (status, content_type) == (400, "application/problem+json"), (method, path, status)
        assert problem["type"] == "urn:relay:problem:bad_path", problem
        assert problem["detail"].startswith("The URL's path holds a control character (U+00"), problem
    # Not an API path: Django's own 400 page, not a 500.
    status, _, _ = _html(live_server, f"/admin/workflows/workflow/{character}/change/")
    assert status == 400


def _html(live_server, path: str) -> tuple[int, str, None]:
    url = urlsplit(live_server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Content-Type", ""), None
    finally:
        connection.close()


def test_a_database_refusal_is_not_quoted_in_an_event_s_failure_reason():
    """PostgreSQL's message quotes the SQL it refused, with the event's data in it: such a
    reason ("DataError: invalid input syntax for type json … LINE 1: …") is for the log."""
    from django.db import DataError

    from triggers.services import _reason

    refused = DataError('invalid input syntax for type json\nLINE 1: ... E\'{"token": "s3cret-value"}\'')
    reason = _reason(refused)
    assert "s3cret" not in reason and "LINE" not in reason
    assert reason == "the database refused what was read (DataError); the worker's log has why."
    assert _reason(TypeError("tags is 7")) == "TypeError: tags is 7"


@pytest.mark.parametrize(
    "value",
    ['["a\\u0000"]', '["\\ud800"]', "[1e400]", "[NaN]", "[" * 900 + "]" * 900],
    ids=["NUL", "lone surrogate", "1e400", "NaN", "900 levels"],
)
def test_the_admin_s_json_fields_refuse_what_they_cannot_keep_with_a_form_error(staff, value):
    """A trigger's filters in the admin: it was the database's error, a 500."""
    trigger, _ = Trigger.create_with_token(owner=staff, name="t")
    client = Client()
    client.force_login(staff)
    filters = {f: "[]" for f in ("environments", "host_globs", "resource_types", "title_globs", "tags")}
    url = f"/admin/triggers/trigger/{trigger.pk}/change/"
    response = client.post(url, {"name": "t", **filters, "statuses": value})
    assert response.status_code == 200  # the form again, with its error
    assert response.context["adminform"].form.errors["statuses"]
    trigger.refresh_from_db()
    assert trigger.statuses == []
    response = client.post(url, {"name": "t", **filters, "statuses": '["failed"]'})
    assert response.status_code == 302
    trigger.refresh_from_db()
    assert trigger.statuses == ["failed"]


@pytest.mark.parametrize("number", ["1e400", "-1e400", "9" * 400, ".inf", "-.Inf", ".nan", "!!float 1e999"])
def test_a_number_json_cannot_hold_in_a_workflow_is_a_400_at_its_line(alice_api, number):
    """A default of 1e400 validated and was saved, then every run of it was refused: a
    document's values are JSON, which has no infinity or NaN."""
    source = SOURCE.replace("world", number)
    problem = assert_problem(
        alice_api.post("/api/workflows/validate", source.encode(), content_type="application/yaml"), 400
    )
    [error] = problem["errors"]
    assert "is not a finite number" in error["detail"]
    assert (error["line"], error["column"]) == (3, 18)
    assert_problem(alice_api.post("/api/workflows/", {"name": "wf", "source": source}, format="json"), 400)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_the_query_string_is_a_400_not_a_500(live_server, alice, staff):
    """PostgreSQL refuses NUL in any text: the admin's list filters given one were a 500 (the
    APIs' refuse it themselves, a problem naming the parameter)."""
    user = {"Authorization": f"Token {api_token_for(alice)}"}
    for path in (
        "/api/workflow-runs/?workflow=%00",
        "/api/workflows/?owner=a%00b",
    ):
        status, content_type, _ = raw_request(live_server, "GET", path, user)
        assert (status, content_type) == (400, "application/problem+json"), (path, status)
    client = Client()
    client.force_login(staff)
    for path in ("/admin/workflows/workflowrun/?status=%00", "/admin/inventory/node/?environment=%00"):
        assert client.get(path).status_code == 400, path
    # "%2500" is the text "%00", which is no NUL.
    status, _, _ = raw_request(live_server, "GET", "/api/workflow-runs/?workflow=%2500", user)
    assert status == 200
