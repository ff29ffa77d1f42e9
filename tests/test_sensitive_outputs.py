"""Sensitive outputs (PUT /outputs/{name}/metadata `{"sensitive": true}`, `ni output set
--sensitive`) in process: the steps of the run read them whole; the workflow-runs API, the
admin's run page and an approval's evidence show them as "***", and so every output a step
set itself while that step runs (it may mark one sensitive after setting it)."""

import base64
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from scriptsteps.masking import MASK
from tests.conftest import client_for
from tests.runtime_helpers import Running, start_step
from tests.workflow_helpers import run_of, steps_of
from workflows import engine
from workflows.models import StepRun

pytestmark = pytest.mark.django_db

VALUE = "Gener4ted-pa55word-9f3c"
SOURCE = """
apiVersion: v1
steps:
- name: make
  image: relaysh/core
  input: ["true"]
- name: gate
  type: approval
  dependsOn: make
- name: use
  image: relaysh/core
  dependsOn: gate
  spec: {pw: !Output [make, password], plain: !Output [make, plain]}
  input: ["true"]
"""


def runtime(held: Running) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{held.token}:".encode()).decode())
    return c


def put(c: APIClient, path: str, body: bytes) -> None:
    assert c.put(path, body, content_type="application/json").status_code == 201


def api_outputs(user: User, run_id: object, step: str) -> dict:
    body = client_for(user).get(f"/api/workflow-runs/{run_id}/").json()
    return next(s["outputs"] for s in body["steps"] if s["name"] == step)


def admin_page(user: User, path: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def test_a_sensitive_output_is_masked_for_people_and_whole_for_the_steps_that_read_it(alice, staff):
    run = run_of(alice, SOURCE)
    make = start_step(run, "make")
    c = runtime(make)
    # relay_sdk's raw PUTs in the order a client may use: the value, then the metadata.
    put(c, "/outputs/password", f'"{VALUE}"'.encode())
    put(c, "/outputs/plain", b'"visible-value"')
    # Until the step ends it may still mark either sensitive: nobody sees them yet.
    assert api_outputs(alice, run.pk, "make") == {"password": MASK, "plain": MASK}
    put(c, "/outputs/password/metadata", b'{"sensitive": true}')
    make.end()

    assert api_outputs(alice, run.pk, "make") == {"password": MASK, "plain": "visible-value"}
    assert api_outputs(staff, run.pk, "make") == {"password": MASK, "plain": "visible-value"}
    page = admin_page(staff, f"/admin/workflows/workflowrun/{run.pk}/change/")
    assert VALUE not in page and "&quot;password&quot;: &quot;***&quot;" in page and "visible-value" in page

    gate = steps_of(run)["gate"]
    engine.start_step(str(gate.pk))
    evidence = admin_page(staff, f"/admin/workflows/approval/{gate.pk}/change/")
    assert 'value="Approve"' in evidence
    assert VALUE not in evidence and "&quot;password&quot;: &quot;***&quot;" in evidence
    assert "visible-value" in evidence
    engine.answer(StepRun.objects.get(pk=gate.pk), staff, True)

    use = runtime(start_step(run, "use"))
    assert use.get("/outputs/make/password").json() == {
        "task_name": "make",
        "key": "password",
        "value": VALUE,
        "metadata": {"sensitive": True},
    }
    assert use.get("/outputs/make/plain").json()["metadata"] == {"sensitive": False}
    assert use.get("/spec").json()["value"] == {"pw": VALUE, "plain": "visible-value"}
    assert api_outputs(alice, run.pk, "make") == {"password": MASK, "plain": "visible-value"}


def test_marked_before_it_is_set_it_is_never_shown(alice):
    run = run_of(alice, SOURCE)
    make = start_step(run, "make")
    c = runtime(make)
    put(c, "/outputs/password/metadata", b'{"sensitive": true}')  # what ni does
    put(c, "/outputs/password", b'{"nested": ["' + VALUE.encode() + b'"]}')
    assert api_outputs(alice, run.pk, "make") == {"password": MASK}
    make.end()
    assert api_outputs(alice, run.pk, "make") == {"password": MASK}
    # The metadata is the step's, on its row: whatever shows outputs masks from it alone.
    step = StepRun.objects.get(pk=make.step.pk)
    assert step.output_metadata == {"password": {"sensitive": True}}
    assert step.outputs == {"password": {"nested": [VALUE]}}
    assert not hasattr(step.credential, "output_metadata")
    # Once ended, nothing changes it any more.
    assert (
        c.put(
            "/outputs/password/metadata", b'{"sensitive": false}', content_type="application/json"
        ).status_code
        == 401
    )


def test_outputs_a_handler_publishes_while_its_step_runs_stay_visible(alice):
    # Not set through the step runtime API (a Puppet step's run `id`, published at once while
    # it waits): nothing can mark them sensitive, so nothing hides them.
    held = start_step(run_of(alice, SOURCE), "make")
    assert held.step.record_wait(held.lease, {}, {"id": "abc-123"}, timezone.now() + timedelta(hours=1), None)
    assert StepRun.objects.get(pk=held.step.pk).status == "in-progress"
    assert api_outputs(alice, held.run.pk, "make") == {"id": "abc-123"}


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_what_each_credential_kept_to_its_step(alice):
    make = start_step(run_of(alice, SOURCE), "make")
    assert make.step.put_output("password", VALUE)
    before = [("stepruntime", "0002_step_output_metadata"), ("workflows", "0005_step_run_decorators")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps
        old.get_model("stepruntime", "StepCredential").objects.filter(step_run_id=make.step.pk).update(
            output_metadata={"password": {"sensitive": True}}
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    step = StepRun.objects.get(pk=make.step.pk)
    assert step.output_metadata == {"password": {"sensitive": True}}
    make.end()
    assert StepRun.objects.get(pk=make.step.pk).shown_outputs == {"password": MASK}
