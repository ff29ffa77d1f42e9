"""The Puppet module's report processor (puppetlabs-relay 2.5.1) and its push body.

It POSTs `{"data": {...}}` (no `key`) with `Authorization: Bearer`, and only for a run that
changed something, failed, or left changes pending in noop. Its body has no `environment`,
no `noop_pending` and no resource events: per resource only `resource_type`, `title`,
`change_count`, `out_of_sync_count`, `containment_path` and `corrective_change`, for the
resources not skipped that changed or are out of sync. `time` is Ruby's `Time#iso8601`."""

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.events_helpers import post, puppet_apply, stored_report
from triggers import services
from triggers.models import Event, Trigger


@pytest.fixture
def make_trigger(alice):
    def make(**filters) -> tuple[Trigger, str]:
        trigger, token = Trigger.create_with_token(owner=alice, name=f"t{Trigger.objects.count()}", **filters)
        return trigger, str(token)

    return make


def push(token: str, data: dict[str, Any]) -> Event:
    """Send a push body as the report processor does, and let a worker read it."""
    response = post(token, json.dumps({"data": data}).encode(), "application/json", basic=False)
    assert response.status_code == 202, response.content
    services.process(response.json()["id"])
    return Event.objects.get(pk=response.json()["id"])


def push_data(report: dict[str, Any]) -> dict[str, Any]:
    """What the report processor makes of a Puppet report (its `with_report`)."""
    moment = report["time"]
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return {
        "host": report["host"],
        "noop": report["noop"],
        "status": report["status"],
        "time": moment.replace(microsecond=0).isoformat(),
        "configuration_version": report["configuration_version"],
        "transaction_uuid": report["transaction_uuid"],
        "code_id": report.get("code_id"),
        "summary": "(Report#summary, a text)",
        "resource_statuses": {
            name: {
                "resource_type": status["resource_type"],
                "title": status["title"],
                "change_count": status["change_count"],
                "out_of_sync_count": status["out_of_sync_count"],
                "containment_path": status["containment_path"],
                "corrective_change": status["corrective_change"],
            }
            for name, status in report["resource_statuses"].items()
            if not status["skipped"] and (status["change_count"] > 0 or status["out_of_sync_count"] > 0)
        },
    }


class PlainLoader(yaml.SafeLoader):
    """Puppet's YAML report as plain data: Ruby tags are dropped."""


def _untagged(loader: PlainLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


PlainLoader.add_multi_constructor("!", _untagged)


def motd(noop: bool, pending: bool) -> dict[str, Any]:
    """A push body for one file, as the module sends it for a noop or a real run."""
    return {
        "host": "web1.example.com",
        "noop": noop,
        "status": "unchanged" if noop else "changed",
        "time": "2026-11-21T10:00:00+00:00",
        "configuration_version": "1763719200",
        "transaction_uuid": f"6b7a1c3e-0000-4000-8000-00000000000{int(noop)}",
        "code_id": None,
        "summary": "---\nversion:\n  config: 1763719200\n",
        "resource_statuses": {
            "File[/etc/motd]": {
                "resource_type": "File",
                "title": "/etc/motd",
                "change_count": 0 if noop else 1,
                "out_of_sync_count": 1 if pending or not noop else 0,
                "containment_path": ["Stage[main]", "Profile::Motd", "File[/etc/motd]"],
                "corrective_change": False,
            }
        },
    }


def test_a_noop_push_body_with_changes_pending_is_kept(make_trigger):
    _, token = make_trigger()
    event = push(token, motd(noop=True, pending=True))
    assert event.state == "matched", event.filter_note
    assert event.summary["status"] == "unchanged" and event.summary["noop_pending"] is True
    [resource] = event.summary["resources"]
    assert (resource["title"], resource["out_of_sync_count"], resource["change_count"]) == ("/etc/motd", 1, 0)


def test_a_changed_push_body_has_no_noop_change_pending(make_trigger):
    _, token = make_trigger()
    event = push(token, motd(noop=False, pending=False))
    assert event.state == "matched" and event.summary["noop_pending"] is False


def test_an_unchanged_push_body_without_pending_changes_is_filtered_and_says_why(make_trigger):
    _, token = make_trigger()
    event = push(token, motd(noop=True, pending=False))
    assert event.state == "filtered" and event.summary["noop_pending"] is False
    assert event.filter_note == "Unchanged, with no noop change pending."


@pytest.mark.skipif(shutil.which("puppet") is None, reason="puppet-agent is not installed")
def test_the_push_body_of_a_real_noop_run_is_kept(make_trigger, tmp_path: Path):
    target = tmp_path / "motd"
    manifest = f"file {{ '{target}': content => \"hello\\n\" }}\n"
    run = puppet_apply(tmp_path, manifest, "--noop", "--reports=store", f"--reportdir={tmp_path}/reports")
    assert run.returncode == 0, run.stderr  # noop: nothing changed
    report = yaml.load(stored_report(tmp_path), Loader=PlainLoader)  # a SafeLoader: tags dropped
    assert (report["status"], report["noop_pending"]) == ("unchanged", True)  # what the module sends on

    _, token = make_trigger()
    event = push(token, push_data(report))
    assert event.state == "matched", event.filter_note
    assert event.summary["noop"] is True and event.summary["noop_pending"] is True
    assert [r["title"] for r in event.summary["resources"]] == [str(target)]


def test_an_environments_filter_lets_a_push_body_through_and_says_so(make_trigger, alice_api):
    trigger, token = make_trigger(environments=["production"])
    event = push(token, motd(noop=False, pending=False))
    assert event.state == "matched"
    assert "names no environment" in event.filter_note and "not applied" in event.filter_note
    shown = alice_api.get(f"/api/triggers/{trigger.pk}/events/{event.pk}/").json()
    assert shown["filter_note"] == event.filter_note


def test_an_environments_filter_matches_a_report_that_names_its_environment(make_trigger):
    _, token = make_trigger(environments=["production"])
    staging = push(token, {**motd(noop=False, pending=False), "environment": "staging"})
    assert staging.state == "filtered"
    assert staging.filter_note == "Its environment staging is not one of the trigger's environments."
    production = push(
        token,
        {
            **motd(noop=False, pending=False),
            "environment": "production",
            "transaction_uuid": "6b7a1c3e-0000-4000-8000-000000000009",
        },
    )
    assert production.state == "matched" and production.filter_note == ""
