"""The step runtime API (relay-core's metadata API) over HTTP, in process: bodies, query
languages, what a step's credential reaches and what it does not, and its errors."""

import base64
import json

import pytest
from rest_framework.test import APIClient

from stepruntime.models import EmittedEvent, StepLog
from tests.conftest import client_for
from tests.runtime_helpers import Running, later_step_outputs, running, start_step
from tests.workflow_helpers import make_workflow, run_of
from workflows.models import StepRun, WorkflowRun, WorkflowSecret

pytestmark = pytest.mark.django_db

SOURCE = """
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
    count: 3
  env:
    WHO: !Parameter who
    KEY: ${secrets.apiToken}
  when: ${parameters.who != "nobody"}
- name: b
  image: relay-internal/noop
  spec:
    outputs:
      seen: !Output [a, result]
      plain: !Output [a, text]
"""


def client(held: Running, scheme: str = "basic") -> APIClient:
    c = APIClient()
    if scheme == "basic":
        c.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{held.token}:".encode()).decode())
    else:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {held.token}")
    return c


@pytest.fixture
def held(alice) -> Running:
    workflow = make_workflow(alice, SOURCE)
    WorkflowSecret.put(workflow, "apiToken", "s3cret-value", alice)
    WorkflowSecret.put(workflow, "unrelated", "not-for-a", alice)
    from workflows import engine

    run = engine.create_run(workflow, {"who": "relay"}, created_by=alice)
    return start_step(run, "a")


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["detail"]
    return body


def test_the_whole_spec_is_evaluated(held):
    body = client(held).get("/spec").json()
    assert body == {
        "value": {
            "greeting": "hello relay",
            "token": "s3cret-value",
            "nested": {"list": [1, 2.5, "three", True, None], "deep": {"x": "relay"}},
            "count": 3,
        },
        "unresolvable": {},
        "complete": True,
    }


@pytest.mark.parametrize(
    ("q", "lang", "value"),
    [
        ("greeting", "", "hello relay"),
        ('nested["deep"]["x"]', "", "relay"),  # relay_sdk's Dynamic: D.nested.deep.x
        ("nested.list[1]", "path", 2.5),
        ("${greeting}!", "path-template", "hello relay!"),
        ("{.greeting}", "jsonpath-template", "hello relay"),
        ("{.count}", "jsonpath-template", "3"),
        ("{.nested.list}", "jsonpath-template", "1 2.5 three true <nil>"),  # a list: joined
        ("{.nested.list[*]}", "jsonpath-template", "1 2.5 three true <nil>"),
        ("{.missing}", "jsonpath-template", ""),
        ("x={.nested.deep.x}, n={.nested.list[-3]}", "jsonpath-template", "x=relay, n=three"),
        ("{range .nested.list[0:2]}<{@}>{end}", "jsonpath-template", "<1><2.5>"),
        ("{..x}", "jsonpath-template", "relay"),
        ("$.nested.list[0]", "jsonpath", 1),
        ("{.nested.list[0,2]}", "jsonpath", [1, "three"]),
    ],
)
def test_a_query_selects_one_value(held, q, lang, value):
    params = {"q": q, **({"lang": lang} if lang else {})}
    body = client(held).get("/spec", params).json()
    assert body["value"] == value and body["complete"] is True


def test_an_output_not_there_yet_is_unresolvable_not_an_error(alice):
    source = (
        "apiVersion: v1\nsteps:\n- {name: a, image: relaysh/core}\n"
        "- name: b\n  image: relaysh/core\n  spec: {x: !Output [a, later], y: 1}\n"
    )
    run = run_of(alice, source)
    held = start_step(run, "a")
    held.step.put_output("other", 1)
    held.end()
    b = start_step(run, "b")
    body = client(b).get("/spec").json()
    assert body["complete"] is False
    assert body["unresolvable"] == {"outputs": [{"from": "a", "name": "later"}]}
    assert client(b).get("/spec", {"q": "y"}).json() == {"value": 1, "unresolvable": {}, "complete": True}


def test_bad_queries_are_422_problems(held):
    c = client(held)
    body = assert_problem(c.get("/spec", {"q": "a", "lang": "xpath"}), 422)
    assert body["type"] == "urn:relay:problem:expression_unsupported_language_error"
    for q, lang in [("a +", ""), ("{.a", "jsonpath-template"), ("{.a[?(@.x)]}", "jsonpath-template")]:
        assert_problem(c.get("/spec", {"q": q, "lang": lang}), 422)
    assert_problem(c.get("/spec", {"q": "nope.deeper"}), 422)


def test_outputs_are_set_and_read_in_the_run(held, alice):
    c = client(held)
    assert c.put("/outputs/result", b'{"ok": [1, 2]}', content_type="application/json").status_code == 201
    assert c.put("/outputs/text", b"plain words", content_type="text/plain").status_code == 201
    assert (
        c.put("/outputs/result/metadata", b'{"sensitive": true}', content_type="application/json").status_code
        == 201
    )
    assert c.get("/outputs/a/result").json() == {
        "task_name": "a",
        "key": "result",
        "value": {"ok": [1, 2]},
        "metadata": {"sensitive": True},
    }
    assert c.get("/outputs/a/text").json()["value"] == "plain words"
    assert_problem(c.get("/outputs/a/nothing"), 404)
    assert_problem(c.get("/outputs/nostep/result"), 404)
    held.end()
    assert later_step_outputs(held.run, "b") == {"seen": {"ok": [1, 2]}, "plain": "plain words"}


def test_bad_outputs_are_422_problems(held):
    c = client(held)
    assert_problem(c.put("/outputs/x", b"{nope", content_type="application/json"), 422)
    assert_problem(c.put("/outputs/x", b"NaN", content_type="application/json"), 422)
    assert_problem(c.put("/outputs/x", b"[" * 100 + b"]" * 100, content_type="application/json"), 422)
    assert_problem(c.put("/outputs/x", b"1", content_type="application/xml"), 422)
    assert_problem(c.put("/outputs/x", b"\xff\xfe", content_type="text/plain"), 422)
    assert_problem(c.put("/outputs/a%22b", b"1", content_type="application/json"), 422)
    assert_problem(c.put("/outputs/x/other", b"{}", content_type="application/json"), 405)
    assert_problem(c.put("/outputs/x/metadata", b'{"sensitive": 1}', content_type="application/json"), 422)
    assert StepRun.objects.get(pk=held.step.pk).outputs == {}


def test_secrets_reach_only_what_the_spec_refers_to(held):
    c = client(held)
    response = c.get("/secrets/apiToken")
    assert response.json() == {"key": "apiToken", "value": "s3cret-value"}
    assert response["Cache-Control"] == "no-store"
    unrelated = assert_problem(c.get("/secrets/unrelated"), 404)
    missing = assert_problem(c.get("/secrets/neverSet"), 404)
    assert unrelated["detail"] == missing["detail"]  # the same answer: nothing learnt


def test_environment(held):
    c = client(held)
    assert c.get("/environment").json() == {
        "value": {"WHO": "relay", "KEY": "s3cret-value"},
        "unresolvable": {},
        "complete": True,
    }
    assert c.get("/environment/WHO").json()["value"] == "relay"
    assert_problem(c.get("/environment/NOPE"), 404)


def test_conditions_evaluate_the_steps_when(held, alice):
    assert client(held).get("/conditions").json() == {
        "resolved": True,
        "success": True,
        "message": "all checks passed",
    }
    other = start_step(run_of(alice, SOURCE, {"who": "nobody"}, name="other"), "a")
    assert client(other).get("/conditions").json() == {
        "resolved": True,
        "success": False,
        "message": "one or more conditions failed",
    }


def test_a_step_without_when_passes_and_validate_evaluates_the_spec(alice):
    held = running(alice, "apiVersion: v1\nsteps:\n- {name: a, image: relaysh/core, spec: {x: 1}}\n", "a")
    c = client(held, scheme="bearer")
    assert c.get("/conditions").json() == {"resolved": True, "success": True, "message": ""}
    response = c.post("/validate")
    assert response.status_code == 200 and response.content == b"null"


def test_decorators_show_in_the_workflow_runs_api(held, alice):
    c = client(held)
    link = {"type": "link", "description": "Pull request", "uri": "https://example.com/pr/1"}
    assert c.post("/decorators/pr", json.dumps(link), content_type="application/json").status_code == 201
    assert_problem(c.post("/decorators/pr", b'{"uri": "x"}', content_type="application/json"), 422)
    assert_problem(c.post("/decorators/pr", b"[1]", content_type="application/json"), 422)
    run = client_for(alice).get(f"/api/workflow-runs/{held.run.pk}/").json()
    assert run["steps"][0]["decorators"] == {"pr": link}


def test_events_status_and_logs_are_kept(held):
    c = client(held)
    event = {"data": {"ref": "main"}, "key": "k1"}
    assert c.post("/events", json.dumps(event), content_type="application/json").status_code == 202
    assert_problem(c.post("/events", b'{"data": [1]}', content_type="application/json"), 422)
    assert list(EmittedEvent.objects.values_list("key", "data")) == [("k1", {"ref": "main"})]

    status = {"process_state": {"exit_code": 0, "timestamp": "2024-01-01T00:00:00Z"}}
    assert c.put("/status", json.dumps(status), content_type="application/json").status_code == 201
    assert_problem(
        c.put("/status", b'{"process_state": {"exit_code": "0"}}', content_type="application/json"), 422
    )

    created = c.post("/logs", b"\x0a\x03out", content_type="application/octet-stream")
    assert created.status_code == 201
    log_id = created.content.decode()
    sent = c.post(f"/logs/{log_id}/messages", b"line 1", content_type="application/octet-stream")
    assert sent.status_code == 202
    assert [bytes(m.body) for m in StepLog.objects.get(pk=log_id).messages.all()] == [b"line 1"]
    assert_problem(c.post("/logs", b"x", content_type="text/plain"), 422)
    assert_problem(c.post("/logs/not-a-log/messages", b"x", content_type="application/octet-stream"), 404)


def test_a_step_starts_a_workflow_of_its_owner_by_name(held, alice, bob):
    make_workflow(
        alice,
        "apiVersion: v1\nparameters: {n: {}}\nsteps:\n- {name: s, image: relay-internal/noop}\n",
        "child",
    )
    make_workflow(bob, "apiVersion: v1\nsteps:\n- {name: s, image: relay-internal/noop}\n", "bobs")
    c = client(held)
    body = {"parameters": {"n": {"value": 5}}}
    response = c.post("/workflows/child/run", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    started = response.json()["workflow_run"]
    assert started["name"] == "child" and started["run_number"] == 1
    run = WorkflowRun.objects.get(workflow__name="child")
    assert run.parameters == {"n": 5} and run.created_by == alice
    assert started["app_url"].endswith(f"/api/workflow-runs/{run.pk}/")
    assert_problem(c.post("/workflows/bobs/run", b"{}", content_type="application/json"), 404)
    assert_problem(c.post("/workflows/child/run", b"{}", content_type="application/json"), 422)
    assert_problem(
        c.post("/workflows/child/run", b'{"parameters": {"n": 5}}', content_type="application/json"), 422
    )


# Who may use the API ---------------------------------------------------------------------------


def test_no_or_another_kind_of_token_is_401(held, alice):
    assert_problem(APIClient().get("/spec"), 401)
    assert_problem(APIClient().get("/outputs/a/b/c"), 404)  # no such route: a problem too
    user = client_for(alice)
    assert_problem(user.get("/spec"), 401)
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Basic !!!")
    assert_problem(bad.get("/spec"), 401)


def test_an_ended_steps_credential_is_refused(held):
    c = client(held)
    assert c.get("/spec").status_code == 200
    held.end()
    for response in (
        c.get("/spec"),
        c.get("/secrets/apiToken"),
        c.put("/outputs/x", b"1", content_type="application/json"),
        c.get("/outputs/a/x"),
    ):
        body = assert_problem(response, 401)
        assert "expired" in body["detail"]


def test_a_step_reaches_nothing_of_another_run(held, alice):
    other = start_step(run_of(alice, SOURCE, {"who": "other"}, name="other"), "a")
    client(other).put("/outputs/result", b'"theirs"', content_type="application/json")
    WorkflowSecret.put(other.run.workflow, "apiToken", "other-workflows-secret", alice)
    c = client(held)
    # Steps are named alike in both runs: `a` here is this run's own step.
    assert_problem(c.get("/outputs/a/result"), 404)
    assert c.get("/secrets/apiToken").json()["value"] == "s3cret-value"
    assert c.get("/spec", {"q": "token"}).json()["value"] == "s3cret-value"
    # And the other way round.
    assert client(other).get("/secrets/apiToken").json()["value"] == "other-workflows-secret"
    assert_problem(client(other).get("/secrets/unrelated"), 404)


def test_a_step_cannot_read_another_steps_spec(alice):
    source = (
        "apiVersion: v1\nsteps:\n- {name: a, image: relaysh/core, spec: {mine: a}}\n"
        "- {name: b, image: relaysh/core, spec: {mine: b, token: !Secret t}}\n"
    )
    workflow = make_workflow(alice, source)
    WorkflowSecret.put(workflow, "t", "only-b", alice)
    from workflows import engine

    run = engine.create_run(workflow, {}, created_by=alice)
    a = start_step(run, "a")
    c = client(a)
    assert c.get("/spec").json()["value"] == {"mine": "a"}
    assert_problem(c.get("/secrets/t"), 404)  # b's secret: a's spec does not refer to it
    assert_problem(c.get("/spec", {"q": "token"}), 422)  # no such key in a's spec


# A step reaches only what its spec yields; data stays data --------------------------------------

# Text a webhook's body, a Puppet report or a run's parameters can carry: were it evaluated
# again, it would read a secret and a connection the step's spec does not refer to.
HOSTILE = "${secrets.unrelated} / ${connections.puppet['prod-puppet'].token}"


def assert_nothing_leaks(response, token: str) -> None:
    assert b"not-for-a" not in response.content and token.encode() not in response.content


def test_a_query_names_nothing_the_spec_does_not_reference(held, connection):
    _, token = connection  # alice's Puppet connection "prod-puppet"; a's spec does not name it
    c = client(held)
    for q, lang in [
        ("'${secrets.unrelated}'", ""),
        ('"${secrets.unrelated}"', "path"),
        ("\"${connections.puppet['prod-puppet'].token}\"", "path"),
        ("${'${secrets.unrelated}'}", "path-template"),
        ('{"${secrets.unrelated}"}', "jsonpath-template"),
    ]:
        response = c.get("/spec", {"q": q, "lang": lang})
        assert_nothing_leaks(response, token)
        body = response.json()
        assert body["complete"] is True and body["value"].startswith("${"), (q, lang, body)
    # The template environment is not the query's: only the spec's own keys are there.
    for q, lang in [
        ("${connections.puppet['prod-puppet'].token}", "path-template"),
        ("${secrets.unrelated}", "path-template"),
        ("secrets.unrelated", "path"),
        ("$.secrets.unrelated", "jsonpath"),
    ]:
        response = c.get("/spec", {"q": q, "lang": lang})
        assert_nothing_leaks(response, token)
        assert response.status_code == 422 or response.json()["value"] in (None, ""), (q, response.content)
    # What the spec does refer to is still there, in every language.
    assert c.get("/spec", {"q": "token"}).json()["value"] == "s3cret-value"
    assert c.get("/spec", {"q": "${token}", "lang": "path-template"}).json()["value"] == "s3cret-value"
    assert c.get("/spec", {"q": "{.token}", "lang": "jsonpath-template"}).json()["value"] == "s3cret-value"


FED = """
apiVersion: v1
parameters:
  host: {}
  doc: {}
  parts: {}
steps:
- name: a
  image: relaysh/core
- name: b
  image: relaysh/core
  spec:
    host: !Parameter host
    quoted: "host is ${parameters.host}"
    doc: !Parameter doc
    picked: !Fn.path [!Parameter doc, title]
    joined: {$fn.concat: !Parameter parts}
    carried: !Output [a, carried]
    token: !Secret apiToken
  env: {HOST: !Parameter host, CARRIED: !Output [a, carried]}
  when: !Fn.equals [!Fn.path [!Parameter doc, title], !Parameter host]
- name: c
  image: relay-internal/noop
  dependsOn: b
  spec:
    outputs:
      host: !Parameter host
      picked: !Fn.path [!Parameter doc, title]
      joined: {$fn.concat: !Parameter parts}
      carried: !Output [a, carried]
"""


def test_values_that_arrived_as_data_come_back_verbatim_in_every_language(alice, alice_api, connection):
    _, token = connection
    workflow = make_workflow(alice, FED)
    WorkflowSecret.put(workflow, "apiToken", "s3cret-value", alice)
    WorkflowSecret.put(workflow, "unrelated", "not-for-a", alice)
    doc = {"title": HOSTILE, "ref": {"$type": "Secret", "name": "unrelated"}}
    parameters = {"host": HOSTILE, "doc": doc, "parts": ["${secrets.unrelated}", " ", HOSTILE]}
    started = alice_api.post("/api/workflows/wf/runs/", {"parameters": parameters}, format="json")
    assert started.status_code == 201, started.content
    run = WorkflowRun.objects.get(pk=started.json()["id"])
    a = start_step(run, "a")
    assert (
        client(a).put("/outputs/carried", b"${secrets.unrelated}", content_type="text/plain").status_code
        == 201
    )
    a.end()
    b = start_step(run, "b")
    c = client(b)

    whole = c.get("/spec")
    assert_nothing_leaks(whole, token)
    assert whole.json()["value"] == {
        "host": HOSTILE,
        "quoted": "host is " + HOSTILE,
        "doc": doc,
        "picked": HOSTILE,
        "joined": "${secrets.unrelated} " + HOSTILE,
        "carried": "${secrets.unrelated}",
        "token": "s3cret-value",
    }
    for q, lang, value in [
        ("host", "", HOSTILE),
        ('$["host"]', "path", HOSTILE),
        ("quoted", "path", "host is " + HOSTILE),
        ('doc["title"]', "", HOSTILE),
        ("doc.ref", "path", {"$type": "Secret", "name": "unrelated"}),
        ("picked", "", HOSTILE),
        ("joined", "", "${secrets.unrelated} " + HOSTILE),
        ("carried", "", "${secrets.unrelated}"),
        ("${host}", "path-template", HOSTILE),
        ("[${carried}]", "path-template", "[${secrets.unrelated}]"),
        ("${doc.ref}", "path-template", {"$type": "Secret", "name": "unrelated"}),
        ("$.host", "jsonpath", HOSTILE),
        ("{.doc.ref}", "jsonpath", {"$type": "Secret", "name": "unrelated"}),
        ("{.host}", "jsonpath-template", HOSTILE),
        ("{.carried} and {.doc.title}", "jsonpath-template", "${secrets.unrelated} and " + HOSTILE),
    ]:
        response = c.get("/spec", {"q": q, "lang": lang})
        assert_nothing_leaks(response, token)
        assert response.json() == {"value": value, "unresolvable": {}, "complete": True}, (q, lang)
    environment = c.get("/environment")
    assert_nothing_leaks(environment, token)
    assert environment.json()["value"] == {"HOST": HOSTILE, "CARRIED": "${secrets.unrelated}"}
    assert c.get("/environment/HOST").json()["value"] == HOSTILE
    conditions = c.get("/conditions")
    assert_nothing_leaks(conditions, token)
    assert conditions.json() == {"resolved": True, "success": True, "message": "all checks passed"}
    assert_problem(c.get("/secrets/unrelated"), 404)
    assert c.post("/validate").status_code == 200
    b.end()
    # The engine evaluates a step's spec by the same rule.
    assert later_step_outputs(run, "c") == {
        "host": HOSTILE,
        "picked": HOSTILE,
        "joined": "${secrets.unrelated} " + HOSTILE,
        "carried": "${secrets.unrelated}",
    }


def test_a_query_over_a_partly_resolvable_spec_is_complete_where_it_does_not_go(alice):
    source = """
apiVersion: v1
parameters:
  text: {default: "{"}
steps:
- {name: a, image: relaysh/core}
- name: b
  image: relaysh/core
  spec:
    x: !Output [a, later]
    y: {z: [1, !Output [a, later]], w: 2}
    bad: !Fn.jsonUnmarshal [!Parameter text]
"""
    run = run_of(alice, source)
    a = start_step(run, "a")
    a.end()
    c = client(start_step(run, "b"))
    later = {"outputs": [{"from": "a", "name": "later"}]}
    for q, lang, value in [
        ("y.w", "", 2),
        ("y.z[0]", "", 1),
        ("${y.w}", "path-template", 2),
        ("$.y.w", "jsonpath", 2),
        ("{.y.z[0]}", "jsonpath-template", "1"),
    ]:
        assert c.get("/spec", {"q": q, "lang": lang}).json() == {
            "value": value,
            "unresolvable": {},
            "complete": True,
        }
    for q, lang in [("y.z", ""), ("x", "path"), ("{.y.z[1]}", "jsonpath-template"), ("$.x", "jsonpath")]:
        body = c.get("/spec", {"q": q, "lang": lang}).json()
        assert body["complete"] is False and body["unresolvable"] == later, (q, lang, body)
    # A part that fails fails only the queries that go through it.
    body = assert_problem(c.get("/spec", {"q": "bad"}), 422)
    assert "jsonUnmarshal" in body["detail"]
    assert_problem(c.get("/spec"), 422)
