"""An event's data: what a workflow trigger reads as `event` (`!Data host`). It has the shape of
the Puppet module's push body (puppetlabs-relay 2.x) whichever way the report came: a push
body's `data` as it is, a Puppet YAML or JSON report converted to it (triggers.reports)."""

import json
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.contrib.auth.models import User

from tests.events_helpers import big_report, fixture, install_module_like_processor, post, puppet_apply
from tests.test_events_push_body import motd
from triggers import parsing, services
from triggers.models import Event, Trigger
from triggers.reports import EVENT_DATA_MAX_BYTES, EVENT_RESOURCES, PUSH_FIELDS, summary_text

PUPPET_8 = "puppet-8.4-jacobbrewer1-puppet-summary-example.yaml"


@pytest.fixture
def make_trigger(alice):
    def make(**filters) -> tuple[Trigger, str]:
        trigger, token = Trigger.create_with_token(owner=alice, name=f"t{Trigger.objects.count()}", **filters)
        return trigger, str(token)

    return make


def ingest(token: str, body: bytes, content_type: str = "application/x-yaml") -> Event:
    response = post(token, body, content_type, basic=False)
    assert response.status_code == 202, response.content
    services.process(response.json()["id"])
    return Event.objects.get(pk=response.json()["id"])


def push(token: str, data: dict) -> Event:
    return ingest(token, json.dumps({"data": data}).encode(), "application/json")


def as_json(yaml_report: bytes) -> bytes:
    """The same report as Puppet's JSON form: the same keys and values."""
    return json.dumps(parsing.read_yaml(yaml_report, 10_000_000)).encode()


def without_last_run(data: dict) -> dict:
    """`summary` says when it was made ("Last run"), as Puppet's does."""
    return {**data, "summary": re.sub(r"Last run: \d+", "Last run: N", data["summary"])}


def test_a_push_body_s_data_is_kept_as_it_is(make_trigger):
    _, token = make_trigger()
    data = {
        **motd(noop=False, pending=False),
        "facts": {"os": {"family": "Debian"}},
    }  # and a field of its own
    event = push(token, data)
    assert event.state == "matched"
    assert event.data == data


def test_a_yaml_report_has_the_push_body_s_shape(make_trigger):
    _, token = make_trigger()
    event = ingest(token, fixture(PUPPET_8))
    data = event.data
    assert sorted(data) == sorted(PUSH_FIELDS)
    assert {k: v for k, v in data.items() if k not in ("summary", "resource_statuses")} == {
        "host": "example-host",
        "noop": False,
        "status": "changed",
        "time": "2024-02-17T02:00:09+00:00",  # Ruby's Time#iso8601, as the module sends it
        "configuration_version": 1708135209,
        "transaction_uuid": "ebdb4923-d612-4850-9093-fc1f1cc1dd64",
        "code_id": None,
    }
    assert data["resource_statuses"] == {
        "Exec[example-command1]": {
            "resource_type": "Exec",
            "title": "example-command1",
            "change_count": 1,
            "out_of_sync_count": 1,
            "containment_path": ["Stage[main]", "Default_config", "Exec[example-command1]"],
            "corrective_change": False,
        }
    }
    assert data["summary"].startswith("Application:\n")
    assert (
        "Resources:\n          Changed: 6\n      Out of sync: 6\n            Total: 67\n" in data["summary"]
    )
    assert "Version:\n           Config: 1708135209\n           Puppet: 8.4.0\n" in data["summary"]


def test_the_same_report_as_json_has_the_same_data(make_trigger):
    _, yaml_token = make_trigger()
    _, json_token = make_trigger()
    from_yaml = ingest(yaml_token, fixture(PUPPET_8))
    from_json = ingest(json_token, as_json(fixture(PUPPET_8)), "application/json")
    assert without_last_run(from_json.data) == without_last_run(from_yaml.data)


def test_a_report_s_time_keeps_its_offset_in_whole_seconds(make_trigger):
    _, token = make_trigger()
    quoted = ingest(token, b"host: a\ntime: '2026-11-21T10:00:00.987654321+01:00'\nstatus: changed\n")
    as_json = ingest(
        token,
        b'{"host": "b", "time": "2026-11-21T10:00:00.987654321+01:00", "status": "changed"}',
        "application/json",
    )
    assert quoted.data["time"] == as_json.data["time"] == "2026-11-21T10:00:00+01:00"
    # Puppet before 5 left it unquoted: a YAML timestamp, read as UTC.
    unquoted = ingest(token, b"host: c\ntime: 2010-09-23 15:44:05.894401 -07:00\nstatus: changed\n")
    assert unquoted.data["time"] == "2010-09-23T22:44:05+00:00"


def test_an_old_report_gets_the_status_puppet_derives(make_trigger):
    _, token = make_trigger(statuses=["unchanged"])
    event = ingest(token, fixture("puppet-2.6-puppetlabs-puppet-report2.6.x.yaml"))
    assert (event.data["status"], event.data["noop"], event.data["resource_statuses"]) == (
        "unchanged",
        False,
        {},
    )


def status(title: str, **fields) -> dict:
    return {
        "resource_type": "File",
        "title": title,
        "resource": f"File[{title}]",
        "containment_path": ["Stage[main]", "Main", f"File[{title}]"],
        "skipped": False,
        "failed": False,
        "change_count": 0,
        "out_of_sync_count": 0,
        "corrective_change": False,
        "events": [],
        **fields,
    }


def test_only_the_resources_the_module_sends_are_in_it(make_trigger):
    report = {
        "host": "web1",
        "status": "failed",
        "time": "2026-11-21T10:00:00+00:00",
        "resource_statuses": {
            "File[/changed]": status("/changed", change_count=1, out_of_sync_count=1, corrective_change=True),
            "File[/pending]": status("/pending", out_of_sync_count=1, events=[{"status": "noop"}]),
            "File[/failed]": status(
                "/failed", failed=True, out_of_sync_count=1, events=[{"status": "failure"}]
            ),
            "File[/broken]": status("/broken", failed=True),  # failed before any property: none changed
            "File[/skipped]": status("/skipped", skipped=True, out_of_sync_count=1),
            "File[/unchanged]": status("/unchanged"),
        },
    }
    _, token = make_trigger()
    event = ingest(token, json.dumps(report).encode(), "application/json")
    assert sorted(event.data["resource_statuses"]) == ["File[/changed]", "File[/failed]", "File[/pending]"]
    assert event.data["resource_statuses"]["File[/changed]"] == {
        "resource_type": "File",
        "title": "/changed",
        "change_count": 1,
        "out_of_sync_count": 1,
        "containment_path": ["Stage[main]", "Main", "File[/changed]"],
        "corrective_change": True,
    }


def test_counts_of_reports_that_carry_none_are_derived_from_their_events(make_trigger):
    old = status("/old", events=[{"status": "success"}, {"status": "noop"}])
    for field in ("change_count", "out_of_sync_count", "corrective_change"):
        del old[field]
    _, token = make_trigger()
    event = ingest(
        token,
        json.dumps({"host": "a", "resource_statuses": {"File[/old]": old}}).encode(),
        "application/json",
    )
    resource = event.data["resource_statuses"]["File[/old]"]
    assert (resource["change_count"], resource["out_of_sync_count"], resource["corrective_change"]) == (
        1,
        2,
        False,
    )


def test_resource_statuses_are_capped_and_say_how_many_there_were(make_trigger):
    _, token = make_trigger()
    event = ingest(token, big_report(EVENT_RESOURCES + 20))
    statuses = event.data["resource_statuses"]
    assert len(statuses) == EVENT_RESOURCES and event.data["resource_statuses_total"] == EVENT_RESOURCES + 20
    assert "File[/srv/www/0.html]" in statuses  # the first ones
    assert f"File[/srv/www/{EVENT_RESOURCES}.html]" not in statuses

    many = {f"File[/f{i}]": {"resource_type": "File", "title": f"/f{i}"} for i in range(EVENT_RESOURCES + 1)}
    pushed = push(token, {**motd(noop=False, pending=False), "resource_statuses": many})
    assert len(pushed.data["resource_statuses"]) == EVENT_RESOURCES
    assert pushed.data["resource_statuses_total"] == EVENT_RESOURCES + 1
    small = push(token, {**motd(noop=False, pending=False), "transaction_uuid": str(uuid.uuid4())})
    assert "resource_statuses_total" not in small.data  # only when some were left out


def test_a_push_body_too_large_to_keep_is_matched_without_data(make_trigger):
    _, token = make_trigger()
    event = push(token, {**motd(noop=False, pending=False), "facts": {"blob": "x" * EVENT_DATA_MAX_BYTES}})
    assert event.state == "matched" and event.data is None
    assert event.summary["host"] == "web1.example.com"


def test_the_summary_text_is_report_summary_s():
    report = {
        "configuration_version": 1700000000,
        "puppet_version": "8.4.0",
        "environment": "production",
        "metrics": {
            "resources": {
                "values": [["total", "Total", 12], ["changed", "Changed", 2], ["failed", "Failed", 0]]
            },
            "time": {
                "values": [["file", "File", 0.123456], ["total", "Total", 1.5], ["exec", "Exec", 1e-05]]
            },
            "changes": {"values": []},
        },
    }
    # Categories and names as Puppet labels them; values sorted by their text with the total
    # last, zeros left out, fractions with two decimals; as in Puppet Server.
    assert summary_text(report, now=1763719200) == (
        "Application:\n"
        "   Initial environment: \n"
        "   Converged environment: production\n"
        "         Run mode: server\n"
        "Changes:\n"
        "Resources:\n"
        "          Changed: 2\n"
        "            Total: 12\n"
        "Time:\n"
        "             File: 0.12\n"
        "             Exec: 0.00\n"
        "         Last run: 1763719200\n"
        "            Total: 1.50\n"
        "Version:\n"
        "           Config: 1700000000\n"
        "           Puppet: 8.4.0\n"
    )


@pytest.mark.skipif(shutil.which("puppet") is None, reason="puppet-agent is not installed")
@pytest.mark.django_db(transaction=True)
def test_a_real_puppet_run_gives_the_same_data_every_way_it_comes(tmp_path: Path, live_server, monkeypatch):
    """One `puppet apply`: Puppet's http processor sends its YAML report, and a processor that
    does what the module's does sends the push body, and the JSON report."""
    owner = User.objects.create_user("ops")
    tokens = {}
    for way in ("yaml", "push", "json"):
        trigger, token = Trigger.create_with_token(owner=owner, name=way)
        tokens[way] = (trigger, str(token))
    url = f"http://127.0.0.1:{urlparse(live_server.url).port}/api/events"
    monkeypatch.setenv("RELAY_TEST_EVENTS_URL", url)
    monkeypatch.setenv("RELAY_TEST_PUSH_TOKEN", tokens["push"][1])
    monkeypatch.setenv("RELAY_TEST_JSON_TOKEN", tokens["json"][1])
    install_module_like_processor(tmp_path)
    target = tmp_path / "motd"
    manifest = f"""
class profile::motd {{
  file {{ '{target}': content => "managed {uuid.uuid4()}\\n" }}
  notify {{ 'hello': }}
}}
include profile::motd
"""
    reporturl = url.replace("http://", f"http://x:{tokens['yaml'][1]}@")
    run = puppet_apply(tmp_path, manifest, "--reports=http,relaytest", f"--reporturl={reporturl}")
    assert run.returncode == 2, run.stdout + run.stderr
    data = {}
    for way, (trigger, _) in tokens.items():
        [event] = Event.objects.filter(trigger=trigger)
        services.process(str(event.pk))
        event.refresh_from_db()
        assert event.state == "matched", event.failure_reason
        data[way] = event.data

    assert without_last_run(data["json"]) == without_last_run(data["yaml"])
    assert {**data["push"], "summary": ""} == {**data["yaml"], "summary": ""}
    assert sorted(data["yaml"]["resource_statuses"]) == [f"File[{target}]", "Notify[hello]"]
    assert data["yaml"]["resource_statuses"][f"File[{target}]"]["containment_path"] == [
        "Stage[main]",
        "Profile::Motd",
        f"File[{target}]",
    ]
    # Report#summary, as the module sends it, but for what differs in Puppet Server: the run
    # mode, the initial environment (not in a report sent to it) and when it was made.
    differs = re.compile(r"^ *(Run mode|Initial environment|Last run):.*\n", re.MULTILINE)
    assert differs.sub("", data["push"]["summary"]) == differs.sub("", data["yaml"]["summary"])
    assert "Run mode: server" in data["yaml"]["summary"]
