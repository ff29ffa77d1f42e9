"""A workflow's push triggers, on real worker processes: made with the workflow (token shown
once, kept in Vault), an event they match starts a run with the parameters their binding
takes from the event's data, once per event; `when` false starts none and the event says
why; a revision that drops a trigger deletes it (its token stops working)."""

import json
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import client_for, run_concurrently
from tests.events_helpers import (
    big_report,
    fixture,
    install_module_like_processor,
    post,
    puppet_apply,
)
from tests.slack_standin import SlackStandIn
from tests.test_connection_api import assert_problem
from tests.test_event_data import as_json
from tests.test_events_push_body import PlainLoader, motd, push_data
from tests.workflow_helpers import NOOP, ended, finished, steps_of, vault_worker, wait_until
from triggers.models import Event, Trigger
from triggers.tasks import requeue_received_before
from workflows import services, tasks
from workflows.models import Workflow, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = Path(__file__).parent / "fixtures"
PUPPET_8 = "puppet-8.4-jacobbrewer1-puppet-summary-example.yaml"
WAYS = ("yaml", "push", "json")


SLACK_TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"


@pytest.fixture(scope="module")
def slack(tmp_path_factory):
    """The Slack stand-in's chat.postMessage, with a #puppet channel and a bot token it knows."""
    standin = SlackStandIn(tmp_path_factory.mktemp("slack"))
    standin.tokens.add(SLACK_TOKEN)
    standin.channels["C0PUPPET01"] = "puppet"
    yield standin
    standin.close()


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, bao, slack, tmp_path_factory):
    """One worker of two processes for the module: it reads the events and runs the workflows,
    and its Slack step posts to the stand-in."""
    log_path = tmp_path_factory.mktemp("triggers") / "worker.log"
    with vault_worker(django_db_blocker, bao, log_path, **slack.worker_env(SLACK_TOKEN)) as process:
        yield process


@pytest.fixture
def ops(db) -> User:
    return User.objects.create_user("ops")


@pytest.fixture
def api(ops: User) -> APIClient:
    return client_for(ops)


# The RFC's first workflow's trigger: who changed, and what.
REPORTED = f"""\
apiVersion: v1
parameters:
  host: {{description: The node that sent the report}}
  noop: {{default: false}}
  changed: {{description: The resources that changed}}
triggers:
- name: puppet-report
  source:
    type: push
  binding:
    parameters:
      host: !Data host
      noop: ${{event.noop}}
      changed: !Data resource_statuses
steps:
- name: tell
  image: {NOOP}
  spec:
    outputs:
      said: ${{parameters.host + ' changed'}}
      resources: !Parameter changed
"""


def create(api: APIClient, source: str, name: str = "reported") -> dict:
    response = api.post("/api/workflows/", {"name": name, "source": source}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def send(token: str, data: dict) -> str:
    """The module's push body (Bearer), as its report processor sends it; the event's id."""
    response = post(token, json.dumps({"data": data}).encode(), "application/json", basic=False)
    assert response.status_code == 202, response.content
    return response.json()["id"]


def test_a_push_trigger_s_event_starts_a_run_with_the_bound_parameters(worker, api, ops, bao):
    created = create(api, REPORTED)
    [made] = created["triggers"]
    assert (made["name"], made["type"]) == ("puppet-report", "push") and made["token"].startswith("rlyt_")
    trigger = Trigger.objects.get(workflow__name="reported", name="puppet-report")
    assert trigger.owner == ops and bao.read(f"relay/triggers/{trigger.pk}") == {"token": made["token"]}
    assert created["push_triggers"] == [
        {"name": "puppet-report", "id": str(trigger.pk), "token_prefix": trigger.token_prefix}
    ]
    shown = api.get("/api/workflows/reported/").json()
    assert shown["triggers"] == [] and made["token"] not in json.dumps(shown)  # shown that once

    event = ended(send(made["token"], motd(noop=False, pending=False)))
    assert (event.state, event.workflow_start) == ("matched", "started")
    run = finished(WorkflowRun.objects.get(event=event))
    assert run.parameters == {
        "host": "web1.example.com",
        "noop": False,
        "changed": motd(noop=False, pending=False)["resource_statuses"],
    }
    assert run.outcome == "success", run.message
    assert steps_of(run)["tell"].outputs == {
        "said": "web1.example.com changed",
        "resources": run.parameters["changed"],
    }
    detail = api.get(f"/api/triggers/{trigger.pk}/events/{event.pk}/").json()
    assert detail["workflow_run"] == str(run.pk) and detail["workflow_start"] == "started"
    assert detail["data"]["host"] == "web1.example.com"
    assert api.get(f"/api/workflow-runs/{run.pk}/").json()["event"] == str(event.pk)


def test_a_when_that_is_false_starts_no_run_and_the_event_says_why(worker, api):
    source = REPORTED.replace("  binding:\n", "  when: !Fn.equals [!Data status, failed]\n  binding:\n")
    token = create(api, source)["triggers"][0]["token"]
    event = ended(send(token, motd(noop=False, pending=False)))
    assert (event.state, event.workflow_start) == ("matched", "skipped")
    assert event.filter_note == "The trigger's `when` is false: no workflow run."
    assert not WorkflowRun.objects.exists()

    failed = {**motd(noop=False, pending=False), "status": "failed", "transaction_uuid": str(uuid.uuid4())}
    started = ended(send(token, failed))
    assert started.workflow_start == "started" and WorkflowRun.objects.get().event == started


def test_a_when_that_cannot_be_decided_starts_no_run_and_says_why(worker, api):
    source = REPORTED.replace("  binding:\n", "  when:\n  - true\n  - ${event.report.noop}\n  binding:\n")
    token = create(api, source)["triggers"][0]["token"]
    event = ended(send(token, motd(noop=False, pending=False)))
    assert event.workflow_start == "skipped" and not WorkflowRun.objects.exists()
    assert event.filter_note.startswith("Condition 2 of the trigger's `when` could not be decided:")
    assert "unknown key report" in event.filter_note


def test_a_missing_parameter_fails_the_run_and_a_failed_binding_says_which(worker, api):
    # puppet-run-emit-data binds `!Data report.host`: the module's older body had `report`.
    source = REPORTED.replace("host: !Data host", "host: !Data report.host")
    token = create(api, source)["triggers"][0]["token"]
    event = ended(send(token, motd(noop=False, pending=False)))
    run = finished(WorkflowRun.objects.get(event=event))
    assert (run.outcome, event.workflow_start) == ("failure", "started")
    assert run.message.startswith(
        "Missing required parameters: host. The trigger's binding of 'host' failed:"
    )
    assert "unknown key report" in run.message
    assert {step.status for step in steps_of(run).values()} == {"skipped"}


def test_a_resent_report_and_a_task_delivered_many_times_make_one_run(worker, api, ops):
    token = create(api, REPORTED)["triggers"][0]["token"]
    body = motd(noop=False, pending=False)
    first = ended(send(token, body))
    # Sent again (the same body, or the same run's transaction_uuid): the same event.
    assert send(token, body) == str(first.pk)
    assert send(token, {**body, "time": "2026-11-21T10:00:01+00:00"}) == str(first.pk)
    assert first.workflow_start == "started" and WorkflowRun.objects.filter(event=first).count() == 1

    # One more event, still pending, whose start is delivered 20 times to the worker and
    # asked for by 8 threads here at the same instant.
    event = Event.objects.create(
        trigger=first.trigger,
        state="matched",
        body_format="json",
        body_sha256="0" * 64,
        body_size=1,
        data={**body, "host": "web2.example.com"},
        workflow_start="pending",
    )
    for _ in range(20):
        tasks.start_run_for_event.delay(str(event.pk))
    results = run_concurrently(8, lambda i: services.start_run_for_event(str(event.pk)))
    wait_until(lambda: Event.objects.get(pk=event.pk).workflow_start == "started")
    started = [r for r in results if isinstance(r, WorkflowRun)]
    assert len(started) <= 1 and not [r for r in results if isinstance(r, Exception)]
    assert WorkflowRun.objects.filter(event=event).count() == 1
    assert WorkflowRun.objects.count() == 2
    # And the database holds the link unique whoever writes it.
    with pytest.raises(IntegrityError), transaction.atomic():
        run = WorkflowRun.objects.get(event=event)
        WorkflowRun.objects.create(workflow=run.workflow, revision=run.revision, event=event)


def test_a_run_whose_start_was_lost_is_started_by_the_sweeper(worker, api):
    token = create(api, REPORTED)["triggers"][0]["token"]
    first = ended(send(token, motd(noop=False, pending=False)))
    lost = Event.objects.create(
        trigger=first.trigger,
        state="matched",
        body_format="json",
        body_sha256="0" * 64,
        body_size=1,
        data=first.data,
        processed_at=first.processed_at,
        workflow_start="pending",
    )
    requeue_received_before(first.processed_at.replace(year=first.processed_at.year + 1))
    wait_until(lambda: WorkflowRun.objects.filter(event=lost).exists())


def test_a_revision_makes_new_triggers_deletes_dropped_ones_and_keeps_the_rest(worker, api, bao):
    two = REPORTED.replace(
        "steps:\n",
        "- name: second\n  source: {type: push}\n  binding: {parameters: {host: !Data host}}\nsteps:\n",
    )
    made = {t["name"]: t["token"] for t in create(api, two)["triggers"]}
    assert sorted(made) == ["puppet-report", "second"]
    second = Trigger.objects.get(name="second")

    third = two.replace("- name: second\n", "- name: third\n")
    response = api.put("/api/workflows/reported/", {"source": third}, format="json")
    assert response.status_code == 200, response.content
    [new] = response.json()["triggers"]
    assert new["name"] == "third" and new["token"].startswith("rlyt_")
    assert sorted(t["name"] for t in response.json()["push_triggers"]) == ["puppet-report", "third"]

    # The dropped trigger's token stops working; the kept one's works as before.
    gone = post(
        made["second"], json.dumps({"data": motd(noop=False, pending=False)}).encode(), "application/json"
    )
    assert_problem(gone, 401)
    assert not Trigger.objects.filter(pk=second.pk).exists()
    wait_until(lambda: bao.read(f"relay/triggers/{second.pk}") is None)
    kept = ended(send(made["puppet-report"], motd(noop=False, pending=False)))
    assert kept.workflow_start == "started" and WorkflowRun.objects.get(event=kept).revision.number == 2
    assert ended(send(new["token"], motd(noop=True, pending=True))).workflow_start == "started"


def test_a_workflow_trigger_keeps_its_filters_and_the_default_rule(worker, api):
    token = create(api, REPORTED)["triggers"][0]["token"]
    trigger = Trigger.objects.get(name="puppet-report")
    # No filters: the module's own rule (an unchanged run without noop changes pending is dropped).
    unchanged = ended(send(token, motd(noop=True, pending=False)))
    assert (unchanged.state, unchanged.workflow_start) == ("filtered", "")
    assert unchanged.filter_note == "Unchanged, with no noop change pending."

    patched = api.patch(f"/api/triggers/{trigger.pk}/", {"statuses": ["failed"]}, format="json")
    assert patched.status_code == 200 and patched.json()["workflow"] == "reported"
    changed = ended(send(token, motd(noop=False, pending=False)))
    assert (changed.state, changed.workflow_start) == ("filtered", "")
    assert not WorkflowRun.objects.exists()


def test_the_triggers_api_leaves_a_workflow_s_trigger_s_name_and_life_to_the_workflow(api):
    create(api, REPORTED)
    trigger = Trigger.objects.get(name="puppet-report")
    renamed = api.patch(f"/api/triggers/{trigger.pk}/", {"name": "other"}, format="json")
    assert renamed.status_code == 400 and "document" in renamed.json()["errors"][0]["detail"]
    deleted = api.delete(f"/api/triggers/{trigger.pk}/")
    assert assert_problem(deleted, 409)["detail"].startswith(
        "This push trigger belongs to workflow 'reported'"
    )
    # A trigger of its own may have the same name: names are per workflow.
    own = api.post("/api/triggers/", {"name": "puppet-report"}, format="json")
    assert own.status_code == 201, own.content
    assert api.post("/api/triggers/", {"name": "puppet-report"}, format="json").status_code == 400


def test_deleting_the_workflow_deletes_its_triggers_and_their_tokens(api, bao):
    token = create(api, REPORTED)["triggers"][0]["token"]
    trigger = Trigger.objects.get(name="puppet-report")
    assert api.delete("/api/workflows/reported/").status_code == 204
    assert not Trigger.objects.filter(pk=trigger.pk).exists()
    wait_until(lambda: bao.read(f"relay/triggers/{trigger.pk}") is None)
    assert post(token, b'{"data": {"host": "a"}}', "application/json").status_code == 401


def test_a_push_trigger_name_too_long_for_its_row_is_a_document_error(api):
    source = REPORTED.replace("name: puppet-report", f"name: {'t' * 65}")
    body = assert_problem(api.post("/api/workflows/", {"name": "long", "source": source}, format="json"), 400)
    assert body["errors"] == [
        {
            "pointer": "#/triggers/0/name",
            "line": 7,
            "column": 9,
            "detail": "A push trigger's name is at most 64 characters here.",
        }
    ]
    assert not Workflow.objects.exists() and not Trigger.objects.exists()


def test_schedule_and_webhook_triggers_make_no_push_trigger(api):
    source = REPORTED.replace(
        "steps:\n",
        "- name: nightly\n  source: {type: schedule, schedule: '0 3 * * *'}\n"
        "- name: hook\n  source: {type: webhook, image: relaysh/stdlib-trigger-json}\nsteps:\n",
    )
    made = create(api, source)
    assert [(t["name"], t["type"]) for t in made["triggers"]] == [
        ("puppet-report", "push"),
        ("hook", "webhook"),
    ]
    assert [t["name"] for t in made["push_triggers"]] == ["puppet-report"]
    assert sorted(Trigger.objects.values_list("name", "kind")) == [
        ("hook", "webhook"),
        ("puppet-report", "push"),
    ]


# Binding the same paths whichever way the report came -----------------------------------------

# Every field of the module's body, bound by either notation, one trigger per way it comes.
EVERY_FIELD = f"""\
apiVersion: v1
parameters:
  host: {{}}
  noop: {{}}
  status: {{}}
  time: {{}}
  configuration_version: {{}}
  transaction_uuid: {{}}
  code_id: {{}}
  resourceStatuses: {{}}
  headline: {{}}
triggers:
- name: yaml
  source: {{type: push}}
  binding: &binding
    parameters:
      host: !Data host
      noop: !Data noop
      status: ${{event.status}}
      time: !Data time
      configuration_version: !Data configuration_version
      transaction_uuid: ${{event.transaction_uuid}}
      code_id: !Data code_id
      resourceStatuses: !Data resource_statuses
      headline: "${{event.host}} ${{event.status}} at ${{event.time}}"
- name: push
  source: {{type: push}}
  binding: *binding
- name: json
  source: {{type: push}}
  binding: *binding
steps:
- name: done
  image: {NOOP}
"""


def runs_by_way(tokens: dict[str, str], bodies: dict[str, tuple[bytes, str]]) -> dict[str, dict]:
    parameters = {}
    for way, (body, content_type) in bodies.items():
        response = post(tokens[way], body, content_type, basic=False)
        assert response.status_code == 202, response.content
        event = ended(response.json()["id"])
        assert event.workflow_start == "started", (event.state, event.failure_reason, event.filter_note)
        parameters[way] = WorkflowRun.objects.get(event=event).parameters
    return parameters


def test_a_yaml_report_a_json_report_and_a_push_body_bind_the_same_values(worker, api):
    tokens = {t["name"]: t["token"] for t in create(api, EVERY_FIELD)["triggers"]}
    report = yaml.load(fixture(PUPPET_8), Loader=PlainLoader)
    bound = runs_by_way(
        tokens,
        {
            "yaml": (fixture(PUPPET_8), "application/x-yaml"),
            "json": (as_json(fixture(PUPPET_8)), "application/json"),
            "push": (json.dumps({"data": push_data(report)}).encode(), "application/json"),
        },
    )
    assert bound["yaml"] == bound["json"] == bound["push"]
    assert bound["yaml"]["headline"] == "example-host changed at 2024-02-17T02:00:09+00:00"
    assert bound["yaml"]["configuration_version"] == 1708135209 and bound["yaml"]["code_id"] is None
    assert list(bound["yaml"]["resourceStatuses"]) == ["Exec[example-command1]"]


def test_the_published_selective_enforcement_workflow_binds_a_yaml_report(worker, api):
    source = (FIXTURES / "relay-workflows" / "puppet-selective-enforcement.yaml").read_text()
    token = create(api, source, "selective")["triggers"][0]["token"]
    response = post(token, big_report(3, host="web3.example.com"), basic=False)
    event = ended(response.json()["id"])
    run = WorkflowRun.objects.get(event=event)
    assert run.parameters["host"] == "web3.example.com" and run.parameters["noop"] is False
    assert sorted(run.parameters["resourceStatuses"]) == [f"File[/srv/www/{i}.html]" for i in range(3)]
    assert run.parameters["resourceStatuses"]["File[/srv/www/0.html]"]["change_count"] == 1


@pytest.mark.skipif(shutil.which("puppet") is None, reason="puppet-agent is not installed")
def test_a_real_puppet_run_binds_the_same_values_every_way_it_comes(
    worker, api, live_server, tmp_path, monkeypatch
):
    """One `puppet apply`: Puppet's http processor sends the YAML report; a processor that
    does what the module's does sends the push body, and Puppet's JSON report."""
    tokens = {t["name"]: t["token"] for t in create(api, EVERY_FIELD)["triggers"]}
    url = f"http://127.0.0.1:{urlparse(live_server.url).port}/api/events"
    monkeypatch.setenv("RELAY_TEST_EVENTS_URL", url)
    monkeypatch.setenv("RELAY_TEST_PUSH_TOKEN", tokens["push"])
    monkeypatch.setenv("RELAY_TEST_JSON_TOKEN", tokens["json"])
    install_module_like_processor(tmp_path)
    target = tmp_path / "motd"
    manifest = (
        f"class profile::motd {{\n  file {{ '{target}': content => \"{uuid.uuid4()}\\n\" }}\n}}\n"
        "include profile::motd\n"
    )
    reporturl = url.replace("http://", f"http://x:{tokens['yaml']}@")
    run = puppet_apply(tmp_path, manifest, "--reports=http,relaytest", f"--reporturl={reporturl}")
    assert run.returncode == 2, run.stdout + run.stderr

    def parameters(way: str) -> dict:
        trigger = Trigger.objects.get(name=way)
        wait_until(lambda: Event.objects.filter(trigger=trigger).exists())
        event = ended(str(Event.objects.get(trigger=trigger).pk))
        assert event.workflow_start == "started", (event.state, event.failure_reason, event.filter_note)
        return WorkflowRun.objects.get(event=event).parameters

    bound = {way: parameters(way) for way in ("yaml", "push", "json")}
    assert bound["yaml"] == bound["json"] == bound["push"]
    assert bound["yaml"]["host"] and bound["yaml"]["status"] == "changed" and bound["yaml"]["noop"] is False
    assert list(bound["yaml"]["resourceStatuses"]) == [f"File[{target}]"]


def documented_example() -> str:
    documented = (Path(__file__).parents[1] / "docs" / "workflows.md").read_text()
    [source] = [
        block
        for block in re.findall(r"```yaml\n(.*?)```", documented, re.DOTALL)
        if "relaysh/slack-step-message-send" in block and "type: push" in block
    ]
    return source


def test_the_documented_worked_example_tells_slack_what_a_push_body_says_changed(worker, api, slack):
    made = api.post("/api/connections/slack/", {"name": "ops-slack", "token": SLACK_TOKEN}, format="json")
    assert made.status_code == 201, made.content
    token = create(api, documented_example(), "tell-slack")["triggers"][0]["token"]
    posted = len(slack.posted())
    event = ended(send(token, motd(noop=False, pending=False)))
    run = finished(WorkflowRun.objects.get(event=event))
    assert run.parameters == {
        "host": "web1.example.com",
        "changes": motd(noop=False, pending=False)["resource_statuses"],
    }
    assert run.outcome == "success", run.message
    [message] = slack.posted()[posted:]
    assert message["channel"] == "#puppet"
    assert message["text"].startswith("Puppet changed web1.example.com: {")
    assert '"File[/etc/motd]": {' in message["text"] and '"change_count": 1' in message["text"]
    # A noop run with changes pending: the example's `when` leaves it alone.
    pending = ended(send(token, motd(noop=True, pending=True)))
    assert pending.workflow_start == "skipped" and len(slack.posted()) == posted + 1


@pytest.mark.skipif(shutil.which("puppet") is None, reason="puppet-agent is not installed")
def test_the_documented_worked_example_tells_slack_what_a_real_puppet_run_changed(
    worker, api, slack, live_server, tmp_path, monkeypatch
):
    """The RFC's first workflow end to end: one `puppet apply` sends its YAML report with
    Puppet's http processor, and the module's push body and the JSON report with a
    processor that does what the module's does; each starts the workflow, which posts."""
    api.post("/api/connections/slack/", {"name": "ops-slack", "token": SLACK_TOKEN}, format="json")
    tokens = {way: create(api, documented_example(), f"tell-{way}")["triggers"][0]["token"] for way in WAYS}
    url = f"http://127.0.0.1:{urlparse(live_server.url).port}/api/events"
    monkeypatch.setenv("RELAY_TEST_EVENTS_URL", url)
    monkeypatch.setenv("RELAY_TEST_PUSH_TOKEN", tokens["push"])
    monkeypatch.setenv("RELAY_TEST_JSON_TOKEN", tokens["json"])
    install_module_like_processor(tmp_path)
    target = tmp_path / "motd"
    posted = len(slack.posted())
    reporturl = url.replace("http://", f"http://x:{tokens['yaml']}@")
    manifest = f"file {{ '{target}': content => \"{uuid.uuid4()}\\n\" }}\n"
    run = puppet_apply(tmp_path, manifest, "--reports=http,relaytest", f"--reporturl={reporturl}")
    assert run.returncode == 2, run.stdout + run.stderr
    names = [f"tell-{way}" for way in WAYS]
    wait_until(
        lambda: WorkflowRun.objects.filter(workflow__name__in=names, status="complete").count() == 3, 60
    )
    assert [run.outcome for run in WorkflowRun.objects.filter(workflow__name__in=names)] == ["success"] * 3
    messages = [m["text"] for m in slack.posted()[posted:]]
    assert len(messages) == 3 and len(set(messages)) == 1  # the same message, whichever way it came
    assert f'"File[{target}]": {{' in messages[0]


def test_the_admin_makes_a_workflow_s_push_triggers_and_shows_each_token_once(staff, bao):
    admin = Client()
    admin.force_login(staff)
    data = {
        "owner": staff.pk,
        "name": "reported",
        "description": "",
        "source": REPORTED,
        "secrets-TOTAL_FORMS": 0,
        "secrets-INITIAL_FORMS": 0,
        "revisions-TOTAL_FORMS": 0,
        "revisions-INITIAL_FORMS": 0,
    }
    response = admin.post("/admin/workflows/workflow/add/", data)
    trigger = Trigger.objects.get(workflow__name="reported")
    page = response.content.decode()
    assert f'<a href="/admin/triggers/trigger/{trigger.pk}/change/">puppet-report</a>' in page
    token = bao.read(f"relay/triggers/{trigger.pk}")["token"]
    assert token in page  # once, on the answer to the POST that made it (no URL to come back to)
    assert token not in json.dumps(dict(admin.cookies.items()), default=str)  # not in a message
    assert token not in admin.get(f"/admin/workflows/workflow/{trigger.workflow_id}/change/").content.decode()
    change = admin.get(f"/admin/triggers/trigger/{trigger.pk}/change/").content.decode()
    assert 'name="name"' not in change and "/delete/" not in change  # the document names it and ends it
    assert admin.post(f"/admin/triggers/trigger/{trigger.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Trigger.objects.filter(pk=trigger.pk).exists()
