import hashlib
import json
import time

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from tests.events_helpers import FIXTURES, fixture, post
from triggers import services
from triggers.models import Event, Trigger
from triggers.tasks import requeue_received_before

PUPPET_8 = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def make_trigger(alice):
    def make(**filters) -> tuple[Trigger, str]:
        trigger, token = Trigger.create_with_token(owner=alice, name=f"t{Trigger.objects.count()}", **filters)
        return trigger, str(token)

    return make


def ingest(token: str, body: bytes, content_type: str = "application/x-yaml") -> Event:
    response = post(token, body, content_type)
    assert response.status_code == 202, response.content
    services.process(response.json()["id"])
    return Event.objects.get(pk=response.json()["id"])


def part(event: Event, name: str):
    meta = event.parts[name]
    with storages["events"].open(meta["name"], "rb") as stored:
        data = stored.read()
    assert len(data) == meta["size"] and hashlib.sha256(data).hexdigest() == meta["sha256"]
    return json.loads(data)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_every_public_fixture_is_read_and_summarised(make_trigger, name):
    _, token = make_trigger()
    event = ingest(token, fixture(name))
    assert event.state in ("matched", "filtered"), event.failure_reason
    summary = event.summary
    assert summary["host"] and summary["status"] in ("changed", "unchanged", "failed")
    assert summary["time"].endswith("Z") and summary["time"][10] == "T"
    assert "!ruby" not in json.dumps(part(event, "report"))
    assert part(event, "report")["host"] == summary["host"]
    assert isinstance(part(event, "logs"), list) and isinstance(part(event, "events"), list)


def test_puppet_2_6_tags_symbols_aliases_and_times_become_plain_data(make_trigger):
    _, token = make_trigger()
    event = ingest(token, fixture("puppet-2.6-puppetlabs-puppet-report2.6.x.yaml"))
    report = part(event, "report")
    assert report["external_times"] == {"config_retrieval": 0.170313835144043}  # !ruby/sym key
    assert report["logs"][0]["level"] == "debug"  # !ruby/sym value
    assert report["logs"][1]["version"] == "2.6.1"  # *id001 alias
    assert report["time"] == "2010-09-23T22:44:05.894401Z"  # unquoted YAML timestamp, -07:00
    assert event.summary["status"] == "unchanged"  # derived: 2.6 reports carry no status
    assert event.summary["metrics"]["resources"] == {"total": 7}


def test_both_time_formats_end_as_the_same_iso_string(make_trigger):
    _, token = make_trigger()
    quoted = ingest(token, b"host: a\ntime: '2010-09-23 15:44:05.894401 -07:00'\nstatus: changed\n")
    unquoted = ingest(token, b"host: b\ntime: 2010-09-23 15:44:05.894401 -07:00\nstatus: changed\n")
    iso = ingest(
        token,
        b'{"host": "c", "time": "2010-09-23T22:44:05.894401000+00:00", "status": "changed"}',
        "application/json",
    )
    assert (
        quoted.summary["time"]
        == unquoted.summary["time"]
        == iso.summary["time"]
        == "2010-09-23T22:44:05.894401Z"
    )


def test_the_puppet_8_summary_has_the_changed_resources(make_trigger):
    _, token = make_trigger()
    event = ingest(token, PUPPET_8)
    summary = event.summary
    assert (summary["host"], summary["status"], summary["environment"]) == (
        "example-host",
        "changed",
        "production",
    )
    assert summary["transaction_uuid"] == "ebdb4923-d612-4850-9093-fc1f1cc1dd64"
    assert summary["report_format"] == 12 and summary["puppet_version"] == "8.4.0"
    assert summary["metrics"]["resources"]["changed"] == 6
    exec1 = next(r for r in summary["resources"] if r["title"] == "example-command1")
    assert exec1["type"] == "Exec" and exec1["change_count"] == 1 and exec1["out_of_sync_count"] == 1
    assert exec1["containment_path"] == ["Stage[main]", "Default_config", "Exec[example-command1]"]
    assert "default_config" in exec1["tags"]
    assert summary["resources_total"] == len(summary["resources"]) > 0
    assert part(event, "events")[0]["resource"]


def test_the_shipped_report_processor_s_push_body(make_trigger):
    _, token = make_trigger()
    body = {
        "data": {
            "host": "web1.example.com",
            "noop": False,
            "status": "changed",
            "time": "2026-11-21T10:00:00.000Z",
            "configuration_version": "1700000000",
            "transaction_uuid": "6b7a1c3e-0000-4000-8000-000000000001",
            "code_id": None,
            "summary": "---\nversion:\n  config: 1700000000\n",
            "resource_statuses": {
                "File[/etc/motd]": {
                    "resource_type": "File",
                    "title": "/etc/motd",
                    "change_count": 1,
                    "out_of_sync_count": 1,
                    "containment_path": ["Stage[main]", "Profile::Motd", "File[/etc/motd]"],
                    "corrective_change": True,
                }
            },
        },
        "key": "run-42",
    }
    event = ingest(token, json.dumps(body).encode(), "application/json")
    assert event.state == "matched" and event.key == "run-42"
    [motd] = event.summary["resources"]
    assert (motd["type"], motd["title"], motd["corrective_change"]) == ("File", "/etc/motd", True)
    assert event.summary["corrective_change"] is True


BILLION_LAUGHS = b"""host: bomb
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (BILLION_LAUGHS, "application/x-yaml", "alias bomb"),
        (b"host: deep\nx: " + b"[" * 5000 + b"]" * 5000 + b"\n", "application/x-yaml", "nested deeper"),
        (
            b'{"host": "deep", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
            "application/json",
            "nested deeper",
        ),
        (b"\xff\xfe\x00garbage", "application/x-yaml", "not valid UTF-8"),
        (b"host: caf\xe9\n", "application/x-yaml", "not valid UTF-8"),
        (b'{"host": "caf\xe9"}', "application/json", "not valid UTF-8"),
        (b"host: [unclosed", "application/x-yaml", "cannot be read"),
        (b"{not json", "application/json", "cannot be read"),
        (b"- just\n- a list\n", "application/x-yaml", "not a mapping"),
        (b'{"status": "changed"}', "application/json", "no host"),
        (b'"a string"', "application/json", "not a mapping"),
        (b'{"data": {"host": "x"}, "key": {"a": 1}}', "application/json", "key must be a string"),
    ],
)
def test_unreadable_documents_fail_with_a_reason_and_fast(make_trigger, body, content_type, reason):
    _, token = make_trigger()
    started = time.monotonic()
    event = ingest(token, body, content_type)
    assert time.monotonic() - started < 5
    assert event.state == "failed"
    assert reason in event.failure_reason
    # The worker lives on: the next report is read as usual.
    assert ingest(token, PUPPET_8).state == "matched"


def test_python_tags_build_no_objects(make_trigger, tmp_path):
    from pathlib import Path

    Path("/tmp/relay-pwned").unlink(missing_ok=True)
    _, token = make_trigger()
    body = b"host: x\nstatus: changed\nevil: !!python/object/apply:os.system ['touch /tmp/relay-pwned']\n"
    event = ingest(token, body)
    assert event.state == "matched"
    assert part(event, "report")["evil"] == ["touch /tmp/relay-pwned"]  # plain data
    assert not Path("/tmp/relay-pwned").exists()  # and nothing ran


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, "matched"),
        ({"statuses": ["failed"]}, "filtered"),
        ({"statuses": ["changed"]}, "matched"),
        ({"environments": ["staging"]}, "filtered"),
        ({"environments": ["production"]}, "matched"),
        ({"host_globs": ["web*"]}, "filtered"),
        ({"host_globs": ["example-*"]}, "matched"),
        ({"resource_types": ["Service"]}, "filtered"),
        ({"resource_types": ["exec"]}, "matched"),
        ({"title_globs": ["example-command*"]}, "matched"),
        ({"title_globs": ["/etc/*"]}, "filtered"),
        ({"tags": ["default_config"]}, "matched"),
        ({"tags": ["profile::web"]}, "filtered"),
        ({"resource_types": ["Exec"], "title_globs": ["nomatch*"]}, "filtered"),
    ],
)
def test_trigger_filters(make_trigger, filters, expected):
    _, token = make_trigger(**filters)
    assert ingest(token, PUPPET_8).state == expected


def test_unchanged_reports_are_filtered_by_default_unless_noop_is_pending(make_trigger):
    _, token = make_trigger()
    assert ingest(token, b"host: a\nstatus: unchanged\nnoop_pending: false\n").state == "filtered"
    assert ingest(token, b"host: b\nstatus: unchanged\nnoop_pending: true\n").state == "matched"


def test_a_class_in_the_containment_path_matches_a_tag_filter(make_trigger):
    _, token = make_trigger(tags=["profile::motd"])
    body = {
        "host": "h",
        "status": "changed",
        "resource_statuses": {
            "File[/etc/motd]": {
                "resource_type": "File",
                "title": "/etc/motd",
                "change_count": 1,
                "tags": ["file"],
                "containment_path": ["Stage[main]", "Profile::Motd", "File[/etc/motd]"],
            }
        },
    }
    assert ingest(token, json.dumps(body).encode(), "application/json").state == "matched"


def test_two_resends_that_raced_past_the_door_end_one_read_one_duplicate(make_trigger):
    trigger, token = make_trigger()
    first = ingest(token, PUPPET_8)
    # As if a second copy had arrived before the first was recorded: the door could not
    # know, so it made a second event; the worker settles it.
    racer = post(token, PUPPET_8 + b"\n# resent\n").json()["id"]
    assert racer == str(first.pk)  # (the door does know, once the first is recorded)
    body = PUPPET_8 + b"\n# raced\n"
    from django.core.files.base import ContentFile

    from triggers.ingest import body_name

    sha256 = hashlib.sha256(body).hexdigest()
    storages["events"].save(body_name(sha256), ContentFile(body))
    raced = Event.objects.create(trigger=trigger, body_format="yaml", body_sha256=sha256, body_size=len(body))
    services.process(str(raced.pk))
    raced.refresh_from_db()
    assert raced.state == "duplicate" and raced.duplicate_of_id == first.pk


def test_processing_is_idempotent(make_trigger):
    _, token = make_trigger()
    event = ingest(token, PUPPET_8)
    before = (event.state, event.processed_at, event.attempts)
    services.process(str(event.pk))
    event.refresh_from_db()
    assert (event.state, event.processed_at, event.attempts) == before


def test_the_sweeper_requeues_events_stuck_in_received(make_trigger, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # run what it sends here, to see it done
    from relay.celery import app

    app.conf.task_always_eager = True
    try:
        _, token = make_trigger()
        stuck = post(token, PUPPET_8).json()["id"]  # on_commit never ran: as if the broker lost it
        assert Event.objects.get(pk=stuck).state == "received"
        assert requeue_received_before(timezone.now() - timezone.timedelta(minutes=5)) == 0  # too young
        assert requeue_received_before(timezone.now()) == 1
        assert Event.objects.get(pk=stuck).state == "matched"
    finally:
        app.conf.task_always_eager = False
