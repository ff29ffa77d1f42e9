"""What a script step may not show, on real workers and real bubblewrap sandboxes: a secret
printed in base64, URL-encoded or inside the `Authorization: Basic` line `curl -v -u`
prints (the request going out through the step's proxy to a stand-in), and a sensitive
output (`ni output set --sensitive`) that the API, the admin's run page and an approval's
evidence show masked while a later step still reads it whole."""

import base64
import hashlib
import json
from urllib.parse import quote, quote_plus

import pytest
from django.test import Client

from scriptsteps.masking import MASK
from tests.conftest import client_for
from tests.script_helpers import STANDIN_HOST
from tests.test_script_masking import readable
from tests.test_script_steps import log_of
from tests.workflow_helpers import finished, make_workflow, run_of, step_in, steps_of
from workflows import engine
from workflows.models import StepRun, WorkflowSecret

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = 'Sup3r s3cret/"Valu3"+&x'  # a space, a slash, quotes, + and &: every encoder differs


def test_a_secret_printed_encoded_or_sent_as_basic_credentials_is_masked(proxied_workers, owner, standin):
    standin.received.clear()
    url = f"http://{STANDIN_HOST}:{standin.port}/basic"
    lower_hex = "import os, re, urllib.parse as u; " + (
        "print(re.sub('%..', lambda m: m.group(0).lower(), u.quote(os.environ['TOKEN'], safe='')))"
    )
    source = {
        "apiVersion": "v1",
        "steps": [
            {
                "name": "leak",
                "image": "relaysh/core",
                "env": {"TOKEN": {"$type": "Secret", "name": "apiToken"}},
                "input": [
                    'printf %s "$TOKEN" | base64',
                    'printf x%s "$TOKEN" | base64 -w0; echo',
                    'printf xy%s "$TOKEN" | base64 -w0; echo',
                    'printf %s "$TOKEN" | base64 -w0 | tr "+/" "-_"; echo',
                    'jq -rn --arg t "$TOKEN" "\\$t|@uri"',
                    "python3 -c 'import os, urllib.parse as u; print(u.quote_plus(os.environ[\"TOKEN\"]))'",
                    f'python3 -c "{lower_hex}"',
                    f'curl -sS -v -u "user:$TOKEN" {url} 2>&1',
                ],
            }
        ],
    }
    workflow = make_workflow(owner, json.dumps(source))
    WorkflowSecret.put(workflow, "apiToken", SECRET, owner)
    run = finished(engine.create_run(workflow, {}, created_by=owner), timeout=60)
    log = log_of(run, "leak")
    assert steps_of(run)["leak"].status == "success", log

    # The request went out with the real credentials, through the proxy...
    credentials = base64.b64encode(f"user:{SECRET}".encode()).decode()
    sent = next(seen for seen in standin.received if seen["path"] == "/basic")
    assert sent["headers"]["authorization"] == f"Basic {credentials}"
    assert "stand-in saw /basic" in log
    # ...and the log shows none of it.
    assert f"> Authorization: Basic {MASK}" in log
    assert SECRET not in log and credentials not in log
    assert not readable(log, SECRET), log
    for form in (quote(SECRET, safe=""), quote_plus(SECRET), quote(SECRET, safe="").lower()):
        assert form.lower() not in log.lower(), (form, log)
    assert log.count(MASK) >= 8, log  # each line printed something masked


VALUE = "Gener4ted-pa55word-9f3c"
SENSITIVE = """
apiVersion: v1
steps:
- name: make
  image: relaysh/core
  input:
  - PW="$(printf 'Gener4ted-%s' pa55word-9f3c)"  # made at run time, not in the document
  - ni output set -k password --sensitive -v "$PW"
  - ni output set -k plain -v visible-value
  - 'echo "made $PW"'
- name: gate
  type: approval
  dependsOn: make
- name: use
  image: relaysh/core
  dependsOn: gate
  spec: {pw: !Output [make, password]}
  input:
  - 'echo "read: $(ni output get -n make -k password)"'
  - 'echo "spec: $(ni get -p {.pw})"'
  - 'printf %s "$(ni get -p {.pw})" | base64'
  - 'printf %s "$(ni output get -n make -k password)" | sha256sum'
"""


def test_ni_output_set_sensitive_is_masked_everywhere_but_in_the_step_that_reads_it(
    proxied_workers, owner, staff
):
    assert VALUE not in SENSITIVE
    run = run_of(owner, SENSITIVE)
    gate = step_in(run, "gate", "in-progress", timeout=60)
    make_log = log_of(run, "make")
    assert steps_of(run)["make"].status == "success", make_log
    assert 'Successfully set output for "password".' in make_log
    assert f"made {MASK}" in make_log and VALUE not in make_log  # its own log too, once marked

    shown = {"password": MASK, "plain": "visible-value"}
    body = client_for(owner).get(f"/api/workflow-runs/{run.pk}/").json()
    assert next(s["outputs"] for s in body["steps"] if s["name"] == "make") == shown
    assert VALUE not in json.dumps(body)
    admin = Client()
    admin.force_login(staff)
    page = admin.get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    assert "&quot;password&quot;: &quot;***&quot;" in page and "visible-value" in page
    assert VALUE not in page
    evidence = admin.get(f"/admin/workflows/approval/{gate.pk}/change/").content.decode()
    assert 'value="Approve"' in evidence and "&quot;password&quot;: &quot;***&quot;" in evidence
    assert VALUE not in evidence

    engine.answer(StepRun.objects.get(pk=gate.pk), staff, True)
    run = finished(run, timeout=60)
    use_log = log_of(run, "use")
    assert steps_of(run)["use"].status == "success", use_log
    # The later step had the value itself (its digest), and its log shows it in no form.
    assert hashlib.sha256(VALUE.encode()).hexdigest() in use_log
    assert f"read: {MASK}\n" in use_log and f"spec: {MASK}\n" in use_log
    assert VALUE not in use_log and not readable(use_log, VALUE), use_log
    body = client_for(owner).get(f"/api/workflow-runs/{run.pk}/").json()
    assert next(s["outputs"] for s in body["steps"] if s["name"] == "make") == shown
    assert VALUE not in json.dumps(body)


BESIDE = """
apiVersion: v1
steps:
- name: side
  image: relaysh/core
  input:
  - sleep 1
  - ni output set -k tok --sensitive -v "$(printf 'Side-%s' s3cret-0042)"
- name: reader
  image: relaysh/core
  input:
  - echo "reader starts"  # its log is stored before the value exists
  - for i in $(seq 60); do V="$(ni output get -n side -k tok 2>/dev/null)" && break; sleep 0.2; done
  - 'echo "got: $V"; printf %s "$V" | base64; printf %s "$V" | sha256sum'
"""


def test_a_sensitive_output_set_beside_a_running_step_is_masked_in_its_log(proxied_workers, owner):
    # The reader started before the value existed: what it can read is what the run has now.
    run = finished(run_of(owner, BESIDE), timeout=60)
    log = log_of(run, "reader")
    assert steps_of(run)["reader"].status == "success", log
    value = "Side-s3cret-0042"
    assert hashlib.sha256(value.encode()).hexdigest() in log  # it read the value itself
    assert f"got: {MASK}\n" in log and value not in log and not readable(log, value), log
