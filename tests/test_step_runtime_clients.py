"""The step runtime API against its real clients on a live server: the official relay_sdk
0.3.1 from PyPI, unmodified, and `ni` (stepruntime/bin/ni) as a step's shell runs it."""

import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from relay_sdk import Dynamic as D
from relay_sdk import Interface
from relay_sdk.interface import UnresolvableException

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from stepruntime.models import EmittedEvent
from tests.conftest import client_for
from tests.runtime_helpers import Running, later_step_outputs, start_step
from tests.workflow_helpers import make_workflow
from workflows import engine
from workflows.models import StepRun, WorkflowRun, WorkflowSecret

NI = Path(__file__).resolve().parent.parent / "stepruntime" / "bin" / "ni"

SOURCE = """
apiVersion: v1
parameters:
  who: {default: world}
steps:
- name: a
  image: relaysh/core:latest-python
  spec:
    greeting: !Fn.concat ["hello ", !Parameter who]
    token: !Secret apiToken
    resourceStatuses:
      - {title: "/tmp/x", corrective_change: true, containment_path: ["Stage[main]", "File[/tmp/x]"]}
    count: 1000000
    later: !Output [z, never]
  env: {WHO: !Parameter who}
- name: b
  image: relay-internal/noop
  spec:
    outputs:
      fromSdk: !Output [a, fromSdk]
      word: !Output [a, word]
      doc: !Output [a, doc]
  dependsOn: a
- name: z
  image: relaysh/core
"""


@pytest.fixture
def held(transactional_db, alice, live_server) -> Running:
    workflow = make_workflow(alice, SOURCE)
    WorkflowSecret.put(workflow, "apiToken", "s3cret-value", alice)
    make_workflow(
        alice, "apiVersion: v1\nparameters: {n: {}}\nsteps:\n- {name: s, image: relaysh/core}\n", "child"
    )
    run = engine.create_run(workflow, {"who": "relay"}, created_by=alice)
    return start_step(run, "a", base=live_server.url)


def ni(held: Running, *args: str, shell: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{NI.parent}:/usr/bin:/bin", "METADATA_API_URL": held.url}
    command = ["bash", "-c", shell] if shell else [str(NI), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


# relay_sdk ------------------------------------------------------------------------------------


def test_the_sdk_reads_the_spec(held):
    relay = Interface(api_url=held.url)
    assert relay.get(D.greeting) == "hello relay"
    assert relay.get(D.token) == "s3cret-value"
    assert relay.get(D.resourceStatuses)[0]["containment_path"][1] == "File[/tmp/x]"
    with pytest.raises(UnresolvableException):
        relay.get()  # `later` waits for an output that is not there
    with pytest.raises(UnresolvableException):
        relay.get(D.later)


def test_the_sdk_reads_its_url_from_the_environment(held, monkeypatch):
    monkeypatch.setenv("METADATA_API_URL", held.url)
    assert Interface().get(D.count) == 1000000


def test_the_sdk_sets_outputs_events_and_decorators_and_runs_a_workflow(held, alice):
    relay = Interface(api_url=held.url)
    relay.outputs.set("fromSdk", {"changes": ["File[/tmp/x]"], "n": 2})
    relay.outputs.set("word", "plain")
    relay.outputs.set("doc", b"bytes too")
    relay.events.emit({"host": "node1"}, key="k-1")
    relay.decorators.set_link("pr", "The pull request", "https://example.com/pr/7")
    run = relay.workflows.run("child", {"n": 5})
    assert run.name == "child" and run.run_number == 1 and run.app_url.endswith("/")
    child = WorkflowRun.objects.get(workflow__name="child")
    assert child.parameters == {"n": 5} and child.created_by == alice

    step = StepRun.objects.get(pk=held.step.pk)
    assert step.decorators == {
        "pr": {"type": "link", "description": "The pull request", "uri": "https://example.com/pr/7"}
    }
    assert list(EmittedEvent.objects.values_list("key", "data")) == [("k-1", {"host": "node1"})]
    held.end()
    assert later_step_outputs(held.run, "b") == {
        "fromSdk": {"changes": ["File[/tmp/x]"], "n": 2},
        "word": "plain",
        "doc": "bytes too",
    }


def test_the_sdk_is_refused_once_the_step_ended(held):
    relay = Interface(api_url=held.url)
    held.end()
    with pytest.raises(requests.HTTPError) as caught:
        relay.get(D.greeting)
    assert caught.value.response.status_code == 401
    assert caught.value.response.headers["Content-Type"] == "application/problem+json"
    with pytest.raises(requests.HTTPError):
        relay.outputs.set("late", 1)


def test_the_sdk_cannot_run_another_users_workflow(held, bob):
    make_workflow(bob, "apiVersion: v1\nsteps:\n- {name: s, image: relaysh/core}\n", "bobs")
    with pytest.raises(requests.HTTPError) as caught:
        Interface(api_url=held.url).workflows.run("bobs")
    assert caught.value.response.status_code == 404


# ni ---------------------------------------------------------------------------------------------


def test_ni_get_prints_the_spec_as_json(held):
    done = ni(held, "get")
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert spec["greeting"] == "hello relay" and spec["count"] == 1000000
    assert list(spec) == sorted(spec)  # encoding/json: keys sorted


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_ni_get_piped_into_jq_as_published_workflows_do(held):
    script = (
        "ni get | jq -r '.resourceStatuses | map(select(.corrective_change == true)) "
        '| map(.containment_path[-1]) | join(",")\''
    )
    done = ni(held, shell=script)
    assert (done.returncode, done.stdout.strip()) == (0, "File[/tmp/x]"), done.stderr


def test_ni_get_with_a_path(held):
    assert ni(held, "get", "-p", "{.greeting}").stdout == "hello relay"
    # Whole numbers stay whole (relay-core's float64 would print 1e+06).
    assert ni(held, "get", "--path", "{.count}").stdout == "1000000"
    assert ni(held, "get", "-p", "{.resourceStatuses[0].title}").stdout == "/tmp/x"
    assert ni(held, "get", "-p", "{.nothing}").stdout == ""
    done = ni(held, shell='echo "Hi $(ni get -p {.greeting})!"')
    assert done.stdout == "Hi hello relay!\n"


def test_ni_sets_outputs_that_a_later_step_reads(held):
    assert (
        ni(held, "output", "set", "-k", "word", "-v", "two words").stdout
        == 'Successfully set output for "word".\n'
    )
    assert ni(held, "output", "set", "--key", "doc", "--value", '{"a": [1, 2]}', "--json").returncode == 0
    assert ni(held, "output", "set", "-k", "fromSdk", "-v", "7", "--json").returncode == 0
    bad = ni(held, "output", "set", "-k", "x", "-v", "{nope", "--json")
    assert bad.returncode == 1 and "JSON decoding error" in bad.stderr
    assert ni(held, "output", "get", "-n", "a", "-k", "word").stdout == "two words"
    assert ni(held, "output", "get", "-n", "a", "-k", "doc").stdout == '{"a":[1,2]}'
    held.end()
    assert later_step_outputs(held.run, "b") == {"fromSdk": 7, "word": "two words", "doc": {"a": [1, 2]}}


def test_sensitive_outputs_from_the_sdk_and_ni_are_never_shown_to_people(held, alice):
    api = client_for(alice)

    def shown() -> dict:
        steps = api.get(f"/api/workflow-runs/{held.run.pk}/").json()["steps"]
        return next(s["outputs"] for s in steps if s["name"] == "a")

    relay = Interface(api_url=held.url)
    # relay_sdk 0.3.1 has no call for the mark: its session sends relay-core's PUT, here
    # after the value; until the step ends nobody sees what it may still mark.
    relay.outputs.set("word", "s3nsitive-w0rd")
    relay.outputs.set("fromSdk", 7)
    assert shown() == {"word": "***", "fromSdk": "***"}
    relay._client.put("http+api://api/outputs/word/metadata", json={"sensitive": True}).raise_for_status()
    assert ni(held, "output", "set", "-k", "doc", "--sensitive", "-v", "ni-s3cret-doc").returncode == 0
    assert ni(held, "output", "get", "-n", "a", "-k", "doc").stdout == "ni-s3cret-doc"  # steps read it
    held.end()
    assert shown() == {"word": "***", "fromSdk": 7, "doc": "***"}


def test_ni_other_subcommands(held, tmp_path):
    assert ni(held, "metadata", "get", "env", "var", "WHO").stdout == "relay"
    assert json.loads(ni(held, "md", "get", "env", "vars").stdout) == {"WHO": "relay"}
    done = ni(held, "decorator", "set", "link", "-n", "pr", "-v", "description=PR", "-v", "uri=https://e.x/1")
    assert done.returncode == 0, done.stderr
    assert StepRun.objects.get(pk=held.step.pk).decorators["pr"]["uri"] == "https://e.x/1"
    ran = ni(held, "workflow", "run", "-n", "child", "-p", "n=3", "-o", "json")
    assert json.loads(ran.stdout)["workflow_run"]["name"] == "child", ran.stderr
    target = tmp_path / "spec.json"
    assert ni(held, "file", "-f", str(target), "-p", "greeting", "-o", "json").returncode == 0
    assert target.read_text() == '"hello relay"'
    logged = ni(held, "log", "warn", "careful", "now")
    assert (logged.returncode, logged.stderr) == (0, "careful now\n")
    assert ni(held, "log", "fatal", "stop").returncode == 1


def test_ni_fails_clearly_without_a_url_or_once_the_step_ended(held):
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(NI), "get"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "METADATA_API_URL" in done.stderr
    held.end()
    done = ni(held, "output", "set", "-k", "late", "-v", "1")
    assert done.returncode == 1 and "401" in done.stderr and "expired" in done.stderr


def test_ni_runs_with_the_system_python_alone(held):
    """The sandbox has Debian's python3 and no venv: ni imports the standard library only."""
    env = {"PATH": "/usr/bin:/bin", "METADATA_API_URL": held.url, "PYTHONNOUSERSITE": "1"}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", str(NI), "get", "-p", "{.greeting}"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (0, "hello relay"), done.stderr
    assert os.access(NI, os.X_OK)


# Data is data, and a step reads nothing its spec does not name ---------------------------------

SLACK = "xoxb-1111111111-2222222222222-DataIsDataNotAToken"
# What a webhook's body or a pull request's title can hold: evaluated again, it would read the
# workflow's secret and its owner's connections, none of which the step's spec names.
HOSTILE = "${secrets.dbpass} / ${connections.slack['x'].apiToken} / ${connections.puppet['name'].token}"

FED = """
apiVersion: v1
parameters:
  host: {}
  doc: {}
steps:
- name: a
  image: relaysh/core
- name: b
  image: relaysh/core:latest-python
  spec:
    host: !Parameter host
    doc: !Parameter doc
    title: !Fn.path [!Parameter doc, title]
    carried: !Output [a, carried]
  env: {HOST: !Parameter host}
"""


@pytest.fixture
def fed(transactional_db, alice, live_server) -> tuple[Running, list[str]]:
    """Step b of a run started over the API with HOSTILE as its parameters, after step a set
    an output holding `${secrets.other}` with ni; and the values b must never see."""
    workflow = make_workflow(alice, FED, "fed")
    WorkflowSecret.put(workflow, "dbpass", "db-password-value", alice)
    WorkflowSecret.put(workflow, "other", "other-secret-value", alice)
    SlackConnection.create_with_token(owner=alice, name="x", token=SLACK)
    _, puppet = PuppetConnection.create_with_token(owner=alice, name="name")
    doc = {"title": HOSTILE, "ref": {"$type": "Secret", "name": "dbpass"}}
    started = client_for(alice).post(
        "/api/workflows/fed/runs/", {"parameters": {"host": HOSTILE, "doc": doc}}, format="json"
    )
    assert started.status_code == 201, started.content
    run = WorkflowRun.objects.get(pk=started.json()["id"])
    a = start_step(run, "a", base=live_server.url)
    assert ni(a, "output", "set", "-k", "carried", "-v", "${secrets.other}").returncode == 0
    a.end()
    return start_step(run, "b", base=live_server.url), [
        "db-password-value",
        "other-secret-value",
        SLACK,
        str(puppet),
    ]


def test_the_sdk_and_ni_read_data_verbatim(fed):
    b, never = fed
    relay = Interface(api_url=b.url)
    assert relay.get(D.host) == HOSTILE
    assert relay.get(D.doc.title) == HOSTILE
    assert relay.get(D.title) == HOSTILE
    assert relay.get(D.doc.ref) == {"$type": "Secret", "name": "dbpass"}
    assert relay.get(D.carried) == "${secrets.other}"
    whole = relay.get()
    assert whole["host"] == HOSTILE and whole["carried"] == "${secrets.other}"
    assert json.loads(ni(b, "get").stdout) == whole
    assert ni(b, "get", "-p", "{.host}").stdout == HOSTILE
    assert ni(b, "get", "-p", "{.doc.title}").stdout == HOSTILE
    assert ni(b, "get", "-p", "{.carried}").stdout == "${secrets.other}"
    assert ni(b, "metadata", "get", "env", "var", "HOST").stdout == HOSTILE
    outputs = [
        ni(b, "get").stdout,
        ni(b, "get", "-p", "{.doc}").stdout,
        json.dumps(relay.get(D.doc)),
        ni(b, "md", "get", "env", "vars").stdout,
    ]
    for text in outputs:
        assert not any(value in text for value in never), text


def origin(held: Running) -> str:
    parts = urlsplit(held.url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}"


def test_a_query_reads_no_secret_or_connection_the_spec_does_not_name(fed):
    b, never = fed
    relay = Interface(api_url=b.url)
    # relay_sdk sends a string as it is: the path language, here a string literal.
    assert relay.get("'${secrets.other}'") == "${secrets.other}"
    assert relay.get("\"${connections.slack['x'].apiToken}\"") == "${connections.slack['x'].apiToken}"
    session = requests.Session()
    session.auth = (b.token, "")
    for q, lang in [
        ("${connections.puppet['name'].token}", "path-template"),
        ("${secrets.other}", "path-template"),
        ("${'${secrets.other}'}", "path-template"),
        ("connections.puppet.name.token", "path"),
        ('{"${secrets.other}"}', "jsonpath-template"),
        ("$.secrets", "jsonpath"),
    ]:
        response = session.get(f"{origin(b)}/spec", params={"q": q, "lang": lang})
        assert response.status_code in (200, 422), response.text
        assert not any(value in response.text for value in never), (q, lang, response.text)
    assert ni(b, "get", "-p", '{"${secrets.other}"}').stdout == "${secrets.other}"
    assert session.get(f"{origin(b)}/secrets/other").status_code == 404
