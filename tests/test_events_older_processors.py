"""The push bodies of the Puppet module's older report processors (puppetlabs-relay 1.0-1.2).

Still installed on many Puppet servers, they POST `{"data": {"report": {host, logs, summary,
status, time}}}` (1.0) or `{"data": {"facts": {...}, "report": {...}}}` (1.1, 1.2) for every
run, unchanged ones too, and count any 2xx as delivered. The bodies here are what the real
processors sent (tests/fixtures/older-report-processors/: captured from their unmodified
code on Debian's Puppet). They are read as reports: filters by status, by noop changes
pending and by environment (from the summary's text) apply, a resource filter says it cannot,
and the event's data keeps their shape, which published workflows bind (`!Data report.host`,
`!Data facts`). A body that is no report of any shape is refused at the door, not answered
202 to end `failed`."""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.events_helpers import post
from tests.test_connection_api import assert_problem
from tests.test_events_worker import part
from triggers import services
from triggers.ingest import PEEK_WHOLE_JSON
from triggers.models import Event, Trigger

OLDER = Path(__file__).parent / "fixtures" / "older-report-processors"


def body(name: str) -> bytes:
    return (OLDER / f"puppetlabs-relay-{name}.json").read_bytes()


def sent(name: str) -> dict[str, Any]:
    return json.loads(body(name))["data"]


@pytest.fixture
def make_trigger(alice):
    def make(**filters) -> tuple[Trigger, str]:
        trigger, token = Trigger.create_with_token(owner=alice, name=f"t{Trigger.objects.count()}", **filters)
        return trigger, str(token)

    return make


def push(token: str, raw: bytes) -> Event:
    """As the processor sends it (Bearer, application/json), then read by the worker."""
    response = post(token, raw, "application/json", basic=False)
    assert response.status_code == 202, response.content
    services.process(response.json()["id"])
    return Event.objects.get(pk=response.json()["id"])


@pytest.mark.parametrize(
    ("name", "state", "status", "noop_pending"),
    [
        ("1.0.0-changed", "matched", "changed", False),
        ("1.1.0-changed", "matched", "changed", False),
        ("1.1.0-unchanged", "filtered", "unchanged", False),
        ("1.2.0-noop-pending", "matched", "unchanged", True),
        ("1.2.0-failed", "matched", "failed", False),
    ],
)
def test_each_older_body_is_read_as_a_report_and_its_data_keeps_its_shape(
    make_trigger, name, state, status, noop_pending
):
    _, token = make_trigger()
    event = push(token, body(name))
    assert (event.state, event.failure_reason) == (state, "")
    assert (event.host, event.status) == ("web1.example.com", status)
    summary = event.summary
    assert (summary["status"], summary["noop_pending"]) == (status, noop_pending)
    # What the summary's text names: the environment, the versions, the metrics.
    assert summary["environment"] == "production" and summary["puppet_version"] == "7.23.0"
    assert summary["configuration_version"].isdigit()
    assert summary["time"] == sent(name)["report"]["time"].replace(" +0000", ".000000Z").replace(" ", "T")
    assert (summary["resources"], summary["resources_total"]) == ([], 0)
    if state == "filtered":  # the shipped processor's default rule, as for any report
        assert event.filter_note == "Unchanged, with no noop change pending."
    # A workflow reads what the processor sent, as it sent it.
    assert event.data == sent(name)
    assert ("facts" in event.data) == (not name.startswith("1.0"))
    assert part(event, "logs") == sent(name)["report"]["logs"]
    assert part(event, "report")["host"] == "web1.example.com"


def test_the_summary_text_gives_the_metrics(make_trigger):
    _, token = make_trigger()
    metrics = push(token, body("1.2.0-failed")).summary["metrics"]
    assert metrics["resources"] == {"failed": 1, "out_of_sync": 1, "skipped": 1, "total": 9}
    assert metrics["events"] == {"failure": 1, "total": 1}
    assert metrics["time"]["exec"] == 0.03 and isinstance(metrics["time"]["last_run"], int)
    noop = push(token, body("1.2.0-noop-pending")).summary["metrics"]
    assert noop["events"] == {"noop": 2, "total": 2} and noop["resources"]["out_of_sync"] == 2


@pytest.mark.parametrize(
    ("filters", "matched"),
    [
        ({"statuses": ["failed"]}, {"1.2.0-failed"}),
        ({"statuses": ["changed"]}, {"1.0.0-changed", "1.1.0-changed"}),
        ({"statuses": ["unchanged"]}, {"1.1.0-unchanged", "1.2.0-noop-pending"}),
        ({"environments": ["staging"]}, set()),
        (
            {"environments": ["production"]},
            {"1.0.0-changed", "1.1.0-changed", "1.2.0-noop-pending", "1.2.0-failed"},
        ),
        ({"host_globs": ["web*"]}, {"1.0.0-changed", "1.1.0-changed", "1.2.0-noop-pending", "1.2.0-failed"}),
        ({"host_globs": ["db*"]}, set()),
    ],
)
def test_filters_by_status_environment_and_host_apply(make_trigger, filters, matched):
    _, token = make_trigger(**filters)
    names = ["1.0.0-changed", "1.1.0-changed", "1.1.0-unchanged", "1.2.0-noop-pending", "1.2.0-failed"]
    events = {name: push(token, body(name)) for name in names}
    assert {name for name, event in events.items() if event.state == "matched"} == matched
    assert {event.state for event in events.values()} <= {"matched", "filtered"}
    if filters.get("statuses") == ["failed"]:
        assert (
            events["1.1.0-changed"].filter_note == "Its status changed is not one of the trigger's statuses."
        )
    if filters.get("environments") == ["staging"]:
        assert events["1.2.0-failed"].filter_note == (
            "Its environment production is not one of the trigger's environments."
        )


@pytest.mark.parametrize(
    "filters", [{"resource_types": ["File"]}, {"title_globs": ["/etc/*"]}, {"tags": ["profile::web"]}]
)
def test_a_resource_filter_cannot_match_a_body_without_resources_and_says_so(make_trigger, filters):
    _, token = make_trigger(statuses=["changed", "failed"], **filters)
    for name in ("1.0.0-changed", "1.1.0-changed", "1.2.0-failed"):
        event = push(token, body(name))
        assert event.state == "filtered"
        assert event.filter_note == (
            "The report carries no resources (the Puppet module's releases 1.x send only its host, "
            "status, logs, summary and facts), so the trigger's resource filters cannot match it."
        )


def test_a_body_past_the_doors_look_is_read_by_the_worker_the_same(make_trigger):
    """A 1.1 body whose facts make it larger than the door reads whole (a host with many
    interfaces, mounts or custom facts)."""
    _, token = make_trigger()
    data = sent("1.1.0-changed")
    data["facts"]["custom"] = {f"fact_{i}": "x" * 100 for i in range(3000)}
    raw = json.dumps({"data": data}).encode()
    assert len(raw) > PEEK_WHOLE_JSON
    event = push(token, raw)
    assert (event.state, event.status, event.host) == ("matched", "changed", "web1.example.com")
    assert event.data == data


REFUSED = [
    # Parsed, and no report of any shape: 422.
    (b'{"data": {"report": {"logs": [], "status": "changed"}}}', 422, "no host"),
    (b'{"data": {"facts": {"hostname": "web1"}, "report": {"host": ""}}}', 422, "no host"),
    (b'{"data": {}}', 422, "no host"),
    (b'{"status": "changed"}', 422, "no host"),
    (b'{"data": "web1"}', 422, "no host"),
    (b'["web1"]', 422, "not a mapping"),
    (b'"a string"', 422, "not a mapping"),
    (b'{"data": {"host": "x"}, "key": {"a": 1}}', 422, "key must be a string"),
    # Not JSON the worker could read: 400.
    (b"{not json", 400, "cannot be read"),
    (b'{"host": "caf\xe9"}', 400, "not valid UTF-8"),
    (b'{"host": "deep", "x": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "nested deeper than 64"),
    (b'{"host": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested deeper than 64"),
    # Larger than the door reads whole: scanned for a host key, which no report lacks.
    (json.dumps({"data": {"report": {"logs": ["x" * 100] * 3000}}}).encode(), 422, "no host anywhere"),
    (b"[" + b'"hostname", ' * 30_000 + b"1]", 422, "no host anywhere"),
]


@pytest.mark.parametrize(("raw", "status", "reason"), REFUSED)
def test_a_body_that_is_no_report_is_refused_at_the_door_with_the_reason(make_trigger, raw, status, reason):
    _, token = make_trigger()
    problem = assert_problem(post(token, raw, "application/json", basic=False), status)
    assert reason in problem["detail"]
    assert not Event.objects.exists()  # nothing is stored to fail later


def test_the_module_2x_body_and_a_json_report_are_taken_as_before(make_trigger):
    _, token = make_trigger()
    two = push(
        token, json.dumps({"data": {"host": "web2", "status": "changed", "resource_statuses": {}}}).encode()
    )
    assert (two.state, two.data) == (
        "matched",
        {"host": "web2", "status": "changed", "resource_statuses": {}},
    )
    whole = push(token, json.dumps({"host": "web3", "status": "failed", "data": {"x": 1}}).encode())
    assert (whole.state, whole.host, whole.data["host"]) == ("matched", "web3", "web3")


@pytest.mark.parametrize("config", ["0042", "Infinity", "1e5", "abc: def"])
def test_the_versions_in_the_summary_text_stay_text(make_trigger, config):
    """A config_version script may print anything; it is the event's configuration_version
    as written, not a number made of it (nor NaN or an infinity, which no database keeps)."""
    _, token = make_trigger()
    data = sent("1.0.0-changed")
    text = data["report"]["summary"]
    data["report"]["summary"] = text.replace("Config: 1795687071\n", f"Config: {config}\n")
    assert data["report"]["summary"] != text
    event = push(token, json.dumps({"data": data}).encode())
    assert (event.state, event.summary["configuration_version"]) == ("matched", config)
    assert event.summary["metrics"]["changes"] == {"total": 3}


def test_the_event_api_shows_an_older_body_and_filters_by_its_status(make_trigger, alice_api):
    trigger, token = make_trigger()
    failed = push(token, body("1.2.0-failed"))
    push(token, body("1.1.0-changed"))
    url = f"/api/triggers/{trigger.pk}/events/"
    listed = alice_api.get(url, {"status": "failed"}).json()["results"]
    assert [event["id"] for event in listed] == [str(failed.pk)]
    shown = alice_api.get(f"{url}{failed.pk}/").json()
    assert shown["data"] == sent("1.2.0-failed")
    logs = alice_api.get(f"{url}{failed.pk}/parts/logs")
    assert json.loads(b"".join(logs.streaming_content)) == sent("1.2.0-failed")["report"]["logs"]
