"""Bad input anywhere is a 4xx problem, never a 500: numbers in query strings and headers are
ASCII digits only, and JSON bodies are refused before parsing when nested too deeply."""

import pytest

from tests.conftest import bridge
from tests.events_helpers import post
from tests.runs_helpers import RUNS, accept, create_run
from tests.test_connection_api import assert_problem
from triggers.models import Trigger

CONNECTIONS = "/api/connections/puppet/"
TRIGGERS = "/api/triggers/"
# Not numbers on the wire, though str.isdigit() or int() take some of them (superscript two,
# Arabic-Indic three, fullwidth three).
NOT_NUMBERS = ["²", "٣", "\uff13", "3x", "-1", "+3", " 3", "1e1", "", "9" * 5000]
ARRAYS = b"[" * 100_000  # the body: unbalanced, as sent
DEEP = b"[" * 100_000 + b"]" * 100_000  # balanced, and far too deep


@pytest.fixture
def token(connection) -> str:
    return connection[1]


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_wait_takes_ascii_digits_only(token, value):
    problem = assert_problem(bridge(token).get(RUNS, {"wait": value}), 400)
    assert problem["errors"][0]["pointer"] == "#/wait"


@pytest.mark.parametrize("value", [*NOT_NUMBERS, "0"])
def test_the_runs_limit_takes_ascii_digits_only(token, value):
    problem = assert_problem(bridge(token).get(RUNS, {"limit": value}), 400)
    assert problem["errors"][0]["pointer"] == "#/limit"


def test_a_bad_limit_is_refused_before_any_wait(token):
    import time

    started = time.monotonic()
    assert_problem(bridge(token).get(RUNS, {"wait": "5", "limit": "٣"}), 400)
    assert time.monotonic() - started < 2


def test_a_cursor_whose_position_is_no_time_is_404_not_500(token):
    import base64

    cursor = base64.b64encode(b"p=not-a-time").decode()
    assert_problem(bridge(token).get(RUNS, {"limit": "1", "cursor": cursor}), 404)


@pytest.mark.parametrize("path", [CONNECTIONS, TRIGGERS])
@pytest.mark.parametrize("param", ["limit", "offset"])
@pytest.mark.parametrize("value", ["²", "٣", "abc", "9" * 5000])
def test_user_list_paging_takes_ascii_digits_only(alice_api, path, param, value):
    problem = assert_problem(alice_api.get(path, {param: value}), 400)
    assert problem["errors"][0]["pointer"] == f"#/{param}"


def test_user_list_paging_still_pages(alice_api):
    for name in ("a", "b", "c"):
        assert alice_api.post(CONNECTIONS, {"name": name}, format="json").status_code == 201
    page = alice_api.get(CONNECTIONS, {"limit": "2", "offset": "1"}).json()
    assert [c["name"] for c in page["results"]] == ["b", "c"] and page["count"] == 3


def test_the_events_list_paging_takes_ascii_digits_only(alice_api, alice):
    trigger, _ = Trigger.create_with_token(owner=alice, name="reports")
    assert_problem(alice_api.get(f"{TRIGGERS}{trigger.pk}/events/", {"limit": "٣"}), 400)
    assert alice_api.get(f"{TRIGGERS}{trigger.pk}/events/", {"limit": "3"}).status_code == 200


def test_a_content_length_that_is_not_ascii_digits_is_4xx(alice_api, alice):
    # Django reads such a body as empty; the size checks must not trip over it either.
    response = alice_api.generic(
        "POST", CONNECTIONS, b'{"name": "x"}', content_type="application/json", CONTENT_LENGTH="²"
    )
    assert_problem(response, 400)
    _, trigger_token = Trigger.create_with_token(owner=alice, name="reports")
    assert_problem(post(str(trigger_token), b"host: a\n", CONTENT_LENGTH="²"), 411)


def json_endpoints(alice_api, alice, token) -> list[tuple[object, str, str]]:
    """(client, method, path) for each family of JSON endpoints."""
    run = create_run(token)
    held = create_run(token)
    accept(token, held["id"])
    connection = alice_api.post(CONNECTIONS, {"name": "deep"}, format="json").json()
    trigger = alice_api.post(TRIGGERS, {"name": "deep"}, format="json").json()
    runs = bridge(token)
    return [
        (runs, "POST", RUNS),
        (runs, "POST", f"{RUNS}/{run['id']}/accept"),
        (runs, "PUT", f"{RUNS}/{held['id']}/state"),
        (alice_api, "POST", CONNECTIONS),
        (alice_api, "PATCH", f"{CONNECTIONS}{connection['id']}/"),
        (alice_api, "POST", TRIGGERS),
        (alice_api, "PATCH", f"{TRIGGERS}{trigger['id']}/"),
    ]


@pytest.mark.parametrize(
    ("body", "detail"),
    [(ARRAYS, "brackets do not pair up"), (DEEP, "nested deeper than 64 levels")],
)
def test_deeply_nested_json_is_400_at_every_json_endpoint(alice_api, alice, token, body, detail):
    for client, method, path in json_endpoints(alice_api, alice, token):
        response = client.generic(method, path, body, content_type="application/json")
        problem = assert_problem(response, 400)
        assert detail in problem["detail"], (method, path, problem)


def test_json_nested_64_deep_is_taken_and_65_is_not(token):
    def run_nested(depth: int) -> dict:
        value: object = 1
        for _ in range(depth - 2):  # the run and its params are the first two levels
            value = [value]
        return {"type": "task-run", "name": "x", "targets": ["a"], "params": {"deep": value}}

    assert bridge(token).post(RUNS, run_nested(64), format="json").status_code == 201
    problem = assert_problem(bridge(token).post(RUNS, run_nested(65), format="json"), 400)
    assert "nested deeper than 64 levels" in problem["detail"]


def test_brackets_inside_strings_do_not_count(token):
    body = {"scope": {"nodes": ["a"]}, "environment": "production"}
    response = bridge(token).generic(
        "POST",
        RUNS,
        b'{"scope": {"nodes": ["a"]}, "environment": "production", "x": "' + b"[{" * 1000 + b'\\"]"}',
        content_type="application/json",
    )
    problem = assert_problem(response, 400)  # refused for the unknown field, not for nesting
    assert problem["errors"][0]["pointer"] == "#/x"
    assert bridge(token).post(RUNS, body, format="json").status_code == 201


def test_the_events_door_refuses_deep_json_without_a_500(alice):
    _, trigger_token = Trigger.create_with_token(owner=alice, name="reports")
    problem = assert_problem(post(str(trigger_token), ARRAYS, "application/json"), 400)
    assert "JSON" in problem["detail"]  # read whole at the door, as the worker would read it


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/api/workflow-runs/", "owner"),
        ("/api/workflow-runs/", "workflow"),
        ("/api/workflow-runs/", "status"),
        ("/api/workflows/", "owner"),
    ],
)
def test_a_nul_in_a_text_filter_is_400_not_500(alice_api, path, param):
    # Found by the fuzzer: PostgreSQL refuses a NUL in any text, a query's included.
    problem = assert_problem(alice_api.get(path, {param: "a\x00b"}), 400)
    assert problem["errors"][0]["pointer"] == f"#/{param}"
