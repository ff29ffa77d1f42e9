"""From a read document to the event's summary and data: which report it is, what changed.

Reports come in these shapes: a Relay push body `{"data": {...}, "key": ...}` from the
Puppet module's report processor (2.x: a subset of the report), the push body of its older
releases (1.0-1.2: `{"data": {"report": {host, logs, summary, status, time}, "facts": ...}}`),
or a whole Puppet report (YAML from Puppet's http processor, or JSON), from Puppet 2.6 to 8.
Fields old reports lack are derived as Puppet itself does (status from the resources, counts
from the events); an older push body's from its summary text.

The event's data (what workflows read as `event`) has the push body's shape whichever way
the report came: see event_data.
"""

import fnmatch
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from triggers.parsing import NotAReport, canonical_time, parse_time

SUMMARY_FIELDS = (
    "host",
    "status",
    "noop",
    "noop_pending",
    "environment",
    "time",
    "configuration_version",
    "transaction_uuid",
    "code_id",
    "corrective_change",
    "report_format",
    "puppet_version",
)
INLINE_RESOURCES = 200  # the rest are counted, and are in the offloaded report


# The shapes a report comes in (Recognised.shape).
WHOLE = "report"  # a whole Puppet report: Puppet's http processor (YAML), or its JSON
PUSH = "push"  # the module's report processor, 2.x: {"data": {host, ..., resource_statuses}}
OLDER_PUSH = "push-1.x"  # its releases 1.0-1.2: {"data": {"report": {...}, "facts": {...}}}


@dataclass
class Report:
    report: dict[str, Any]  # the normalised report
    key: str  # the push body's key ("" when none)
    resources: list[dict[str, Any]]  # changed, out of sync or failed
    summary: dict[str, Any]
    data: dict[str, Any] | None  # the event's data (event_data); None when it is too large
    carries_resources: bool = True  # False: the body has none to tell (an older push body)


@dataclass
class Recognised:
    report: dict[str, Any]  # the report's own fields (a push body's data, or data.report)
    key: str  # the push body's key ("" when none)
    shape: str  # WHOLE, PUSH or OLDER_PUSH
    data: dict[str, Any] | None  # a push body's data as it came (None for a whole report)


def recognise(document: Any) -> Recognised:
    """Which report a read document is; NotAReport if it is none. The door asks this
    of the JSON bodies it reads whole (triggers.ingest), the worker of every body."""
    if isinstance(document, dict) and isinstance(document.get("data"), dict) and "host" not in document:
        key = document.get("key")
        if key is not None and not isinstance(key, str | int):
            raise NotAReport("The push body's key must be a string.")
        data = document["data"]
        if "host" not in data and isinstance(data.get("report"), dict):
            found = Recognised(data["report"], str(key or "")[:255], OLDER_PUSH, data)
        else:
            found = Recognised(data, str(key or "")[:255], PUSH, data)
    elif isinstance(document, dict):
        found = Recognised(document, "", WHOLE, None)
    else:
        raise NotAReport(f"Not a Puppet report: the document is a {_kind(document)}, not a mapping.")
    if not isinstance(found.report.get("host"), str) or not found.report["host"]:
        raise NotAReport(
            "Not a Puppet report: it has no host (a report's `host`, or in a push body "
            "`data.host` or, from the module's releases 1.x, `data.report.host`)."
        )
    return found


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", type(None): "null"}.get(
        type(value), "value"
    )


def _times(value: Any) -> Any:
    """`time` fields in their canonical ISO form, wherever they are."""
    if isinstance(value, dict):
        return {k: canonical_time(v) if k == "time" else _times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times(v) for v in value]
    return value


def _statuses(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    statuses = report.get("resource_statuses") or {}
    if isinstance(statuses, list):  # some tools send a list
        return [(str(s.get("resource", "")), s) for s in statuses if isinstance(s, dict)]
    if not isinstance(statuses, dict):
        return []
    return [(str(name), s) for name, s in statuses.items() if isinstance(s, dict)]


def _split(resource: str) -> tuple[str, str]:
    kind, _, title = resource.partition("[")
    return kind, title[:-1] if title.endswith("]") else title


def _resource(name: str, status: dict[str, Any]) -> dict[str, Any]:
    events = [e for e in status.get("events") or [] if isinstance(e, dict)]
    kind, title = _split(str(status.get("resource") or name))
    failed = bool(status.get("failed")) or any(e.get("status") == "failure" for e in events)
    change_count = status.get("change_count")
    if not isinstance(change_count, int):
        change_count = sum(1 for e in events if e.get("status") == "success")
    out_of_sync_count = status.get("out_of_sync_count")
    if not isinstance(out_of_sync_count, int):
        out_of_sync_count = sum(1 for e in events if e.get("status") in ("success", "failure", "noop"))
    if "events" in status:
        noop = any(e.get("status") == "noop" for e in events)
    else:
        # The module's push body has no events, only the counts: out of sync but not
        # changed is a change that noop left pending.
        noop = out_of_sync_count > change_count
    return {
        "type": str(status.get("resource_type") or kind),
        "title": str(status.get("title") or title),
        "containment_path": [str(p) for p in status.get("containment_path") or []],
        "tags": [str(t) for t in status.get("tags") or []],
        "corrective_change": bool(status.get("corrective_change")),
        "change_count": change_count,
        "out_of_sync_count": out_of_sync_count,
        "changed": bool(status.get("changed")) or change_count > 0,
        "out_of_sync": bool(status.get("out_of_sync")) or out_of_sync_count > 0,
        "failed": failed,
        "noop": noop,
    }


def _metrics(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    totals: dict[str, dict[str, Any]] = {}
    metrics = report.get("metrics")
    if not isinstance(metrics, dict):
        return totals
    for category, metric in metrics.items():
        values = metric.get("values") if isinstance(metric, dict) else None
        if not isinstance(values, list):
            continue
        totals[str(category)] = {
            str(row[0]): row[2]
            for row in values
            if isinstance(row, list) and len(row) >= 3 and row[0] is not None
        }
    return totals


def analyse(document: Any) -> Report:
    found = recognise(document)
    if found.shape == OLDER_PUSH:
        return _analyse_older_push(found)
    key, pushed = found.key, found.shape == PUSH
    received = found.report  # the event's data is made from it as it came: its times keep their offsets
    report = _times(found.report)
    every = [_resource(name, status) for name, status in _statuses(report)]
    interesting = [r for r in every if r["changed"] or r["out_of_sync"] or r["failed"]]
    summary = {field: report.get(field) for field in SUMMARY_FIELDS}
    if summary["status"] not in ("failed", "changed", "unchanged"):
        # As Puppet computes it: old reports (2.6) carry none.
        summary["status"] = (
            "failed"
            if any(r["failed"] for r in every)
            else "changed"
            if any(r["changed"] for r in every)
            else "unchanged"
        )
    if summary["noop_pending"] is None:
        summary["noop_pending"] = any(r["noop"] for r in every)
    if summary["corrective_change"] is None:
        summary["corrective_change"] = any(r["corrective_change"] for r in interesting)
    for field in ("noop", "noop_pending", "corrective_change"):
        summary[field] = bool(summary[field])
    for field in ("configuration_version", "transaction_uuid", "code_id", "environment", "puppet_version"):
        if summary[field] is not None:
            summary[field] = str(summary[field])
    summary["metrics"] = _metrics(report)
    summary["resources"] = [
        {k: v for k, v in r.items() if k != "noop"} for r in interesting[:INLINE_RESOURCES]
    ]
    summary["resources_total"] = len(interesting)
    data = event_data(received, pushed, summary["status"])
    return Report(report=report, key=key, resources=interesting, summary=summary, data=data)


# The module's releases 1.0-1.2 ----------------------------------------------------------------
#
# Their processor (puppetlabs-relay v1.0.0-v1.2.0, lib/puppet/reports/relay.rb) sends every
# report, unchanged ones too, as `{"data": {"report": {host, logs, summary, status, time}}}`,
# and from 1.1 with `"facts"` (the node's whole fact hash) beside `report`: `logs` the lines
# above info as "source: message", `summary` Report#summary's text, `time` Ruby's Time#to_s.
# No resources, no noop flag, no transaction_uuid: what the summary names (the environment,
# the versions, the metrics: a noop change pending, a corrective change) is read from it.


def _analyse_older_push(found: Recognised) -> Report:
    report = _times(found.report)
    text = report.get("summary")
    sections = summary_sections(text) if isinstance(text, str) else {}
    application, version = sections.get("application", {}), sections.get("version", {})
    resources = {name: _number(value) for name, value in sections.get("resources", {}).items()}
    events = {name: _number(value) for name, value in sections.get("events", {}).items()}
    summary: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
    status = report.get("status")
    if status not in ("failed", "changed", "unchanged"):
        status = (
            "failed"
            if _positive(resources.get("failed")) or _positive(resources.get("failed_to_restart"))
            else "changed"
            if _positive(resources.get("changed"))
            else "unchanged"
        )
    summary.update(
        host=report["host"],
        status=status,
        noop=False,  # the body does not say
        noop_pending=_positive(events.get("noop")),
        corrective_change=_positive(resources.get("corrective_change")),
        environment=application.get("converged_environment"),
        time=report.get("time"),
        configuration_version=version.get("config"),
        puppet_version=version.get("puppet"),
    )
    for field in ("configuration_version", "environment", "puppet_version"):
        if summary[field] is not None:
            summary[field] = str(summary[field])
    summary["metrics"] = {
        category: {name: _number(value) for name, value in values.items()}
        for category, values in sections.items()
        if category not in ("application", "version")  # texts, not metrics
    }
    summary["resources"] = []
    summary["resources_total"] = 0
    data = event_data(found.data or {}, True, status)  # as it came: `report` and `facts`
    return Report(
        report=report, key=found.key, resources=[], summary=summary, data=data, carries_resources=False
    )


def summary_sections(text: str) -> dict[str, dict[str, str]]:
    """Report#summary's text read back: each section (`Events:`) with its values (`   Noop:
    2`) as text, under the names Puppet labelized (`out_of_sync` from `Out of sync`). Zeros
    are not in the text, and so not here."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = sections.setdefault(_unlabel(line[:-1]), {})
        elif current is not None and ":" in line:
            label, _, value = line.strip().partition(":")
            current[_unlabel(label)] = value.strip()
    return sections


def _unlabel(label: str) -> str:
    return label.strip().lower().replace(" ", "_")


_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]+\.[0-9]+")  # Puppet writes fractions with two decimals


def _number(text: str) -> Any:
    """A metric's value as Puppet wrote it: a whole number, a decimal, or the text as it is
    (never NaN or an infinity, which no JSON holds)."""
    if _INTEGER.fullmatch(text):
        return int(text)
    return float(text) if _DECIMAL.fullmatch(text) else text


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


# The event's data ------------------------------------------------------------------------------
#
# The Puppet module's report processor (puppetlabs-relay 2.x, lib/puppet/reports/relay.rb) sends
# `{"data": {...}}` with these fields of the report, and in resource_statuses only the resources
# not skipped that changed or are out of sync (a property that failed to change counts as out
# of sync; a resource that failed before any property was looked at, or was skipped, is not
# there), each with these six fields. Published workflows bind these paths (`!Data host`,
# `!Data resource_statuses`), so a whole report is given the same shape.
PUSH_FIELDS = (
    "host",
    "noop",
    "status",
    "time",
    "configuration_version",
    "transaction_uuid",
    "code_id",
    "summary",
    "resource_statuses",
)
PUSH_RESOURCE_FIELDS = (
    "resource_type",
    "title",
    "change_count",
    "out_of_sync_count",
    "containment_path",
    "corrective_change",
)
# Bounds on what the database keeps of it: a run that changed 50,000 files is not 50,000
# parameters' worth of use to a workflow. Past EVENT_RESOURCES, resource_statuses keeps the
# first ones and `resource_statuses_total` says how many there were.
EVENT_RESOURCES = 500
EVENT_DATA_MAX_BYTES = 1024 * 1024
# Report#summary's "Run mode": the report processor runs in Puppet Server.
RUN_MODE = "server"


def event_data(report: dict[str, Any], pushed: bool, status: str) -> dict[str, Any] | None:
    """What a workflow trigger reads as `event`: a push body's `data` as it is, or a whole
    Puppet report (YAML or JSON) in that shape (`status` as analyse() found it: old reports
    carry none); resource_statuses capped at EVENT_RESOURCES. None when it is still larger
    than EVENT_DATA_MAX_BYTES as JSON (only a push body with large fields of its own can be)."""
    if pushed:
        data = dict(report)
        statuses = data.get("resource_statuses")
    else:
        statuses = {
            name: {field: resource[field] for field in PUSH_RESOURCE_FIELDS}
            for name, resource in _pushed_resources(report)
        }
        data = {
            "host": report["host"],
            "noop": bool(report.get("noop")),
            "status": status,
            "time": ruby_iso8601(report.get("time")),
            "configuration_version": report.get("configuration_version"),
            "transaction_uuid": report.get("transaction_uuid"),
            "code_id": report.get("code_id"),
            "summary": summary_text(report),
            "resource_statuses": statuses,
        }
    if isinstance(statuses, dict | list) and len(statuses) > EVENT_RESOURCES:
        kept = list(statuses.items() if isinstance(statuses, dict) else statuses)[:EVENT_RESOURCES]
        data["resource_statuses"] = dict(kept) if isinstance(statuses, dict) else kept
        data["resource_statuses_total"] = len(statuses)
    if len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()) > EVENT_DATA_MAX_BYTES:
        return None
    return data


def _pushed_resources(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The resources the module sends, with its six fields (counts derived for old reports)."""
    pushed = []
    for name, status in _statuses(report):
        resource = _resource(name, status)
        if status.get("skipped") or not (resource["change_count"] > 0 or resource["out_of_sync_count"] > 0):
            continue
        pushed.append(
            (
                name,
                {
                    "resource_type": resource["type"],
                    "title": resource["title"],
                    "change_count": resource["change_count"],
                    "out_of_sync_count": resource["out_of_sync_count"],
                    "containment_path": resource["containment_path"],
                    "corrective_change": resource["corrective_change"],
                },
            )
        )
    return pushed


def ruby_iso8601(value: Any) -> Any:
    """A report's time as Ruby's Time#iso8601 writes it (the module sends that): whole
    seconds, the offset the report gave (`2026-11-21T10:00:00+01:00`). A YAML timestamp left
    unquoted by old Puppets has been read as UTC already, and comes out at `+00:00`."""
    parsed = parse_time(value) if isinstance(value, str) else None
    if parsed is None:
        return value
    return parsed.replace(microsecond=0).isoformat()


def summary_text(report: dict[str, Any], now: float | None = None) -> str:
    """Report#summary, the text the module sends as `summary`: each metric's values under its
    label, in Puppet's order (by value as text, the total last), zeros left out, fractions
    with two decimals. As in Puppet Server, "Last run" is when it is made and "Run mode" is
    server."""
    raw: dict[str, dict[str, Any]] = {
        "version": {"config": report.get("configuration_version"), "puppet": report.get("puppet_version")},
        "application": {
            "run_mode": RUN_MODE,
            "initial_environment": report.get("initial_environment"),
            "converged_environment": report.get("environment"),
        },
    }
    metrics = report.get("metrics")
    for category, metric in metrics.items() if isinstance(metrics, dict) else []:
        values = metric.get("values") if isinstance(metric, dict) else None
        rows = raw[str(category)] = {}
        for row in values if isinstance(values, list) else []:
            if isinstance(row, list) and len(row) >= 3:
                rows[_ruby_text(row[0])] = row[2]
        if category != "time":
            rows.setdefault("total", 0)
    raw.setdefault("time", {})["last_run"] = int(time.time() if now is None else now)
    text = ""
    for key in sorted(raw):
        text += f"{_labelize(key)}:\n"
        values = raw[key]
        for label in sorted(values, key=lambda name: (name == "total", _ruby_text(values[name]), name)):
            value = values[label]
            if _is_zero(value):
                continue
            shown = f"{value:0.2f}" if isinstance(value, float) else _ruby_text(value)
            text += f"   {_labelize(label) + ':':>15} {shown}\n"
    return text


def _labelize(name: str) -> str:
    # Puppet::Util::Metric.labelize: Ruby's capitalize lowers the rest.
    return name.capitalize().replace("_", " ")


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _ruby_text(value: Any) -> str:
    """Ruby's to_s of a plain value (Puppet sorts a metric's values by it)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
        mantissa, e, exponent = repr(value).partition("e")
        if e and "." not in mantissa:
            mantissa += ".0"  # Ruby writes 1.0e-05 where Python writes 1e-05
        return mantissa + e + exponent
    return str(value)


def logs_of(report: dict[str, Any]) -> list[Any]:
    logs = report.get("logs")
    return logs if isinstance(logs, list) else []


def events_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every resource event, each with the resource it belongs to."""
    return [
        {"resource": name, **event}
        for name, status in _statuses(report)
        for event in status.get("events") or []
        if isinstance(event, dict)
    ]


@dataclass
class Filters:
    """A trigger's filters; empty lists match anything."""

    statuses: list[str]
    environments: list[str]
    host_globs: list[str]
    resource_types: list[str]
    title_globs: list[str]
    tags: list[str]

    def verdict(
        self, summary: dict[str, Any], resources: list[dict[str, Any]], carries_resources: bool = True
    ) -> tuple[bool, str]:
        """Whether the report matches, and a note for its event: why it was filtered, or
        which filter could not judge it. A body that carries no resources at all (an older
        push body) matches no resource filter, and the note says so."""
        status = summary["status"]
        if self.statuses:
            if status not in self.statuses:
                return False, f"Its status {status} is not one of the trigger's statuses."
        elif status == "unchanged" and not summary["noop_pending"]:
            return False, "Unchanged, with no noop change pending."  # the shipped report processor's rule
        note = ""
        if self.environments:
            environment = summary.get("environment")
            if environment is None:
                # The module's push body carries none: dropping such reports would drop
                # everything the module sends. They pass, and the note says why.
                note = (
                    "The report names no environment (the Puppet module's push body carries "
                    "none), so the environments filter was not applied."
                )
            elif environment not in self.environments:
                return False, f"Its environment {environment} is not one of the trigger's environments."
        if self.host_globs and not any(
            fnmatch.fnmatchcase(summary["host"], glob) for glob in self.host_globs
        ):
            return False, f"Its host {summary['host']} matches none of the trigger's host globs."
        if (self.resource_types or self.title_globs or self.tags) and not carries_resources:
            return False, (
                "The report carries no resources (the Puppet module's releases 1.x send only its "
                "host, status, logs, summary and facts), so the trigger's resource filters cannot match it."
            )
        if (self.resource_types or self.title_globs or self.tags) and not any(
            self._resource_matches(r) for r in resources
        ):
            return False, "None of its changed resources passes the trigger's resource filters."
        return True, note

    def matching(self, resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The changed resources that the resource filters pick (all, without such filters)."""
        return [r for r in resources if self._resource_matches(r)]

    def _resource_matches(self, resource: dict[str, Any]) -> bool:
        if self.resource_types and resource["type"].lower() not in {t.lower() for t in self.resource_types}:
            return False
        if self.title_globs and not any(fnmatch.fnmatchcase(resource["title"], g) for g in self.title_globs):
            return False
        if self.tags:
            # Puppet tags every resource with its classes (`profile::web`); the containment
            # path names them too (`Class[Profile::Web]` or `Profile::Web`).
            carried = {t.lower() for t in resource["tags"]}
            for step in resource["containment_path"]:
                kind, title = _split(step)
                carried.add((title if kind == "Class" else step).lower())
            if not carried & {t.lower() for t in self.tags}:
                return False
        return True
