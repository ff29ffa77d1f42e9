"""Reading a node's last run report: what Puppet changed or would change, from reports real
Puppet wrote, and nothing more than bounded plain data from reports a hostile node wrote."""

import base64
import json
import time
from pathlib import Path

import pytest
from relay_bridge import reports

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
TARGET = "/srv/relay-e2e/target"
OLD_SUM = "{sha256}369b74f2003ce39f5829ec7a2f84852b72b610d0312c8951d5d8f7316c9902ba"
NEW_SUM = "{sha256}c191cdc9d1cbb23832d2bf4696f83604c66714cafb34e367022962500d9b9652"


def fixture(name: str) -> bytes:
    return (FIXTURES / f"puppet-7.23-{name}.yaml").read_bytes()


def report(resources: str = "", job_id: str = "job-1", **top: str) -> bytes:
    """A Puppet-shaped report with the given resource_statuses (YAML, indented 2)."""
    head = {"job_id": job_id, "noop": "true", "noop_pending": "true", "status": "unchanged", **top}
    lines = ["--- !ruby/object:Puppet::Transaction::Report", *(f"{k}: {v}" for k, v in head.items())]
    return ("\n".join(lines) + "\nresource_statuses:\n" + resources).encode()


def file_resource(title: str, events: str) -> str:
    key = title if len(title) < 100 else "long"  # a YAML key has at most 1024 characters
    return f"""  File[{key}]:
    title: {json.dumps(title)}
    resource_type: File
    failed: false
    events:
{events}"""


def event(prop: str, old: str, new: str, status: str = "noop") -> str:
    return f"""    - property: {prop}
      previous_value: {old}
      desired_value: {new}
      status: {status}
      audited: false
"""


def test_a_real_noop_report_says_which_resources_would_change_and_how():
    changes = reports.node_changes(fixture("noop"), "relay-abc123")

    assert changes["changes_pending"] is True
    assert changes["resources_total"] == 3
    assert changes["resources"] == [
        {
            "type": "File",
            "title": TARGET,
            # Puppet wrote the desired checksum as base64 (a binary string): decoded here.
            "changes": [
                {"property": "content", "from": OLD_SUM, "to": NEW_SUM, "status": "noop"},
                {"property": "mode", "from": "0644", "to": "0640", "status": "noop"},
            ],
        },
        {
            "type": "File",
            "title": "/srv/relay-e2e/newfile",
            "changes": [{"property": "ensure", "from": "absent", "to": "file", "status": "noop"}],
        },
        {
            "type": "Notify",
            "title": "hello",
            "changes": [{"property": "message", "from": "absent", "to": "hello", "status": "noop"}],
        },
    ]
    assert changes["report"] == {
        "status": "unchanged",
        "noop": True,
        "transaction_uuid": "ceff85f8-f6b8-4c94-8229-79f2f7825618",
        "configuration_version": 1795406869,
        "environment": "production",
    }


def test_a_real_enforcing_report_lists_the_changes_made_with_none_pending():
    changes = reports.node_changes(fixture("real"), "real-1")

    assert changes["changes_pending"] is False
    assert changes["report"]["status"] == "changed"
    assert [(r["type"], r["title"]) for r in changes["resources"]] == [
        ("File", TARGET),
        ("File", "/srv/relay-e2e/newfile"),
        ("Notify", "hello"),
    ]
    assert changes["resources"][0]["changes"][0] == {
        "property": "content",
        "from": OLD_SUM,
        "to": NEW_SUM,
        "status": "success",
    }


def test_a_real_noop_report_after_the_changes_has_only_the_notify_pending():
    changes = reports.node_changes(fixture("clean"), "clean-1")
    assert changes["changes_pending"] is True  # a notify is always out of sync
    assert [(r["type"], r["title"]) for r in changes["resources"]] == [("Notify", "hello")]


def test_a_report_with_nothing_to_change_says_no_changes_pending():
    changes = reports.node_changes(report(noop_pending="false"), "job-1")
    assert changes == {
        "changes_pending": False,
        "resources_total": 0,
        "resources": [],
        "report": {"status": "unchanged", "noop": True},
    }


@pytest.mark.parametrize(
    ("job_id", "error"),
    [
        ("another", "is another run's (job id 'another')"),
        (None, "names no job id: it is not this run's"),
    ],
)
def test_a_report_of_another_run_is_not_taken_for_this_one(job_id, error):
    data = fixture("noop") if job_id else report(job_id="~")
    changes = reports.node_changes(data.replace(b"relay-abc123", b"another"), "job-1")
    assert changes == {"changes_pending": None, "report_error": f"The node's last run report {error}."}


def test_a_run_that_applied_no_catalog_knows_nothing_of_pending_changes():
    data = report(status="failed", noop_pending="false", transaction_completed="false")
    changes = reports.node_changes(data, "job-1")
    assert changes["changes_pending"] is None
    assert changes["report_error"] == "Puppet applied no catalog (report status 'failed')."


def test_failed_resources_and_failure_messages_are_listed():
    exec_failed = """  Exec[refuse]:
    title: refuse
    resource_type: Exec
    failed: true
    events:
    - property: returns
      previous_value: notrun
      desired_value: ['0']
      status: failure
      message: "change from 'notrun' to ['0'] failed: '/bin/false' returned 1 instead of one of [0]"
  Service[web]:
    title: web
    resource_type: Service
    failed: true
    events: []
"""
    changes = reports.node_changes(report(exec_failed), "job-1")
    assert changes["resources"] == [
        {
            "type": "Exec",
            "title": "refuse",
            "failed": True,
            "changes": [
                {
                    "property": "returns",
                    "from": "notrun",
                    "to": ["0"],
                    "status": "failure",
                    "message": "change from 'notrun' to ['0'] failed: "
                    "'/bin/false' returned 1 instead of one of [0]",
                }
            ],
        },
        {"type": "Service", "title": "web", "failed": True, "changes": []},
    ]


def test_audit_events_and_resources_in_sync_are_not_changes():
    resources = file_resource("/a", event("owner", "root", "root", status="audit")) + file_resource(
        "/b", "      []\n"
    )
    changes = reports.node_changes(report(resources, noop_pending="false"), "job-1")
    assert (changes["resources_total"], changes["resources"]) == (0, [])


def test_old_puppet_reports_without_noop_pending_count_noop_events():
    old = b"""--- !ruby/object:Puppet::Transaction::Report
job_id: job-1
status: !ruby/sym unchanged
resource_statuses:
  "File[/etc/motd]": !ruby/object:Puppet::Resource::Status
    resource_type: &id001 File
    title: /etc/motd
    events:
    - !ruby/object:Puppet::Transaction::Event
      property: !ruby/sym ensure
      previous_value: !ruby/sym absent
      desired_value: !ruby/sym file
      status: noop
  "Package[vim]": !ruby/object:Puppet::Resource::Status
    events:
    - !ruby/object:Puppet::Transaction::Event
      property: ensure
      previous_value: "7.0"
      desired_value: latest
      status: noop
"""
    changes = reports.node_changes(old, "job-1")
    assert changes["changes_pending"] is True
    assert changes["report"] == {"status": "unchanged"}
    assert changes["resources"] == [
        {
            "type": "File",
            "title": "/etc/motd",
            "changes": [{"property": "ensure", "from": "absent", "to": "file", "status": "noop"}],
        },
        # No type and title of its own: taken from its key.
        {
            "type": "Package",
            "title": "vim",
            "changes": [{"property": "ensure", "from": "7.0", "to": "latest", "status": "noop"}],
        },
    ]


def test_what_is_kept_is_bounded_with_the_totals_beside_it():
    many_changes = "".join(event(f"p{i}", "a", "b") for i in range(reports.MAX_CHANGES + 2))
    resources = file_resource("/first", many_changes) + "".join(
        file_resource(f"/f{i}", event("ensure", "absent", "file")) for i in range(reports.MAX_RESOURCES + 9)
    )
    changes = reports.node_changes(report(resources), "job-1")

    assert changes["resources_total"] == reports.MAX_RESOURCES + 10
    assert len(changes["resources"]) == reports.MAX_RESOURCES
    first = changes["resources"][0]
    assert len(first["changes"]) == reports.MAX_CHANGES
    assert first["changes_total"] == reports.MAX_CHANGES + 2


def test_long_values_and_titles_are_cut_and_large_structures_become_cut_text():
    long = "x" * 5000
    big_list = json.dumps([f"group-{i}" for i in range(500)])
    resources = file_resource(long, event("content", long, long) + event("groups", "[]", big_list))
    [resource] = reports.node_changes(report(resources), "job-1")["resources"]

    assert resource["title"] == "x" * reports.VALUE_CHARS + "…"
    content, groups = resource["changes"]
    assert content["from"] == content["to"] == "x" * reports.VALUE_CHARS + "…"
    assert groups["from"] == []
    assert groups["to"].startswith('["group-0","group-1",') and groups["to"].endswith("…")
    assert len(groups["to"]) == reports.VALUE_CHARS + 1


def test_only_base64_that_is_a_checksum_is_decoded():
    plain = base64.b64encode(b"just some text here").decode()
    resources = file_resource("/f", event("content", plain, base64.b64encode(NEW_SUM.encode()).decode()))
    [change] = reports.node_changes(report(resources), "job-1")["resources"][0]["changes"]
    assert (change["from"], change["to"]) == (plain, NEW_SUM)


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        ("!!python/object/apply:os.system ['touch {marker}']", ["touch {marker}"]),
        ("!!python/object/new:os.system ['touch {marker}']", ["touch {marker}"]),
        ("!!python/name:os.system", ""),
        ("!ruby/object:Gem::Installer {{i: x}}", {"i": "x"}),
        ("!ruby/hash:ActionController::RouteSet {{'foo; touch {marker}': 1}}", {"foo; touch {marker}": 1}),
        ("!ruby/sym file", "file"),
    ],
)
def test_tags_construct_nothing_and_are_read_as_plain_data(tmp_path, value, plain):
    marker = tmp_path / "pwned"
    resources = file_resource("/f", event("content", "a", value.format(marker=marker)))
    [change] = reports.node_changes(report(resources), "job-1")["resources"][0]["changes"]
    assert not marker.exists()
    assert change["to"] == json.loads(json.dumps(plain).replace("{marker}", str(marker)))


@pytest.mark.parametrize(
    "document",
    [
        b"a: " + b"[" * 1_000_000,  # libyaml's C composer overflows the C stack on this
        b"a: " + b"{a: " * 1_000_000,
        b"- " * 1_000_000 + b"x",
        b"job_id: job-1\nresource_statuses:\n  x:\n    events:\n    - desired_value: " + b"[" * 200_000,
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences", "in-a-value"],
)
def test_deep_nesting_ends_the_read_at_once(document):
    started = time.monotonic()
    changes = reports.node_changes(document, "job-1")
    assert time.monotonic() - started < 2
    assert changes == {
        "changes_pending": None,
        "report_error": "The report is nested deeper than 64 levels; not read.",
    }


def test_an_alias_bomb_is_neither_copied_nor_walked():
    # 10^30 values if copied or walked whole.
    anchors = ["{a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 30)]
    bomb = event("content", ", ".join(anchors) + "}", "*a29")
    changes = reports.node_changes(report(file_resource("/f", bomb)), "job-1")
    change = changes["resources"][0]["changes"][0]
    assert change["from"].startswith('{"a0":["x","x","x",') and len(change["from"]) == reports.VALUE_CHARS + 1
    assert change["to"].startswith("[" * 30 + '"x","x"') and len(change["to"]) == reports.VALUE_CHARS + 1

    # One long list of events handed to every resource: counted, not walked 3,000 times.
    events = ", ".join(["{status: noop, property: p}"] * 1000)
    shared = f"  R[0]: {{resource_type: R, title: '0', events: &events [{events}]}}\n"
    shared += "".join(
        f"  R[{i}]: {{resource_type: R, title: '{i}', events: *events}}\n" for i in range(1, 3000)
    )
    started = time.monotonic()
    changes = reports.node_changes(report(shared), "job-1")
    assert time.monotonic() - started < 5
    assert changes["report_error"] == "The report's resources have more than 2000000 events; not read."


def test_a_report_over_the_limit_is_not_read():
    changes = reports.node_changes(fixture("noop"), "relay-abc123", max_bytes=1000)
    assert changes["report_error"] == "The node's last run report is larger than 1000 bytes; not read."


def test_a_report_of_too_many_yaml_events_is_not_read(monkeypatch):
    monkeypatch.setattr(reports, "MAX_EVENTS", 500)
    changes = reports.node_changes(fixture("noop"), "relay-abc123")
    assert changes["report_error"] == "The report has more than 500 YAML events; not read."


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (b"", "The node printed no last run report (see the output)."),
        (None, "The node printed no last run report (see the output)."),
        (b"job_id: \xff\xfe", "The report is not UTF-8 (byte 8)."),
        (b"job_id: [unclosed", "The report is not YAML: while parsing a flow sequence"),
        (b"- a list\n", "The report is not a mapping."),
        (b"just text", "The report is not a mapping."),
    ],
)
def test_what_is_not_a_report_says_why(document, error):
    changes = reports.node_changes(document, "job-1")
    assert changes["changes_pending"] is None
    assert changes["report_error"].startswith(error)


def test_the_report_is_the_base64_after_the_last_mark_whatever_puppet_printed():
    real = b"job_id: job-1\nnoop_pending: true\n"
    fake = b"job_id: job-1\nnoop_pending: false\n"
    # A manifest can make Puppet print anything, marks and a report included.
    printed = b"Notice: hello\n" + reports.REPORT_MARK + base64.b64encode(fake) + b"\n" + reports.END_MARK
    output = printed + b"Notice: done" + reports.REPORT_MARK + base64.encodebytes(real) + reports.END_MARK
    before, found = reports.split_output(output)
    assert found == real
    assert before == printed + b"Notice: done"


@pytest.mark.parametrize(
    "tail",
    [
        b"am9iX2lkOiBqb2ItMQo=\n",  # cut before the end mark
        b"not base64 at all!\n" + reports.END_MARK,
    ],
)
def test_a_report_cut_short_or_garbled_is_none(tail):
    before, found = reports.split_output(b"Notice: x\n" + reports.REPORT_MARK + tail)
    assert (before, found) == (b"Notice: x\n", None)


def test_no_mark_means_no_report():
    assert reports.split_output(b"Notice: x\n") == (b"Notice: x\n", None)
