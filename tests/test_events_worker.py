import hashlib
import json
import time

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from tests.events_helpers import FIXTURES, big_report, fixture, post
from triggers import services
from triggers.ingest import PEEK_WHOLE_JSON
from triggers.models import Event, Trigger
from triggers.parsing import PSYCH_REPORT
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


def past_the_door(body: bytes) -> bytes:
    """A JSON body larger than the door reads whole (trailing spaces): the worker reads it."""
    return body + b" " * (PEEK_WHOLE_JSON + 1 - len(body))


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (BILLION_LAUGHS, "application/x-yaml", "alias bomb"),
        (b"host: deep\nx: " + b"[" * 5000 + b"]" * 5000 + b"\n", "application/x-yaml", "nested deeper"),
        (
            past_the_door(b'{"host": "deep", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
            "application/json",
            "nested deeper",
        ),
        (b"\xff\xfe\x00garbage", "application/x-yaml", "not valid UTF-8"),
        (b"host: caf\xe9\n", "application/x-yaml", "not valid UTF-8"),
        (past_the_door(b'{"host": "caf\xe9"}'), "application/json", "not valid UTF-8"),
        (b"host: [unclosed", "application/x-yaml", "cannot be read"),
        (b"{not json", "application/x-yaml", "cannot be read"),
        (b"- just\n- a list\n", "application/x-yaml", "not a mapping"),
        (b'{"status": "changed"}', "application/x-yaml", "no host"),
        (b'"a string"', "application/x-yaml", "not a mapping"),
        (
            past_the_door(b'{"data": {"host": "x"}, "key": {"a": 1}}'),
            "application/json",
            "key must be a string",
        ),
    ],
)
def test_unreadable_documents_fail_with_a_reason_and_fast(make_trigger, body, content_type, reason):
    """What the door does not read whole (YAML, JSON past PEEK_WHOLE_JSON with a host key) is
    stored, and the worker says why it cannot read it (other JSON is refused at the door: see
    tests/test_events_older_processors.py)."""
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


def shaped(**resource) -> bytes:
    """A report whose one resource status has the fields given."""
    report = {"host": "h.example.com", "status": "changed", "resource_statuses": {"File[/a]": resource}}
    return json.dumps(report).encode()


@pytest.mark.parametrize(
    "body",
    [
        shaped(changed=True, events=5),
        shaped(changed=True, tags=1.5),
        shaped(changed=True, containment_path=True),
        json.dumps({"data": json.loads(shaped(change_count=1, events=7)), "key": "k"}).encode(),
    ],
)
def test_a_report_of_an_unexpected_shape_fails_with_a_reason(make_trigger, body):
    _, token = make_trigger()
    event = ingest(token, body, "application/json")
    assert (event.state, event.attempts) == ("failed", 1)
    assert event.failure_reason.startswith("The report could not be read: TypeError: ")
    assert ingest(token, PUPPET_8).state == "matched"


def test_what_the_database_cannot_store_does_not_keep_an_event_received(make_trigger):
    _, token = make_trigger()
    body = (
        b'{"host": "web\\u0000one", "status": "changed", "key_metric": Infinity,'
        b' "metrics": {"time": {"values": [["total", "Total", Infinity]]}}}'
    )
    event = ingest(token, body, "application/json")
    assert event.state == "matched"
    assert event.host == "web\ufffdone" and event.summary["metrics"]["time"] == {"total": None}


def test_a_task_for_an_event_this_database_lacks_is_logged(db, caplog):
    unknown = "6b7a1c3e-0000-4000-8000-00000000dead"
    services.process(unknown)
    [record] = [r for r in caplog.records if unknown in r.getMessage()]
    assert record.levelname == "WARNING" and "not in this database" in record.getMessage()


def test_a_report_that_needs_more_memory_than_allowed_fails(make_trigger, settings):
    settings.EVENTS_READ_MEMORY_BYTES = 64 * 2**20
    _, token = make_trigger()
    # ~16 MB for the reference reader: ~500 MB. The limit counts new mappings only, and a child
    # may first reuse what the (long-lived) worker has freed: far more than the limit, then.
    body = big_report(12000).removeprefix(PSYCH_REPORT)
    event = ingest(token, body)
    assert event.state == "failed"
    assert event.failure_reason == "Reading it takes more than 64 MB (EVENTS_READ_MEMORY_BYTES)."
    assert ingest(token, PUPPET_8).state == "matched"


def test_a_read_that_takes_too_long_fails(make_trigger, settings):
    settings.EVENTS_READ_TIMEOUT = 0.5
    _, token = make_trigger()
    event = ingest(token, big_report(3000).removeprefix(PSYCH_REPORT))  # seconds to read
    assert event.state == "failed"
    assert event.failure_reason == "Reading it took more than 0.5 s (EVENTS_READ_TIMEOUT); not read."


def test_the_sweeper_gives_up_on_an_event_out_of_attempts(make_trigger, settings):
    settings.EVENTS_MAX_ATTEMPTS = 3
    _, token = make_trigger()
    lost = post(token, PUPPET_8).json()["id"]
    Event.objects.filter(pk=lost).update(attempts=3)
    stalled = post(token, b"host: h\nstatus: changed\n").json()["id"]
    Event.objects.filter(pk=stalled).update(
        attempts=3, failure_reason="The events storage could not store a part"
    )
    assert requeue_received_before(timezone.now()) == 0
    assert Event.objects.get(pk=lost).failure_reason == "gave up after 3 attempts: worker lost"
    assert Event.objects.get(pk=stalled).failure_reason == (
        "gave up after 3 attempts: The events storage could not store a part"
    )
    assert {e.state for e in Event.objects.all()} == {"failed"}


def test_a_worker_gives_up_on_an_event_out_of_attempts(make_trigger, settings):
    settings.EVENTS_MAX_ATTEMPTS = 2
    _, token = make_trigger()
    event_id = post(token, PUPPET_8).json()["id"]
    Event.objects.filter(pk=event_id).update(attempts=2)
    services.process(event_id)
    event = Event.objects.get(pk=event_id)
    assert (event.state, event.attempts, event.failure_reason) == (
        "failed",
        2,
        "gave up after 2 attempts: worker lost",
    )


def test_the_sweeper_leaves_an_event_being_read_alone(make_trigger):
    _, token = make_trigger()
    event_id = post(token, PUPPET_8).json()["id"]
    an_hour_ago = timezone.now() - timezone.timedelta(hours=1)
    Event.objects.filter(pk=event_id).update(received_at=an_hour_ago, attempts=1, attempted_at=timezone.now())
    assert requeue_received_before(timezone.now() - timezone.timedelta(minutes=2)) == 0
