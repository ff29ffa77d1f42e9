"""What a Puppet run changed, or in noop would change, on each node: read from the node's
last run report, which the node prints after Puppet over the same SSH connection.

Puppet exits 0 in noop mode with changes pending, so the exit code cannot say what a real
run would do; the report can. The agent runs with `--job-id <run id>`, which Puppet writes
into that report (and sends with its catalog request), so a report left by another run (the
agent's daemon, a run that was already going) is told apart and not taken for this one's.

The report comes from the node, where root can write anything into it: it is untrusted data.
At most `max_bytes` of it are read. The YAML is read as a stream of parser events and only
the parts used here are built, as plain data: no tag (`!ruby/object:…`, `!ruby/sym`, any
other) constructs anything. Nesting deeper than MAX_DEPTH ends the read at once (libyaml's
C composer overflows the stack on a deep pile of brackets, and its scanner slows
quadratically with flow depth), aliases share their anchor's value instead of copying it,
and what comes out is bounded: the first MAX_RESOURCES resources with the first MAX_CHANGES
changes each, values cut to VALUE_CHARS characters, with the totals beside them."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import shlex
import threading
from typing import Any

import yaml

MAX_DEPTH = 64
MAX_EVENTS = 2_000_000  # parser events: a real 5 MB report has about 500,000
MAX_RESOURCES = 50
MAX_CHANGES = 10
VALUE_CHARS = 200
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
REPORT_MARK = b"relay-bridge: last run report\n"
END_MARK = b"relay-bridge: end of report\n"
CHANGE_STATUSES = ("noop", "success", "failure")  # `audit` events record, they do not change

# A file's content is in its events as a checksum, `{sha256}<hex>`; Puppet's stringifying
# converter writes a binary-encoded one (the desired value) as its base64 text. Only a value
# that decodes to exactly such a checksum is decoded.
CHECKSUM_RE = re.compile(
    r"\{(?:md5|md5lite|sha1|sha1lite|sha224|sha256|sha256lite|sha384|sha512|mtime|ctime|none)\}[ -~]{0,200}"
)
BASE64_RE = re.compile(r"(?:[A-Za-z0-9+/]{4}){4,100}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")

# Only these parts of a report are built; the rest (logs, metrics, a resource's tags…) is
# read past. Old Puppet's reports (`!ruby/object:Puppet::Resource::Status` and so on) have
# the same keys once their tags are dropped.
TOP_KEYS = frozenset(
    (
        "host",
        "job_id",
        "noop",
        "noop_pending",
        "status",
        "transaction_uuid",
        "transaction_completed",
        "configuration_version",
        "environment",
        "puppet_version",
        "resource_statuses",
    )
)
RESOURCE_KEYS = frozenset(("resource", "resource_type", "title", "failed", "events"))
EVENT_KEYS = frozenset(("property", "previous_value", "desired_value", "status", "audited", "message"))

# One report read at a time: a large one costs memory while it is read, and the SSH
# backend's nodes end in parallel.
_READING = threading.Lock()


class ReportError(Exception):
    """The report cannot be used; the message says why, for the run's results."""


def fetch_script(puppet: str, max_bytes: int, sudo: list[str] | None = None) -> str:
    """Shell that prints the node's last run report after Puppet: the path from Puppet's own
    configuration (as the agent sees it: its section), then at most `max_bytes` + 1 bytes of
    the file in base64, between two marks. Base64 cannot hold a mark, so whatever the report
    or Puppet's output says, the last REPORT_MARK is the bridge's. `sudo` goes before both
    commands: the report is root's alone."""
    sudo = sudo or []
    config = shlex.join([*sudo, puppet, "config", "print", "lastrunreport", "--section", "agent"])
    head = shlex.join([*sudo, "head", "-c", str(max_bytes + 1)])
    return (
        f"f=$({config} 2>/dev/null); echo {shlex.quote(REPORT_MARK.decode().strip())}; "
        f'[ -n "$f" ] && {head} -- "$f" 2>/dev/null | base64; '
        f"echo {shlex.quote(END_MARK.decode().strip())}"
    )


def job_reading(job_id: str, max_bytes: int) -> dict[str, Any]:
    """What a job's handle keeps of its reports: the job id they carry and how much of one
    its command prints (a resumed job reads what its command printed, whatever the
    configuration says now)."""
    return {"job_id": job_id, "report_max_bytes": max_bytes if job_id else 0}


def reading_of(handle: dict[str, Any]) -> tuple[str, int]:
    """(job id, report_max_bytes) from a handle job_reading wrote; ("", 0) from another."""
    job_id, max_bytes = handle.get("job_id"), handle.get("report_max_bytes")
    if not isinstance(job_id, str) or not job_id or not isinstance(max_bytes, int) or max_bytes <= 0:
        return "", 0
    return job_id, max_bytes


def split_output(output: bytes) -> tuple[bytes, bytes | None]:
    """(what Puppet printed, the report's bytes or None when the node printed none)."""
    start = output.rfind(REPORT_MARK)
    if start < 0:
        return output, None
    body = output[start + len(REPORT_MARK) :]
    end = body.rfind(END_MARK)
    if end < 0:
        return output[:start], None  # cut short: the connection went before the end
    try:
        report = base64.b64decode(b"".join(body[:end].split()), validate=True)
    except (binascii.Error, ValueError):
        report = None
    return output[:start], report


def node_changes(report: bytes | None, job_id: str, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """The fields a node's entry in run_results gains: `changes_pending`, `resources_total`,
    `resources` and `report`; or `changes_pending: null` and `report_error` saying why the
    report could not be used."""
    try:
        if not report:
            raise ReportError("The node printed no last run report (see the output).")
        if len(report) > max_bytes:
            raise ReportError(f"The node's last run report is larger than {max_bytes} bytes; not read.")
        with _READING:
            return summarise(load(report), job_id)
    except ReportError as exc:
        return {"changes_pending": None, "report_error": str(exc)}


def load(data: bytes) -> dict[str, Any]:
    """The parts of a YAML (or JSON, which is YAML) report that `summarise` reads."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"The report is not UTF-8 (byte {exc.start}).") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # PyYAML without libyaml has no C loader
    builder = _Builder()
    try:
        for count, event in enumerate(yaml.parse(text, Loader=loader)):
            if count >= MAX_EVENTS:
                raise ReportError(f"The report has more than {MAX_EVENTS} YAML events; not read.")
            builder.feed(event)
    except yaml.YAMLError as exc:
        raise ReportError(f"The report is not YAML: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(builder.document, dict):
        raise ReportError("The report is not a mapping.")
    return builder.document


_SKIP = object()  # a mapping key whose pair is read past


class _Builder:
    """Plain data from parser events, built only along the paths `_wanted` keeps."""

    def __init__(self) -> None:
        self.document: Any = None
        self.stack: list[list[Any]] = []  # [container, path, key or None]; None container: read past
        self.anchors: dict[str, Any] = {}
        self.resolver = yaml.resolver.Resolver()

    def feed(self, event: yaml.Event) -> None:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(self.stack) >= MAX_DEPTH:
                raise ReportError(f"The report is nested deeper than {MAX_DEPTH} levels; not read.")
            path, keep = self._next_path()
            container: Any = None
            if keep:
                container = {} if isinstance(event, yaml.MappingStartEvent) else []
            self.stack.append([container, path, None, event.anchor])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            container, _, _, anchor = self.stack.pop()
            if anchor and container is not None:
                self.anchors[anchor] = container  # only once whole: an alias inside it is unknown
            self._add(container, skipped=container is None)
        elif isinstance(event, yaml.ScalarEvent):
            if self.stack and self.stack[-1][0] is None:
                return  # read past: neither typed nor kept
            value = self._scalar(event)
            if event.anchor:
                self.anchors[event.anchor] = value
            self._add(value)
        elif isinstance(event, yaml.AliasEvent):
            self._add(self.anchors.get(event.anchor))

    def _next_path(self) -> tuple[tuple[Any, ...], bool]:
        """The path of the node about to start, and whether it is built."""
        if not self.stack:
            return (), True
        container, path, key, _ = self.stack[-1]
        if container is None:
            return path, False
        if isinstance(container, dict):
            if key is None:  # a collection as a mapping key: read past, and its pair too
                return path, False
            if key is _SKIP:
                return path, False
            child = (*path, key)
        else:
            child = (*path, len(container))
        return child, _wanted(child)

    def _add(self, value: Any, skipped: bool = False) -> None:
        if not self.stack:
            self.document = value
            return
        frame = self.stack[-1]
        container, path, key = frame[0], frame[1], frame[2]
        if container is None:
            return
        if isinstance(container, list):
            if not skipped:
                container.append(value)
            return
        if key is None:  # this is a key
            frame[2] = _SKIP if skipped or isinstance(value, (dict, list)) else _key(value)
            return
        frame[2] = None
        if key is not _SKIP and not skipped and _wanted((*path, key)):
            container[key] = value

    def _scalar(self, event: yaml.ScalarEvent) -> Any:
        """A scalar as YAML 1.1 types it when it is plain and untagged; text otherwise (a
        tag never constructs anything). Mapping keys are their text."""
        frame = self.stack[-1] if self.stack else None
        if (
            not event.implicit[0]
            or event.style
            or (frame and isinstance(frame[0], dict) and frame[2] is None)
        ):
            return event.value
        tag = self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
        return _typed(tag, event.value)


def _wanted(path: tuple[Any, ...]) -> bool:
    if len(path) == 1:
        return path[0] in TOP_KEYS
    if path[0] != "resource_statuses" or len(path) == 2:
        return True
    if len(path) == 3:
        return path[2] in RESOURCE_KEYS
    if path[2] != "events" or len(path) == 4:
        return True
    if len(path) == 5:
        return path[4] in EVENT_KEYS
    return True


def _key(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _typed(tag: str, text: str) -> Any:
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:bool":
        return text.lower() in ("yes", "true", "on")
    # Long numbers stay text: YAML 1.1's sexagesimal integers (`1:2:3…`) cost quadratic time.
    if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and len(text) <= 40:
        node = yaml.ScalarNode(tag, text)
        if tag.endswith("int"):
            return _CONSTRUCTOR.construct_yaml_int(node)
        return _CONSTRUCTOR.construct_yaml_float(node)
    return text  # strings, timestamps (as written), anything else


def summarise(report: dict[str, Any], job_id: str) -> dict[str, Any]:
    """A node's changes from its report's parts: only a report of this run (its `job_id`)."""
    found = report.get("job_id")
    if found != job_id:
        if found is None:
            raise ReportError("The node's last run report names no job id: it is not this run's.")
        raise ReportError(f"The node's last run report is another run's (job id {_shown(found)}).")
    return changes_of(report)


def changes_of(report: dict[str, Any]) -> dict[str, Any]:
    """The fields node_changes returns, from a report's parts (a report known to be the
    run's: by its job id here, by its transaction in PuppetDB)."""
    statuses = report.get("resource_statuses")
    statuses = statuses if isinstance(statuses, dict) else {}
    resources: list[dict[str, Any]] = []
    total = 0
    noop_events = False
    # Aliases can hand one long list of events to every resource: the events looked at are
    # counted, so such a report ends here instead of being walked resource by resource.
    budget = MAX_EVENTS
    for name, status in statuses.items():
        if not isinstance(status, dict):
            continue
        events = status.get("events")
        events = events if isinstance(events, list) else []
        budget -= len(events) + 1
        if budget < 0:
            raise ReportError(f"The report's resources have more than {MAX_EVENTS} events; not read.")
        changes = [e for e in events if _is_change(e)]
        noop_events = noop_events or any(e.get("status") == "noop" for e in changes)
        failed = status.get("failed") is True
        if not changes and not failed:
            continue
        total += 1
        if len(resources) < MAX_RESOURCES:
            resources.append(_resource(name, status, changes, failed))
    pending = report.get("noop_pending")
    if not isinstance(pending, bool):
        pending = noop_events  # Puppet before 4.x wrote no noop_pending
    summary: dict[str, Any] = {"changes_pending": pending}
    if report.get("transaction_completed") is False:
        # No catalog was applied (it did not compile, say): nothing is known to be in sync.
        summary = {
            "changes_pending": None,
            "report_error": f"Puppet applied no catalog (report status {_shown(report.get('status'))}).",
        }
    summary["resources_total"] = total
    summary["resources"] = resources
    meta = {
        key: _value(report[key])
        for key in ("status", "noop", "transaction_uuid", "configuration_version", "environment")
        if isinstance(report.get(key), (str, int, float, bool))
    }
    summary["report"] = meta
    return summary


def _is_change(event: Any) -> bool:
    return (
        isinstance(event, dict)
        and event.get("status") in CHANGE_STATUSES
        and event.get("audited") is not True
    )


def _resource(
    name: Any, status: dict[str, Any], changes: list[dict[str, Any]], failed: bool
) -> dict[str, Any]:
    kind, title = status.get("resource_type"), status.get("title")
    if not isinstance(kind, str) or not isinstance(title, (str, int, float)):
        # Very old reports name the resource only in its key, `Type[title]`.
        match = re.fullmatch(r"([^\[]+)\[(.*)\]", str(name), re.DOTALL)
        kind, title = (match.group(1), match.group(2)) if match else ("", str(name))
    resource: dict[str, Any] = {"type": _text(kind), "title": _text(str(title))}
    if failed:
        resource["failed"] = True
    resource["changes"] = [_change(event) for event in changes[:MAX_CHANGES]]
    if len(changes) > MAX_CHANGES:
        resource["changes_total"] = len(changes)
    return resource


def _change(event: dict[str, Any]) -> dict[str, Any]:
    change: dict[str, Any] = {
        "property": _value(event.get("property")),
        "from": _value(event.get("previous_value")),
        "to": _value(event.get("desired_value")),
        "status": _value(event.get("status")),
    }
    if event.get("status") == "failure" and event.get("message") is not None:
        change["message"] = _value(event.get("message"))
    return change


def _value(value: Any) -> Any:
    """A value for run_results: scalars as they are (text cut to VALUE_CHARS), a checksum
    Puppet wrote in base64 decoded, a small list or mapping as it is and a larger one as
    its JSON text, cut."""
    if value is None or isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(_checksum(value))
    text = _json(value, VALUE_CHARS + 1)
    if len(text) <= VALUE_CHARS:
        return json.loads(text)
    return text[:VALUE_CHARS] + "…"


def _text(value: str) -> str:
    return value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS] + "…"


def _checksum(value: str) -> str:
    if BASE64_RE.fullmatch(value):
        try:
            decoded = base64.b64decode(value, validate=True).decode("ascii")
        except (binascii.Error, ValueError):
            return value
        if CHECKSUM_RE.fullmatch(decoded):
            return decoded
    return value


def _json(value: Any, budget: int) -> str:
    """`value` as compact JSON, stopping once `budget` characters are written: an alias
    bomb's shared lists are never walked whole."""
    parts: list[str] = []
    used = 0

    def emit(text: str) -> bool:
        nonlocal used
        parts.append(text)
        used += len(text)
        return used < budget

    def walk(item: Any) -> bool:
        if isinstance(item, dict):
            if not emit("{"):
                return False
            for index, (key, inner) in enumerate(item.items()):
                if not emit(("," if index else "") + json.dumps(key) + ":") or not walk(inner):
                    return False
            return emit("}")
        if isinstance(item, list):
            if not emit("["):
                return False
            for index, inner in enumerate(item):
                if (index and not emit(",")) or not walk(inner):
                    return False
            return emit("]")
        if isinstance(item, float) and not math.isfinite(item):
            item = str(item)
        return emit(json.dumps(item))

    walk(value)
    return "".join(parts)


def _shown(value: Any) -> str:
    return repr(value)[:80]


def from_puppetdb(report: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """A report as PuppetDB keeps it (a row of /pdb/query/v4/reports, and the rows of
    /pdb/query/v4/events for its hash) in the parts a node's report has, for changes_of:
    PuppetDB keeps a report's resource events, not its resource statuses, so a resource is
    failed when one of its events failed."""
    statuses: dict[str, dict[str, Any]] = {}
    for event in events:
        kind, title = event.get("resource_type"), event.get("resource_title")
        status = statuses.setdefault(
            f"{kind}[{title}]", {"resource_type": kind, "title": title, "failed": False, "events": []}
        )
        status["events"].append(
            {
                "property": event.get("property"),
                "previous_value": event.get("old_value"),
                "desired_value": event.get("new_value"),
                "status": event.get("status"),
                "message": event.get("message"),
            }
        )
        status["failed"] = status["failed"] or event.get("status") == "failure"
    parts = {key: report.get(key) for key in TOP_KEYS if key in report}
    parts["resource_statuses"] = statuses
    # PuppetDB keeps no `transaction_completed`: a failed report without a failed resource
    # is a run that applied no catalog (it did not compile, say).
    if report.get("status") == "failed" and not any(s["failed"] for s in statuses.values()):
        parts["transaction_completed"] = False
    return parts
