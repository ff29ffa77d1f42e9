"""A real Puppet (Debian's puppet-agent, installed by .ci/run) sends its reports with its own
http report processor (YAML, Basic auth from reporturl) to a live server of the project."""

import shutil
import uuid
from urllib.parse import urlparse

import pytest
from django.contrib.auth.models import User

from tests.events_helpers import puppet_apply
from triggers import services
from triggers.models import Event, Trigger

pytestmark = [
    pytest.mark.skipif(
        shutil.which("puppet") is None, reason="puppet-agent is not installed (.ci/run installs it)"
    ),
    pytest.mark.django_db(transaction=True),
]


def report_to(live_server, token: str) -> list[str]:
    """Flags that make Puppet's own http report processor send to the live server."""
    port = urlparse(live_server.url).port
    return ["--reports=http", f"--reporturl=http://x:{token}@127.0.0.1:{port}/api/events"]


def events_of(trigger: Trigger) -> list[Event]:
    events = list(Event.objects.filter(trigger=trigger).order_by("received_at"))
    for event in events:
        services.process(str(event.pk))
        event.refresh_from_db()
    return events


@pytest.fixture
def trigger_and_token():
    owner = User.objects.create_user("ops")
    trigger, token = Trigger.create_with_token(owner=owner, name="puppet", tags=["profile::web"])
    return trigger, str(token)


def test_a_change_in_a_profile_class_is_matched_with_its_resource(tmp_path, live_server, trigger_and_token):
    trigger, token = trigger_and_token
    target = tmp_path / "motd"
    manifest = f"""
class profile::web {{
  file {{ '{target}': content => "managed {uuid.uuid4()}\\n" }}
}}
include profile::web
"""
    run = puppet_apply(tmp_path, manifest, *report_to(live_server, token))
    assert run.returncode == 2, run.stdout + run.stderr  # 2: changes applied
    [event] = events_of(trigger)
    assert event.state == "matched", event.failure_reason
    summary = event.summary
    assert summary["status"] == "changed" and summary["noop"] is False
    assert summary["transaction_uuid"] and summary["time"].endswith("Z")
    assert summary["puppet_version"].startswith("7.")
    [motd] = summary["resources"]
    assert (motd["type"], motd["title"], motd["change_count"]) == ("File", str(target), 1)
    assert "profile::web" in motd["tags"]
    assert motd["containment_path"] == ["Stage[main]", "Profile::Web", f"File[{target}]"]


def test_a_failing_resource_is_a_failed_report(tmp_path, live_server, trigger_and_token):
    trigger, token = trigger_and_token
    Trigger.objects.filter(pk=trigger.pk).update(tags=[])  # any report that is not unchanged
    run = puppet_apply(
        tmp_path, "exec { 'always fails': command => '/bin/false' }\n", *report_to(live_server, token)
    )
    assert run.returncode in (4, 6), run.stdout + run.stderr
    [event] = events_of(trigger)
    assert event.state == "matched"
    assert event.summary["status"] == "failed"
    [failing] = event.summary["resources"]
    assert failing["type"] == "Exec" and failing["failed"] is True


def test_a_noop_run_changes_nothing_and_is_matched_for_its_pending_change(
    tmp_path, live_server, trigger_and_token
):
    trigger, token = trigger_and_token
    Trigger.objects.filter(pk=trigger.pk).update(tags=[])
    target = tmp_path / "untouched"
    run = puppet_apply(
        tmp_path, f"file {{ '{target}': content => 'x' }}\n", *report_to(live_server, token), "--noop"
    )
    assert run.returncode in (0, 2), run.stdout + run.stderr
    assert not target.exists()
    [event] = events_of(trigger)
    assert event.summary["noop"] is True and event.summary["noop_pending"] is True
    assert event.summary["status"] == "unchanged"
    assert event.state == "matched"  # unchanged, but a noop change is pending: kept by default
