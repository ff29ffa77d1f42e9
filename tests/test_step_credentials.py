"""Step credentials: what `grant` hands a script step, and when it stops working."""

from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test.utils import override_settings

from stepruntime.credentials import grant
from stepruntime.models import StepCredential
from tests.runtime_helpers import running
from workflows.models import StepRun

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
