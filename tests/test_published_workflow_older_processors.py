"""The published `puppet-run-emit-data` workflow, unmodified, started by the push bodies of
the Puppet module's releases 1.0 and 1.1 (puppetlabs-relay's older report processors).

The workflow (puppetlabs/relay-workflows, kept byte for byte in
tests/fixtures/relay-workflows/published/) was written for those releases: its push trigger
binds `!Data report.host`, `report.logs`, `report.status`, `report.summary` and `facts`, and
each of its five `relaysh/core` steps prints one of them with `ni get | jq .<name>`. Here it is
saved through the API as published, the bodies the real processors sent
(tests/fixtures/older-report-processors/) are POSTed to its trigger as they send them, and its
steps run in real bubblewrap sandboxes on a worker of the `steps` queue, reading their specs
from the step runtime API on the live server."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from tests.bridge_helpers import wait_for
from tests.conftest import api_token_for
from tests.script_helpers import running_script_workers
from tests.test_workflow_e2e import Api, statuses
from triggers.models import Event
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = Path(__file__).parent / "fixtures"
EMIT_DATA = (FIXTURES / "relay-workflows" / "published" / "puppet-run-emit-data.yaml").read_text()
OLDER = FIXTURES / "older-report-processors"
STEPS = ("host", "logs", "status", "summary", "facts")


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, bao, live_server, tmp_path_factory) -> Iterator[None]:
    """The engine's worker (which reads events too) and a worker of the `steps` queue."""
    with running_script_workers(
        django_db_blocker,
        bao,
        live_server.url,
        tmp_path_factory.mktemp("emit-data-workers"),
        RELAY_PUBLIC_URL=live_server.url,
    ):
        yield


@pytest.fixture
def api(live_server, workers, settings) -> Api:
    settings.RELAY_PUBLIC_URL = live_server.url
    return Api(live_server.url, api_token_for(User.objects.create_user("ops")))


def save_published(api: Api) -> str:
    """The published workflow saved as it is; its push trigger's token (shown once)."""
    saved = api.call("POST", "/api/workflows/", 201, {"name": "emit-data", "source": EMIT_DATA})
    [trigger] = saved["triggers"]
    assert (trigger["name"], trigger["type"]) == ("puppet-report", "push")
    return trigger["token"]


def send_as_the_processor(url: str, token: str, raw: bytes) -> str:
    """As puppetlabs-relay 1.x's do_request: JSON, a Bearer token, `/api/events?`."""
    answer = requests.post(
        f"{url}/api/events?",
        data=raw,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def run_of(event_id: str) -> str:
    run = wait_for(lambda: WorkflowRun.objects.filter(event_id=event_id).first(), 60, "the event's run")
    return str(run.pk)


def log_of(api: Api, run_id: str, step: str) -> str:
    return api.call("GET", f"/api/workflow-runs/{run_id}/steps/{step}/log", 200)["text"]


def printed(value: Any) -> str:
    """What `ni get | jq .x` prints of a value: JSON, two spaces a level, keys sorted (`ni
    get` is Go's encoding/json, which sorts them); ASCII here."""
    return json.dumps(value, indent=2, sort_keys=True)


def test_a_1_1_body_runs_it_and_each_step_prints_what_the_processor_sent(api, live_server):
    token = save_published(api)
    raw = (OLDER / "puppetlabs-relay-1.1.0-changed.json").read_bytes()
    sent = json.loads(raw)["data"]
    run_id = run_of(send_as_the_processor(live_server.url, token, raw))
    run = api.finished(run_id, timeout=180)

    assert (run["outcome"], run["message"]) == ("success", ""), run
    assert statuses(run) == dict.fromkeys(STEPS, "success")
    report = sent["report"]
    assert run["parameters"] == {
        "host": report["host"],
        "logs": report["logs"],
        "status": report["status"],
        "summary": report["summary"],
        "facts": sent["facts"],
    }
    # Each step's `ni get | jq .<name>` printed its value, as the processor sent it.
    for step, value in run["parameters"].items():
        assert printed(value) in log_of(api, run_id, step), step
    assert '"clientcert": "web1.example.com"' in log_of(api, run_id, "facts")


def test_a_1_0_body_starts_it_and_the_run_says_the_facts_1_0_never_sent_are_missing(api, live_server):
    """Release 1.0 sends no facts, which the workflow requires (it was written for 1.1): the
    run starts and fails at once, saying so, as for any binding the event cannot give."""
    token = save_published(api)
    raw = (OLDER / "puppetlabs-relay-1.0.0-changed.json").read_bytes()
    event_id = send_as_the_processor(live_server.url, token, raw)
    run = api.finished(run_of(event_id), timeout=120)

    assert run["outcome"] == "failure"
    assert run["message"].startswith(
        "Missing required parameters: facts. The trigger's binding of 'facts' failed:"
    ), run["message"]
    assert set(statuses(run).values()) == {"skipped"}
    event = Event.objects.get(pk=event_id)
    assert (event.state, event.workflow_start) == ("matched", "started")
    assert event.data == json.loads(raw)["data"]  # `report` as sent, for the other bindings
