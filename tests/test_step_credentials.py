"""Step credentials: what `grant` hands a script step, and when it stops working."""

import base64
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import override_settings
from rest_framework.test import APIClient

from stepruntime.credentials import grant
from stepruntime.models import StepCredential
from tests.runtime_helpers import running, start_step
from tests.workflow_helpers import make_workflow
from workflows import engine
from workflows.models import StepRun, WorkflowSecret

pytestmark = pytest.mark.django_db

SOURCE = """
apiVersion: v1
steps:
- name: a
  image: relaysh/core
- name: b
  image: relaysh/core
  dependsOn: a
"""


def test_grant_gives_the_runtime_url_with_a_step_token_as_its_user(alice):
    held = running(alice, SOURCE, "a")
    parts = urlsplit(held.url)
    assert (parts.scheme, parts.hostname, parts.port, parts.path) == ("http", "127.0.0.1", 8000, "")
    assert parts.username.startswith("rlys_") and len(parts.username) == 66
    assert parts.password == ""  # requests sends no Basic authentication without it
    assert StepCredential.for_token(parts.username).step_run_id == held.step.pk


@override_settings(STEP_RUNTIME_URL="http://[::1]:9000")
def test_grant_follows_the_setting(alice):
    held = running(alice, SOURCE, "a")
    assert held.url.startswith("http://rlys_") and held.url.endswith(":@[::1]:9000")


def test_only_the_digest_is_stored(alice):
    held = running(alice, SOURCE, "a")
    credential = StepCredential.objects.get(step_run=held.step)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM stepruntime_stepcredential")
        rows = cursor.fetchall()
    assert held.token not in repr(rows)
    assert held.token not in repr(credential) and held.token not in str(credential)


def test_a_second_grant_replaces_the_first(alice):
    held = running(alice, SOURCE, "a")
    again = grant(held.step.pk)
    assert StepCredential.for_token(held.token) is None
    assert StepCredential.for_token(urlsplit(again).username).step_run_id == held.step.pk
    assert StepCredential.objects.filter(step_run=held.step).count() == 1


def test_a_wrong_secret_with_a_right_lookup_is_unknown(alice):
    held = running(alice, SOURCE, "a")
    forged = held.token[:17] + ("A" if held.token[17] != "A" else "B") + held.token[18:]
    assert StepCredential.for_token(forged) is None
    assert StepCredential.for_token("rlyu_" + held.token[5:]) is None


def test_the_credential_is_live_only_while_the_step_is_in_progress(alice):
    held = running(alice, SOURCE, "a")
    assert StepCredential.for_token(held.token).live
    held.end()
    assert not StepCredential.for_token(held.token).live


def test_an_output_set_while_the_engine_records_the_end_is_kept(alice):
    held = running(alice, SOURCE, "a")
    stale = StepRun.objects.get(pk=held.step.pk)  # loaded by the engine before the API wrote
    assert held.step.put_output("fromApi", {"n": 1})
    assert stale.record_done(held.lease, True, {"fromEngine": [1, 2]}, "")
    assert stale.outputs == {"fromApi": {"n": 1}, "fromEngine": [1, 2]}
    assert not held.step.put_output("late", 1)  # ended: refused
    assert StepRun.objects.get(pk=held.step.pk).outputs == {"fromApi": {"n": 1}, "fromEngine": [1, 2]}


# The lookup: one statement, as strict as ever ------------------------------------------------

SECRET_SOURCE = """
apiVersion: v1
parameters:
  who: {default: world}
steps:
- name: a
  image: relaysh/core
- name: b
  image: relaysh/core
  spec:
    greeting: !Fn.concat ["hello ", !Parameter who]
    token: !Secret apiToken
    earlier: !Output [a, n]
  dependsOn: a
"""


def _basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"{token}:".encode()).decode()


def _concrete(instance) -> dict:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def test_the_lookup_loads_what_select_related_loaded(alice, django_assert_num_queries):
    held = running(alice, SECRET_SOURCE, "a", parameters={"who": "relay"})
    held.step.put_output("n", {"deep": [1, "two"]})
    status = {"process_state": {"exit_code": 0}}
    StepCredential.objects.filter(step_run=held.step).update(reported_status=status)
    orm = StepCredential.objects.select_related("step_run__run__workflow__owner").get(step_run=held.step)
    with django_assert_num_queries(1):
        found = StepCredential.for_token(held.token)
        # The whole chain is loaded with it, and the step run's own credential too.
        chain = [found, found.step_run, found.step_run.run, found.step_run.run.workflow]
        chain.append(found.step_run.run.workflow.owner)
        assert found.step_run.credential is found
        # What no route reads of the step's own row, and may be large, is left deferred.
        assert found.step_run.get_deferred_fields() == {"outputs", "state", "decorators"}
        assert not any(instance.get_deferred_fields() for instance in chain if instance is not found.step_run)
    expected = [
        orm,
        orm.step_run,
        orm.step_run.run,
        orm.step_run.run.workflow,
        orm.step_run.run.workflow.owner,
    ]
    for loaded, wanted in zip(chain, expected, strict=True):
        assert type(loaded) is type(wanted)
        assert _concrete(loaded) == _concrete(wanted)  # (a deferred field read when asked for)
        assert not loaded._state.adding and loaded._state.db == "default"
    assert found.step_run.outputs == {"n": {"deep": [1, "two"]}}  # JSON decoded, as the ORM does
    assert found.reported_status == status
    assert found.step_run.run.parameters == {"who": "relay"}


def test_a_credential_whose_pepper_was_retired_is_unknown(alice, settings):
    held = running(alice, SOURCE, "a")
    assert StepCredential.for_token(held.token) is not None
    settings.TOKEN_PEPPERS = {2: b"second-pepper-0123456789abcdefghijkl"}
    assert StepCredential.for_token(held.token) is None


def test_an_inactive_owners_step_is_refused(alice):
    held = running(alice, SOURCE, "a")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=_basic(held.token))
    assert client.get("/spec").status_code == 200
    User.objects.filter(pk=alice.pk).update(is_active=False)
    response = client.get("/spec")
    assert response.status_code == 401 and response.json()["detail"] == "Invalid step credential."


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
def test_spec_reads_its_rows_by_prepared_statements(alice):
    """GET /spec on every call: the credential with its step, run, workflow and owner, the
    run's steps, the secret's row. Each is prepared once per connection (PostgreSQL neither
    parses nor plans it again) and none is compiled by the ORM."""
    workflow = make_workflow(alice, SECRET_SOURCE)
    WorkflowSecret.put(workflow, "apiToken", "s3cret-value", alice)
    run = engine.create_run(workflow, {"who": "relay"}, created_by=alice)
    first = start_step(run, "a")
    first.step.put_output("n", 7)
    first.end()
    held = start_step(run, "b")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=_basic(held.token))

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
            return sorted(row[0] for row in cursor.fetchall())

    expected = {"value": {"greeting": "hello relay", "token": "s3cret-value", "earlier": 7}}
    assert client.get("/spec").json().items() >= {**expected, "complete": True}.items()
    after_one = prepared()
    for table in ("stepruntime_stepcredential", "workflows_steprun", "workflows_workflowsecret"):
        assert any(f'FROM "{table}"' in statement for statement in after_one), (table, after_one)
    statements: list[str] = []

    def keep(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        assert client.get("/spec").json()["value"] == expected["value"]
    assert prepared() == after_one  # nothing prepared again
    assert len(statements) == 3 and all(_numbered(statement) in after_one for statement in statements)


def _numbered(sql: str) -> str:
    """`sql` as PostgreSQL keeps it prepared: %s placeholders as $1, $2, …"""
    parts = sql.split("%s")
    return "".join(part + (f"${i}" if i < len(parts) else "") for i, part in enumerate(parts, 1))
