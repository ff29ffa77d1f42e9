"""Webhook triggers, on a real worker: a URL per trigger, its own token (shown once, kept in
Vault), any JSON object as the event that `when` and the binding read; the body stored and
read by the worker like a push event; bad bodies and tokens are 4xx problems; an image that
is not a pass-through is made with its workflow but its URL refuses events, saying why."""

import base64
import gzip
import hashlib
import io
import json

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import client_for
from tests.test_connection_api import assert_problem
from tests.workflow_helpers import NOOP, ended, finished, steps_of, vault_worker, wait_until
from triggers import ingest
from triggers.models import BodyFormat, Event, Trigger
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, bao, tmp_path_factory):
    with vault_worker(django_db_blocker, bao, tmp_path_factory.mktemp("webhooks") / "worker.log") as process:
        yield process


@pytest.fixture(autouse=True)
def _worker_done_before_the_flush(worker):
    """A test ends only when the worker has done what it asked: an event still being read,
    or its run still going, when the test's TRUNCATE comes, deadlocks with it."""
    yield
    wait_until(
        lambda: (
            not Event.objects.filter(state="received").exists()
            and not Event.objects.filter(workflow_start="pending").exists()
            and not WorkflowRun.objects.exclude(status="complete").exists()
        )
    )


@pytest.fixture
def ops(db) -> User:
    return User.objects.create_user("ops")


@pytest.fixture
def api(ops: User) -> APIClient:
    return client_for(ops)


HOOKED = f"""\
apiVersion: v1
parameters:
  message: {{default: hello}}
  ref: {{}}
triggers:
- name: generic-webhook
  source:
    type: webhook
    image: relaysh/stdlib-trigger-json
  when: ${{event.action != 'ignored'}}
  binding:
    parameters:
      message: !Data message
      ref: ${{event.pull_request.head.ref}}
steps:
- name: echo
  image: {NOOP}
  spec:
    outputs:
      said: ${{parameters.message + ' on ' + parameters.ref}}
"""
BODY = {"action": "closed", "message": "merged", "pull_request": {"head": {"ref": "main"}, "number": 7}}


def create(api: APIClient, source: str, name: str = "hooked") -> dict:
    response = api.post("/api/workflows/", {"name": name, "source": source}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def hook(url: str, token: str | None, body: bytes | dict, content_type: str = "application/json", **extra):
    """POST to a webhook URL as a sender would (Bearer, or Basic with `basic=True`)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = dict(extra)
    basic = headers.pop("basic", False)
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = (
            "Basic " + base64.b64encode(f"github:{token}".encode()).decode() if basic else f"Bearer {token}"
        )
    path = url.removeprefix(settings.RELAY_PUBLIC_URL)
    return Client().generic("POST", path, data, content_type=content_type, HTTP_HOST="127.0.0.1", **headers)


def test_a_webhook_s_json_body_is_the_event_its_binding_reads(worker, api, ops, bao):
    created = create(api, HOOKED)
    [made] = created["triggers"]
    trigger = Trigger.objects.get(workflow__name="hooked", name="generic-webhook")
    url = f"{settings.RELAY_PUBLIC_URL}/api/webhooks/{trigger.pk}/"
    assert made == {"name": "generic-webhook", "type": "webhook", "token": made["token"], "url": url}
    assert made["token"].startswith("rlyt_") and trigger.kind == "webhook" and trigger.owner == ops
    assert bao.read(f"relay/triggers/{trigger.pk}") == {"token": made["token"]}
    assert made["token"] not in json.dumps(api.get("/api/workflows/hooked/").json())  # shown that once
    assert created["webhook_triggers"] == [
        {
            "name": "generic-webhook",
            "id": str(trigger.pk),
            "token_prefix": trigger.token_prefix,
            "url": url,
            "image": "relaysh/stdlib-trigger-json",
            "passes_through": True,
        }
    ]
    assert created["push_triggers"] == []

    response = hook(url, made["token"], BODY)
    assert response.status_code == 202, response.content
    event = ended(response.json()["id"])
    assert (event.state, event.workflow_start, event.data) == ("matched", "started", BODY)
    run = finished(WorkflowRun.objects.get(event=event))
    assert run.parameters == {"message": "merged", "ref": "main"}
    assert run.outcome == "success", run.message
    assert steps_of(run)["echo"].outputs == {"said": "merged on main"}
    # The event and its body are the trigger's, like a push trigger's.
    detail = api.get(f"/api/triggers/{trigger.pk}/events/{event.pk}/").json()
    assert detail["workflow_run"] == str(run.pk) and detail["data"] == BODY
    assert json.loads(api.get(detail["parts"]["body"]["url"]).getvalue()) == BODY

    # `when` reads the event too; Basic (the token as the URL's password) works as well.
    ignored = ended(hook(url, made["token"], {**BODY, "action": "ignored"}, basic=True).json()["id"])
    assert ignored.workflow_start == "skipped"
    assert ignored.filter_note == "The trigger's `when` is false: no workflow run."
    # A gzipped body is the same event data.
    zipped = hook(url, made["token"], gzip.compress(json.dumps(BODY).encode()), HTTP_CONTENT_ENCODING="gzip")
    assert ended(zipped.json()["id"]).data == BODY
    assert WorkflowRun.objects.count() == 2


def test_the_same_body_twice_is_two_events_and_an_idempotency_key_makes_a_resend_one(worker, api):
    token = create(api, HOOKED)["triggers"][0]["token"]
    url = Trigger.objects.get().webhook_url()
    first, second = (hook(url, token, BODY).json()["id"] for _ in range(2))
    assert first != second
    keyed = [hook(url, token, BODY, HTTP_IDEMPOTENCY_KEY="delivery-72d3").json()["id"] for _ in range(3)]
    assert len(set(keyed)) == 1
    for event_id in (first, second, keyed[0]):
        assert ended(event_id).workflow_start == "started"
    assert WorkflowRun.objects.count() == 3


def test_bad_tokens_are_401_or_403_problems_and_store_nothing(api):
    source = HOOKED.replace(
        "- name: generic-webhook", "- name: push\n  source: {type: push}\n- name: generic-webhook"
    )
    made = {t["name"]: t for t in create(api, source)["triggers"]}
    webhook, push = made["generic-webhook"], made["push"]
    other = create(api, HOOKED, name="other")["triggers"][0]

    response = hook(webhook["url"], None, BODY)
    assert_problem(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert assert_problem(hook(webhook["url"], "rlyt_nonsense", BODY), 401)["detail"] == "Invalid token."
    wrong_secret = (
        webhook["token"][:20] + ("A" if webhook["token"][20] != "A" else "B") + webhook["token"][21:]
    )
    assert_problem(hook(webhook["url"], wrong_secret, BODY), 401)
    # A push trigger's token, or another webhook's, is no key to this URL.
    assert assert_problem(hook(webhook["url"], push["token"], BODY), 401)["detail"] == "Invalid token."
    assert assert_problem(hook(webhook["url"], other["token"], BODY), 401)["detail"] == "Invalid token."
    # And a webhook's token is no push trigger's at /api/events.
    response = Client().post(
        "/api/events",
        json.dumps({"data": BODY}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {webhook['token']}",
    )
    assert webhook["url"] in assert_problem(response, 403)["detail"]
    assert not Event.objects.exists()


@pytest.mark.parametrize(
    ("body", "extra", "status", "detail"),
    [
        (b"{not json", {}, 400, "The body is not valid JSON: "),
        (b"[1, 2]", {}, 400, "The body is an array; a webhook's event is a JSON object"),
        (b'"text"', {}, 400, "The body is str; a webhook's event is a JSON object"),
        (b'{"a": "\xc3\x28"}', {}, 400, "The body is not UTF-8 JSON: "),
        (b"[" * 100_000 + b"]" * 100_000, {}, 400, "The body is nested deeper than 64 levels."),
        # What Python's json reads but the worker could not keep (the event failed with the
        # database's words after a 202), and nesting as deep as the other doors allow.
        (b'{"a": NaN}', {}, 400, "The body is not valid JSON: NaN is not JSON"),
        (b'{"a": [Infinity]}', {}, 400, "The body is not valid JSON: Infinity is not JSON"),
        (b'{"a": 1e400}', {}, 400, "A number is too large for a float64"),
        (b'{"a": ' + b"9" * 400 + b"}", {}, 400, "A number is too large for a float64"),
        (b'{"a": "\\ud800"}', {}, 400, "A string holds a lone surrogate (U+D800)"),
        (b'{"a": {"\\udc00": 1}}', {}, 400, "A key holds a lone surrogate (U+DC00)"),
        (b'{"a": "x\\u0000"}', {}, 400, "A string holds a NUL character (U+0000)"),
        (b'{"a": ' + b"[" * 900 + b"]" * 900 + b"}", {}, 400, "The body is nested deeper than 64 levels."),
        (b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}", {}, 400, "The body is nested deeper than 64 levels."),
        (
            b"{}",
            {"content_type": "text/plain"},
            415,
            "Send a JSON object as application/json, not text/plain.",
        ),
        (b"{}", {"HTTP_CONTENT_ENCODING": "br"}, 415, "Content-Encoding br is not supported; use gzip."),
        (b"not gzip", {"HTTP_CONTENT_ENCODING": "gzip"}, 400, "The gzip body is corrupt"),
        (
            b'{"a": "' + b"x" * (1024 * 1024) + b'"}',
            {},
            413,
            "The body is 1048585 bytes; the most is 1048576.",
        ),
        (
            gzip.compress(b'{"a": "' + b"x" * (1024 * 1024) + b'"}'),
            {"HTTP_CONTENT_ENCODING": "gzip"},
            413,
            "",
        ),
        (b"{}", {"HTTP_IDEMPOTENCY_KEY": "k" * 256}, 400, "At most 255 printable characters."),
        (b"", {}, 415, "Send a JSON object as application/json; the request has no Content-Type."),
    ],
)
def test_bad_bodies_are_4xx_problems_and_store_nothing(api, body, extra, status, detail):
    made = create(api, HOOKED)["triggers"][0]
    content_type = extra.pop("content_type", "application/json")
    problem = assert_problem(hook(made["url"], made["token"], body, content_type, **extra), status)
    assert problem["detail"].startswith(detail), problem["detail"]
    assert not Event.objects.exists()


def test_a_body_nested_64_deep_is_taken(worker, api):
    made = create(api, HOOKED)["triggers"][0]
    body = json.dumps(BODY).encode()[:-1] + b', "x": ' + b"[" * 63 + b"]" * 63 + b"}"
    response = hook(made["url"], made["token"], body)
    assert response.status_code == 202, response.content
    assert ended(response.json()["id"]).workflow_start == "started"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"message": NaN}', "The body is not valid JSON: NaN is not JSON"),
        (
            b'{"message": "\\ud800"}',
            "#/message: A string holds a lone surrogate (U+D800), which is no Unicode text.",
        ),
    ],
)
def test_a_body_stored_before_the_door_refused_it_fails_with_its_reason_not_the_database_s(
    worker, api, body, reason
):
    """Such an event failed with "DataError: invalid input syntax for type json" (a fragment
    of the SQL the database refused), after its 202."""
    create(api, HOOKED)
    trigger = Trigger.objects.get()
    event = ingest.store(
        trigger, io.BytesIO(body), BodyFormat.JSON, hashlib.sha256(body).hexdigest(), len(body)
    )
    failed = ended(str(event.pk))
    assert (failed.state, failed.workflow_start) == ("failed", "")
    assert failed.failure_reason == f"The body is not JSON this service takes: {reason}"
    assert not WorkflowRun.objects.exists()


def test_a_vendor_json_media_type_is_json(worker, api):
    made = create(api, HOOKED)["triggers"][0]
    response = hook(made["url"], made["token"], BODY, "application/vnd.github+json; charset=utf-8")
    assert response.status_code == 202, response.content
    assert ended(response.json()["id"]).workflow_start == "started"


def test_an_image_that_reshapes_requests_is_made_but_its_url_refuses_events_saying_why(api):
    source = HOOKED.replace(
        "relaysh/stdlib-trigger-json", "relaysh/github-trigger-pull-request-merged:latest"
    )
    created = create(api, source)
    [made] = created["triggers"]
    assert created["webhook_triggers"][0]["passes_through"] is False
    problem = assert_problem(hook(made["url"], made["token"], BODY), 409)
    assert problem["detail"].startswith(
        "This webhook trigger's image 'relaysh/github-trigger-pull-request-merged:latest' reshapes "
        "requests into events in a container, and this service runs none"
    )
    assert "relaysh/stdlib-trigger-json" in problem["detail"]
    assert not Event.objects.exists()

    # Any tag or digest of the pass-through image, on Docker Hub by its long name too, passes.
    for image in (
        "relaysh/stdlib-trigger-json:v1",
        "docker.io/relaysh/stdlib-trigger-json@sha256:" + "a" * 64,
    ):
        response = api.put(
            "/api/workflows/hooked/",
            {"source": source.replace("relaysh/github-trigger-pull-request-merged:latest", image)},
            format="json",
        )
        assert response.status_code == 200 and response.json()["triggers"] == []  # the same trigger
        assert hook(made["url"], made["token"], BODY).status_code == 202


def test_a_revision_that_drops_a_webhook_trigger_deletes_it_and_its_token_stops_working(api, bao):
    made = create(api, HOOKED)["triggers"][0]
    trigger = Trigger.objects.get()
    assert hook(made["url"], made["token"], BODY).status_code == 202
    # Renamed to a push trigger of the same name: a new trigger, with a new token.
    response = api.put(
        "/api/workflows/hooked/",
        {"source": HOOKED.replace("type: webhook\n    image: relaysh/stdlib-trigger-json", "type: push")},
        format="json",
    )
    [again] = response.json()["triggers"]
    assert again["type"] == "push" and again["token"] != made["token"] and "url" not in again
    assert not Trigger.objects.filter(pk=trigger.pk).exists() and not Event.objects.exists()
    assert_problem(hook(made["url"], made["token"], BODY), 401)
