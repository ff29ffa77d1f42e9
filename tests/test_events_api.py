import json

import pytest

from tests.conftest import client_for
from tests.events_helpers import fixture, post
from tests.test_connection_api import assert_problem
from triggers import services
from triggers.models import Trigger

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def event(alice):
    trigger, token = Trigger.create_with_token(owner=alice, name="reports")
    event_id = post(str(token), REPORT).json()["id"]
    services.process(event_id)
    post(str(token), b"host: other\nstatus: unchanged\n")  # a second event, left received
    return trigger, event_id


def test_the_owner_lists_filters_and_reads_events(alice_api, event):
    trigger, event_id = event
    base = f"/api/triggers/{trigger.pk}/events/"
    listed = alice_api.get(base).json()["results"]
    assert len(listed) == 2 and "summary" not in listed[0]
    assert [e["id"] for e in alice_api.get(base, {"state": "matched"}).json()["results"]] == [event_id]
    assert [e["id"] for e in alice_api.get(base, {"host": "example-host"}).json()["results"]] == [event_id]
    assert alice_api.get(base, {"status": "failed"}).json()["results"] == []

    detail = alice_api.get(f"{base}{event_id}/").json()
    assert detail["summary"]["host"] == "example-host" and detail["state"] == "matched"
    assert set(detail["parts"]) == {"body", "report", "logs", "events"}
    body = alice_api.get(detail["parts"]["body"]["url"])
    assert body.status_code == 200 and b"".join(body.streaming_content) == REPORT
    report = alice_api.get(detail["parts"]["report"]["url"])
    assert json.loads(b"".join(report.streaming_content))["host"] == "example-host"


def test_nobody_else_sees_them(bob, event):
    trigger, event_id = event
    bob_api = client_for(bob)
    base = f"/api/triggers/{trigger.pk}/events/"
    assert_problem(bob_api.get(base), 404)
    assert_problem(bob_api.get(f"{base}{event_id}/"), 404)
    assert_problem(bob_api.get(f"{base}{event_id}/parts/body"), 404)


def test_an_unknown_part_is_404(alice_api, event):
    trigger, event_id = event
    assert_problem(alice_api.get(f"/api/triggers/{trigger.pk}/events/{event_id}/parts/secrets"), 404)


def test_the_admin_shows_a_readable_summary(staff, event):
    from django.test import Client

    _, event_id = event
    client = Client()
    client.force_login(staff)
    page = client.get(f"/admin/triggers/event/{event_id}/change/").content.decode()
    assert "<strong>example-host</strong>: changed in production" in page
    assert "Exec[example-command1]: 1 change(s)" in page
