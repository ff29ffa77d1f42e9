"""Reading report documents safely: plain data only, bounded in nesting and expansion.

No Ruby or Python object is ever built: every tag (`!ruby/object:...`, `!ruby/sym`, any
other) is dropped and its node read as the plain mapping, sequence or string it is. YAML
timestamps become ISO-8601 UTC strings, the same form `canonical_time` gives quoted ones.
Aliases are not copied when loading (PyYAML shares the object), so a billion-laughs document
loads cheaply; `plain()` then walks the result with a node budget and a depth limit, and
stops such a document fast with a clear reason. Nesting is bounded before any reader builds
a node (see `_check_depth`). The worker calls these in a child process with limits
(triggers/reader.py), which bounds what no check here can: memory, time, a reader's crash.
"""

import gc
import json
import math
import re
from datetime import UTC, datetime
from typing import Any

import yaml

MAX_DEPTH = 64


class UnreadableReport(Exception):
    """The document cannot be read as a report; the message says why, for the event."""


class NotAReport(UnreadableReport):
    """The document is read, and is no report of any shape the service knows."""


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
        parsed = parse_time(value)
        if parsed is None:
            return value
        value = parsed
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)  # YAML timestamps without a zone are UTC
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


TIME_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|z|[+-]\d{2}:?\d{2})?$")


def parse_time(text: str) -> datetime | None:
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


_OPENS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSES = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_depth(text: str) -> None:
    """libyaml parses without recursion, but PyYAML's composer, which builds the nodes from
    libyaml's events, recurses in C once per level without any limit: some 50,000 `[` or `- `
    (100 KB) overflow the stack and kill the process outright, no RecursionError. So the
    events are counted first, and a document nested deeper than plain() would accept stops
    here, before a node is built. About 9 MB/s, on the reference path only (the fast path's
    rapidyaml parses without recursion, and its emitter refuses more than 64 levels)."""
    depth = 0
    for event in yaml.parse(text, Loader=ReportLoader):
        kind = type(event)
        if kind in _OPENS:
            depth += 1
            if depth > MAX_DEPTH + 1:
                raise UnreadableReport(f"The YAML is nested deeper than {MAX_DEPTH} levels; not read.")
        elif kind in _CLOSES:
            depth -= 1


def load_yaml(data: bytes) -> Any:
    """The reference reader: PyYAML's CSafeLoader with every tag stripped."""
    text = _text(data)
    try:
        _check_depth(text)
        return yaml.load(text, Loader=ReportLoader)  # noqa: S506 - ReportLoader builds plain data only
    except RecursionError:
        raise UnreadableReport(f"The YAML is nested deeper than {MAX_DEPTH} levels; not read.") from None
    except yaml.YAMLError as exc:
        raise UnreadableReport(f"The YAML cannot be read: {_first_line(exc)}") from None


def load_json(data: bytes) -> Any:
    text = _text(data)
    try:
        return json.loads(text)
    except RecursionError:
        raise UnreadableReport(f"The JSON is nested deeper than {MAX_DEPTH} levels; not read.") from None
    except ValueError as exc:
        raise UnreadableReport(f"The JSON cannot be read: {exc}") from None


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def node_budget(size: int) -> int:
    """How many values plain() may walk in a document of `size` bytes: a value needs a few
    bytes of text, unless aliases multiply it, so anything far beyond is a bomb."""
    return 1_000_000 + size // 2


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
        if isinstance(value, float) and not math.isfinite(value):  # NaN and infinities are not JSON
            return None
        return value

    return walk(document, 0)


# What no text in PostgreSQL holds: NUL, and lone surrogates (`\ud800` in JSON), which no
# UTF-8 can carry.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def without_nul(value: Any) -> Any:
    """PostgreSQL keeps no NUL in text or jsonb, and no lone surrogate: what goes into the
    database (a summary, a key) has U+FFFD instead. (The stored parts are files, and keep the
    report as it was.)"""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None:
        return ""
    if isinstance(key, datetime):
        return canonical_time(key)
    return str(key).lower() if isinstance(key, bool) else str(key)


# The fast path: rapidyaml (C++) parses and emits JSON, json.loads (C) builds the objects.
# Its typing is not PyYAML's YAML 1.1 (`yes`, `~`, `017`, `12:30`, `1e3` and unquoted
# timestamps differ), and checking scalars one by one from Python would cost more than it
# saves (a call into ryml's tree costs 0.7 us). So it takes only documents with Puppet's
# report header, and declines, on scans of the whole text and a hook on floats, any that
# holds what would be read differently. Declined documents go to the reference reader; the
# differential test (tests/test_parsing_fast.py) holds the two to the same output.
PSYCH_REPORT = b"--- !ruby/object:Puppet::Transaction::Report\n"
FALL_BACK = (
    b"&id0",  # Psych's anchors (any alias is found below): the reference reader's, and its bounds'
    b"<<:",  # merge keys
    b"\n---",  # more than one document
    b"\n...",
    b"!!",  # standard tags
)
DEEP = "\n" + " " * (2 * (MAX_DEPTH + 1))  # ryml indents its JSON two spaces a level
# Whole plain scalars that YAML 1.1 (PyYAML) types differently from rapidyaml's JSON: bools
# and nulls beyond true/false/null; octal, hex, binary, signed, underscored and sexagesimal
# numbers; floats with a bare dot, underscores or a sign, and the special floats; dates and
# times. (Exponents without a sign are caught by _float.) A scalar is only typed when all of
# it matches, so each pattern ends where the scalar ends: a UUID starting `0b` is a string.
# Quoted scalars are not told apart: a false alarm only costs the slower reader.
# No two repeats next to each other take the same characters (`[0-9]+_[0-9_]*`, not
# `[0-9][0-9_]*_[0-9_]*`): the scans stay linear, where the latter took 22 s on a 32 KB
# `1_1_1…x`.
_WORDS = rb"[Yy]es|YES|[Nn]o|NO|[Oo]n|ON|[Oo]ff|OFF|True|TRUE|False|FALSE|Null|NULL|~"
_INT = (
    rb"[-+]?0[0-7_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?0b[01_]+|\+[0-9][0-9_]*|[-+]?[0-9]+_[0-9_]*"
    rb"|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
)
_FLOAT = (
    rb"[-+]?\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*\.(?:[eE][-+][0-9]+)?"
    rb"|[-+]?[0-9]*_[0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*\.[0-9]*_[0-9_]*(?:[eE][-+][0-9]+)?"
    rb"|\+[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
    rb"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*"
)
_DATE = (
    rb"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?"
    rb"(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)?"
)
_ALIAS = rb"\*[^ \t\n,\]}]+"  # rapidyaml would keep `*name`; PyYAML (and its bounds) resolve it
_TYPED = rb"(?:" + _WORDS + rb"|" + _INT + rb"|" + _FLOAT + rb"|" + _DATE + rb"|" + _ALIAS + rb")"
# One pattern per way a plain value can start, each with a literal first (Python's re then
# skips ahead fast), and one for keys.
YAML11_PLAIN = (
    *(
        re.compile(start + _TYPED + rb"[ \t]*(?:\n|[,\]}#])")
        for start in (rb": ", rb"- ", rb"\[", rb"\{", rb", ", rb"\? ")
    ),
    # Keys, coarsely (exact, this pattern would cost 250 ms at every line start): any that
    # starts like a number, a null or an alias, or is a bool or null word, declines.
    re.compile(rb"\n[ \t]*(?:- )?(?:(?:[0-9+.~*]|-[0-9.])[^:\n]*|(?:" + _WORDS + rb"|null)[ \t]*):(?: |\n)"),
)


class _NotTheSame(Exception):
    pass


def _float(text: str) -> float:
    # PyYAML reads an exponent as a float only with a dot before it and a sign after it
    # (`1.0e+3`); `1e3` or `1.0e3` are strings to it.
    if "e" in text or "E" in text:
        mantissa, _, exponent = text.lower().partition("e")
        if "." not in mantissa or exponent[:1] not in ("+", "-"):
            raise _NotTheSame(text)
    return float(text)


def load_yaml_fast(data: bytes) -> Any:
    """The document read by rapidyaml, or None when it is not one the fast path reads the
    same as the reference (load_yaml, then plain)."""
    if not data.startswith(PSYCH_REPORT) or any(marker in data for marker in FALL_BACK):
        return None
    if any(pattern.search(data) for pattern in YAML11_PLAIN):
        return None
    import ryml

    try:
        tree = ryml.parse_in_arena(data)  # raises ryml's own exceptions: all mean "decline"
        root = tree.root_id()
        document = tree.first_child(root) if tree.is_stream(root) else root
        text = ryml.emit_json_malloc(tree, document)
        if DEEP in text:
            return None
        # The cyclic collector would run again and again while a few hundred thousand new
        # containers appear, as long as the parse itself; none of them can form a cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return json.loads(text, parse_float=_float)
        finally:
            if collecting:
                gc.enable()
    except Exception:
        return None  # the reference reader reads it, or says why it cannot


def read_yaml(data: bytes, budget: int) -> Any:
    """A YAML report as plain data: the fast path where it applies, else the reference."""
    fast = load_yaml_fast(data)
    if fast is not None:
        return fast
    return plain(load_yaml(data), budget)
