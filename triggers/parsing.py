"""Reading report documents safely: plain data only, bounded in nesting and expansion.

No Ruby or Python object is ever built: every tag (`!ruby/object:...`, `!ruby/sym`, any
other) is dropped and its node read as the plain mapping, sequence or string it is. YAML
timestamps become ISO-8601 UTC strings, the same form `canonical_time` gives quoted ones.
Aliases are not copied when loading (PyYAML shares the object), so a billion-laughs document
loads cheaply; `plain()` then walks the result with a node budget and a depth limit, and
stops such a document fast with a clear reason.
"""

import json
import re
from datetime import UTC, datetime
from typing import Any

import yaml

MAX_DEPTH = 64


class UnreadableReport(Exception):
    """The document cannot be read as a report; the message says why, for the event."""


class ReportLoader(yaml.CSafeLoader):
    """PyYAML's C safe loader, with every tag stripped to plain data."""


def _untagged(loader: ReportLoader, suffix_or_node: Any, node: Any = None) -> Any:
    node = node if node is not None else suffix_or_node
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


def _timestamp(loader: ReportLoader, node: yaml.ScalarNode) -> str:
    value = yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    return canonical_time(value) if isinstance(value, datetime) else value.isoformat()  # a date


def _set(loader: ReportLoader, node: yaml.MappingNode) -> list:
    return list(loader.construct_mapping(node))


ReportLoader.add_multi_constructor("!", _untagged)  # !ruby/object:..., !ruby/sym, ...
# Standard tags keep the safe loader's constructors (an exact tag wins over a prefix).
ReportLoader.add_multi_constructor("tag:yaml.org,2002:", _untagged)  # !!python/... and the like
ReportLoader.add_constructor(None, _untagged)  # any tag left
ReportLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)
ReportLoader.add_constructor("tag:yaml.org,2002:binary", yaml.SafeLoader.construct_scalar)  # base64 text
ReportLoader.add_constructor("tag:yaml.org,2002:set", _set)
ReportLoader.add_constructor("tag:yaml.org,2002:omap", _untagged)
ReportLoader.add_constructor("tag:yaml.org,2002:pairs", _untagged)


def canonical_time(value: Any) -> Any:
    """A time as `YYYY-MM-DDTHH:MM:SS.ffffffZ` in UTC: from a datetime, or from an ISO or
    Puppet-style string (nanoseconds are cut to microseconds). Anything else is returned."""
    if isinstance(value, str):
        parsed = _parse_time(value)
        if parsed is None:
            return value
        value = parsed
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)  # YAML timestamps without a zone are UTC
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


TIME_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|z|[+-]\d{2}:?\d{2})?$")


def _parse_time(text: str) -> datetime | None:
    match = TIME_RE.match(text.strip())
    if match is None:
        return None
    day, clock, fraction, zone = match.groups()
    micro = (fraction or "")[:6].ljust(6, "0")
    if zone in (None, "Z", "z"):
        zone = "+00:00"
    elif ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    try:
        return datetime.fromisoformat(f"{day}T{clock}.{micro}{zone}")
    except ValueError:
        return None


def _text(data: bytes) -> str:
    """Reports are UTF-8 (a UTF-8 byte-order mark is allowed); nothing else is guessed at."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise UnreadableReport(
            f"The report is not valid UTF-8: byte {exc.start} is {data[exc.start : exc.start + 1]!r}."
        ) from None


def load_yaml(data: bytes) -> Any:
    """The reference reader: PyYAML's CSafeLoader with every tag stripped."""
    text = _text(data)
    try:
        return yaml.load(text, Loader=ReportLoader)  # noqa: S506 - ReportLoader builds plain data only
    except RecursionError:
        raise UnreadableReport(
            f"The YAML is nested deeper than this reader allows ({MAX_DEPTH} levels)."
        ) from None
    except yaml.YAMLError as exc:
        raise UnreadableReport(f"The YAML cannot be read: {_first_line(exc)}") from None


def load_json(data: bytes) -> Any:
    text = _text(data)
    try:
        return json.loads(text)
    except RecursionError:
        raise UnreadableReport(
            f"The JSON is nested deeper than this reader allows ({MAX_DEPTH} levels)."
        ) from None
    except ValueError as exc:
        raise UnreadableReport(f"The JSON cannot be read: {exc}") from None


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def plain(document: Any, budget: int) -> Any:
    """A copy of `document` in JSON's types only (str keys, lists), walked at most `budget`
    nodes and MAX_DEPTH deep: an alias bomb or a deep pile of brackets ends here, fast."""
    remaining = budget

    def walk(value: Any, depth: int) -> Any:
        nonlocal remaining
        remaining -= 1
        if remaining < 0:
            raise UnreadableReport(
                f"The document expands to more than {budget} values (an alias bomb?); not read."
            )
        if depth > MAX_DEPTH:
            raise UnreadableReport(f"The document is nested deeper than {MAX_DEPTH} levels; not read.")
        if isinstance(value, dict):
            return {_key(k): walk(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v, depth + 1) for v in value]
        if isinstance(value, datetime):
            return canonical_time(value)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, float) and value != value:  # NaN is not JSON
            return None
        return value

    return walk(document, 0)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None:
        return ""
    if isinstance(key, datetime):
        return canonical_time(key)
    return str(key).lower() if isinstance(key, bool) else str(key)
