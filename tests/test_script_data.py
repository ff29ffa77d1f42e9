"""Data is data, end to end: text that would read secrets and connections were it evaluated
again comes into a run through a webhook's body, a Puppet module's push body (a resource's
title) and the API's run parameters, and through an earlier step's output; a real script step
(a bubblewrap sandbox on a `steps` worker, the engine on its own worker, the step runtime API on
the live server) reads it back with relay_sdk, `ni get`, `ni get -p` and each query language,
verbatim, and reaches no secret or connection its spec does not name. What it does reach is
masked in its log."""

import json

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from scriptsteps.models import LogChunk
from tests.conftest import client_for
from tests.script_helpers import running_script_workers
from tests.test_events_push_body import motd
from tests.test_workflow_triggers import send
from tests.test_workflow_webhooks import hook
from tests.workflow_helpers import ended, finished, steps_of
from triggers.models import Trigger
from workflows.models import Workflow, WorkflowRun, WorkflowSecret

pytestmark = pytest.mark.django_db(transaction=True)

SLACK = "xoxb-1111111111-2222222222222-NamedByTheSpecsEnv"
# Neither the secrets nor the Puppet connection are named by the reading step's spec or env.
HOSTILE = "${secrets.dbpass} / ${connections.puppet['name'].token}"
CARRIED = "${secrets.other}"

DOCUMENT = """
apiVersion: v1
parameters:
  host: {}
  resources: {default: {}}
triggers:
- name: hook
  source: {type: webhook, image: relaysh/stdlib-trigger-json}
  binding:
    parameters:
      host: !Data host
- name: report
  source: {type: push}
  binding:
    parameters:
      host: ${event.host}
      resources: !Data resource_statuses
steps:
- name: carry
  image: relaysh/core
  input:
  - ni output set -k carried -v '${secrets.other}'
- name: read
  image: relaysh/core:latest-python
  dependsOn: carry
  spec:
    host: !Parameter host
    resources: !Parameter resources
    carried: !Output [carry, carried]
    token: !Secret apiToken
  env:
    SLACK_TOKEN: ${connections.slack.x.apiToken}
  input:
  - |
    #!/usr/bin/env python3
    import json, os, subprocess
    from relay_sdk import Interface, Dynamic as D
    from relay_sdk.client import new_session

    relay, api = Interface(), new_session()

    def spec(q, lang):
        return api.get("http+api://api/spec", params={"q": q, "lang": lang})

    def ni(*args):
        return subprocess.run(["ni", *args], capture_output=True, text=True).stdout

    seen = {
        "sdk": relay.get(D.host),
        "sdk carried": relay.get(D.carried),
        "ni": json.loads(ni("get"))["host"],
        "ni -p": ni("get", "-p", "{.host}"),
        "ni -p carried": ni("get", "-p", "{.carried}"),
        "path": spec("host", "path").json()["value"],
        "path-template": spec("${host}", "path-template").json()["value"],
        "jsonpath": spec("$.host", "jsonpath").json()["value"],
        "jsonpath-template": spec("{.host}", "jsonpath-template").json()["value"],
        "titles": [r["title"] for r in relay.get(D.resources).values()],
        "ni -p titles": ni("get", "-p", "{..title}"),
        "literal": relay.get("'${secrets.other}'"),
        "connection": spec("${connections.puppet['name'].token}", "path-template").text,
        "secret": api.get("http+api://api/secrets/other").status_code,
    }
    relay.outputs.set("seen", seen)
    print(json.dumps(seen))
    print("token", relay.get(D.token), "slack", os.environ["SLACK_TOKEN"])
"""


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, bao, live_server, tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    with running_script_workers(django_db_blocker, bao, live_server.url, data) as workers:
        yield workers


@pytest.fixture
def fed(workers, db) -> tuple[User, dict[str, str], list[str]]:
    """The workflow, its owner's secrets and connections; its triggers' tokens; and the
    values the reading step must never see."""
    owner = User.objects.create_user("ops")
    made = client_for(owner).post("/api/workflows/", {"name": "fed", "source": DOCUMENT}, format="json")
    assert made.status_code == 201, made.content
    workflow = Workflow.objects.get(name="fed")
    for name, value in {"dbpass": "db-password-value", "other": "other-secret-value"}.items():
        WorkflowSecret.put(workflow, name, value, owner)
    WorkflowSecret.put(workflow, "apiToken", "api-token-named-by-the-spec", owner)
    SlackConnection.create_with_token(owner=owner, name="x", token=SLACK)
    _, puppet = PuppetConnection.create_with_token(owner=owner, name="name")
    tokens = {t["name"]: t["token"] for t in made.json()["triggers"]}
    return owner, tokens, ["db-password-value", "other-secret-value", str(puppet)]


def log_of(run: WorkflowRun, name: str) -> str:
    chunks = LogChunk.objects.filter(script_id=steps_of(run)[name].pk).order_by("start")
    return "".join(chunks.values_list("text", flat=True))


def assert_read_verbatim(run: WorkflowRun, never: list[str], titles: list[str]) -> None:
    run = finished(run, timeout=90)
    steps = steps_of(run)
    log = log_of(run, "read")
    assert run.outcome == "success", (run.message, steps["read"].message, log, log_of(run, "carry"))
    seen = steps["read"].outputs["seen"]
    read = {k: v for k, v in seen.items() if k not in ("connection", "secret", "titles", "ni -p titles")}
    assert read == {
        "sdk": HOSTILE,
        "sdk carried": CARRIED,
        "ni": HOSTILE,
        "ni -p": HOSTILE,
        "ni -p carried": CARRIED,
        "path": HOSTILE,
        "path-template": HOSTILE,
        "jsonpath": HOSTILE,
        "jsonpath-template": HOSTILE,
        "literal": CARRIED,
    }
    assert seen["titles"] == titles and seen["ni -p titles"] == " ".join(titles)
    assert seen["secret"] == 404 and "could not evaluate" in json.loads(seen["connection"])["detail"]
    # Nothing it was not given, anywhere; what it was given, masked in its log.
    everything = json.dumps(seen) + log + json.dumps(steps["carry"].outputs)
    assert not any(value in everything for value in never), everything
    assert HOSTILE in log and "token *** slack ***" in log, log
    assert "api-token-named-by-the-spec" not in log and SLACK not in log


def test_a_webhook_body_bound_to_a_parameter_is_read_back_verbatim(fed):
    _, tokens, never = fed
    trigger = Trigger.objects.get(workflow__name="fed", name="hook")
    response = hook(
        f"{settings.RELAY_PUBLIC_URL}/api/webhooks/{trigger.pk}/", tokens["hook"], {"host": HOSTILE}
    )
    assert response.status_code == 202, response.content
    event = ended(response.json()["id"])
    assert event.workflow_start == "started", (event.state, event.failure_reason, event.filter_note)
    run = WorkflowRun.objects.get(event=event)
    assert run.parameters == {"host": HOSTILE, "resources": {}}
    assert_read_verbatim(run, never, [])


def test_a_puppet_push_body_s_host_and_resource_title_are_read_back_verbatim(fed):
    _, tokens, never = fed
    body = motd(noop=False, pending=False)
    body["host"] = HOSTILE
    resource = body["resource_statuses"].pop("File[/etc/motd]")
    title = "${secrets.dbpass}"
    body["resource_statuses"][f"File[{title}]"] = {**resource, "title": title}
    event = ended(send(tokens["report"], body))
    assert event.workflow_start == "started", (event.state, event.failure_reason, event.filter_note)
    run = WorkflowRun.objects.get(event=event)
    assert run.parameters["host"] == HOSTILE
    assert_read_verbatim(run, never, [title])


def test_a_run_started_over_the_api_reads_its_parameters_back_verbatim(fed):
    owner, _, never = fed
    resources = {
        "Exec[${connections.puppet['name'].token}]": {"title": "${connections.puppet['name'].token}"}
    }
    response = client_for(owner).post(
        "/api/workflows/fed/runs/", {"parameters": {"host": HOSTILE, "resources": resources}}, format="json"
    )
    assert response.status_code == 201, response.content
    run = WorkflowRun.objects.get(pk=response.json()["id"])
    assert_read_verbatim(run, never, ["${connections.puppet['name'].token}"])


AWS = {"accessKeyID": "AKIAEXAMPLEKEY12345", "secretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
TAKEN_APART = """
apiVersion: v1
steps:
- name: aws
  image: relaysh/core
  spec:
    aws: !Fn.jsonUnmarshal [!Secret aws]
  input:
  - echo "id $(ni get -p '{.aws.accessKeyID}') key $(ni get -p '{.aws.secretAccessKey}')"
  - ni get | jq -r .aws.secretAccessKey
"""


def test_a_secret_the_step_takes_apart_is_masked_part_by_part(workers, db):
    """A secret holding JSON (AWS keys, as relay's own examples keep them) reaches the step
    as its parts, which it may print one by one."""
    owner = User.objects.create_user("ops")
    made = client_for(owner).post("/api/workflows/", {"name": "aws", "source": TAKEN_APART}, format="json")
    assert made.status_code == 201, made.content
    WorkflowSecret.put(Workflow.objects.get(name="aws"), "aws", json.dumps(AWS), owner)
    started = client_for(owner).post("/api/workflows/aws/runs/", {"parameters": {}}, format="json")
    run = finished(WorkflowRun.objects.get(pk=started.json()["id"]), timeout=60)
    log = log_of(run, "aws")
    assert run.outcome == "success", (run.message, log)
    assert log == "id *** key ***\n***\n", log


def test_a_secret_with_characters_go_s_json_escapes_is_masked_in_ni_get_s_json(workers, db):
    """`ni get` prints the spec as Go's encoding/json does: `<`, `>` and `&` as \\u003c,
    \\u003e and \\u0026, which a password often has."""
    owner = User.objects.create_user("ops")
    source = (
        "apiVersion: v1\nsteps:\n- name: s\n  image: relaysh/core\n  spec: {password: !Secret p}\n"
        "  input: [ni get]\n"
    )
    made = client_for(owner).post("/api/workflows/", {"name": "amp", "source": source}, format="json")
    assert made.status_code == 201, made.content
    WorkflowSecret.put(Workflow.objects.get(name="amp"), "p", "pa&ss<wo>rd-123", owner)
    started = client_for(owner).post("/api/workflows/amp/runs/", {"parameters": {}}, format="json")
    run = finished(WorkflowRun.objects.get(pk=started.json()["id"]), timeout=60)
    log = log_of(run, "s")
    assert run.outcome == "success", (run.message, log)
    assert log == '{"password":"***"}', log
