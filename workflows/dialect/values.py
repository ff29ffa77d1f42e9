"""Values as relay-core's Go code sees them, and their text forms.

Relay evaluates YAML and JSON data: None, bool, int (YAML integers), float (JSON and
expression numbers are Go float64), str, list, dict, and datetime (from `now()`). Python's
`True == 1` and `1 == 1.0` do not hold in Go's reflect.DeepEqual, and Go prints numbers and
JSON its own way, so those are spelled out here.
"""

import base64
import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from workflows.dialect.budget import Budget
from workflows.dialect.errors import EvaluationError


def type_name(value: Any) -> str:
    """Go's %T of the value, for error messages."""
    match value:
        case None:
            return "<nil>"
        case bool():
            return "bool"
        case int():
            return "int"
        case float():
            return "float64"
        case str():
            return "string"
        case bytes():
            return "[]uint8"
        case datetime():
            return "time.Time"
        case list():
            return "[]interface {}"
        case dict():
            return "map[string]interface {}"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_float(value: float, style: str) -> str:
    """strconv.FormatFloat(value, style, -1, 64) for style 'f', 'g' (that is %v) or 'json'."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    text = repr(value)  # the shortest text that reads back to the same float, like Go's -1
    mantissa, _, exp_text = text.partition("e")
    negative = mantissa.startswith("-")
    mantissa = mantissa.lstrip("-")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + (int(exp_text) if exp_text else 0)
    if whole.strip("0") == "":  # 0.000123: the leading zeros of the fraction move the point
        stripped = fraction.lstrip("0")
        point = -(len(fraction) - len(stripped)) + (int(exp_text) if exp_text else 0)
        digits = stripped
    digits = digits.rstrip("0") or "0"
    exponent = point - 1
    if style == "g":
        # strconv's shortest %g: the exponent form when exp < -4 or exp >= 6.
        use_exponent = exponent < -4 or exponent >= 6
    elif style == "json":
        use_exponent = exponent < -6 or exponent >= 21
    else:
        use_exponent = False
    sign = "-" if negative else ""
    if use_exponent:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        exp_sign = "-" if exponent < 0 else "+"
        exp_digits = str(abs(exponent))
        if style != "json" and len(exp_digits) < 2:
            exp_digits = "0" + exp_digits
        return f"{sign}{body}e{exp_sign}{exp_digits}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def format_time(value: datetime) -> str:
    """time.RFC3339Nano: trailing zeros of the fraction dropped, Z for UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


class _Writer:
    """A text being built, charged to `budget` as each part is added (so a value stops at
    the budget's largest value, not after it is built)."""

    def __init__(self, budget: Budget | None) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.budget = budget

    def step(self) -> None:
        if self.budget is not None:
            self.budget.spend()

    def reserve(self, chars: int) -> None:
        """At least `chars` more characters are coming."""
        if self.budget is not None:
            self.budget.check_value(self.size + chars)

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.budget is not None:
            self.budget.check_value(self.size)
            self.budget.take_chars(len(text))
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


def sprint(value: Any, budget: Budget | None = None) -> str:
    """Go's fmt.Sprintf("%v", value)."""
    if isinstance(value, str) and budget is None:
        return value
    out = _Writer(budget)
    _sprint(value, out)
    return out.text()


def _sprint(value: Any, out: _Writer) -> None:
    out.step()
    match value:
        case None:
            out.write("<nil>")
        case bool():
            out.write("true" if value else "false")
        case int():
            out.write(str(value))
        case float():
            out.write(format_float(value, "g"))
        case str():
            out.write(value)
        case bytes():
            out.reserve(len(value) * 2)
            out.write("[" + " ".join(str(b) for b in value) + "]")
        case datetime():
            out.write(format_time(value))
        case list():
            out.write("[")
            for index, item in enumerate(value):
                if index:
                    out.write(" ")
                _sprint(item, out)
            out.write("]")
        case dict():
            out.write("map[")
            for index, key in enumerate(sorted(value)):
                if index:
                    out.write(" ")
                out.write(f"{key}:")
                _sprint(value[key], out)
            out.write("]")
        case _:
            out.write(str(value))


_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
# Go's encoder: the escapes above, other control characters as \u00XX, and invalid UTF-8
# (here a lone surrogate) as the replacement character. str.translate does it at C speed.
_JSON_TABLE: dict[int, str] = {ord(c): e for c, e in _JSON_ESCAPES.items()}
for _code in range(0x20):
    _JSON_TABLE.setdefault(_code, f"\\u{_code:04x}")
for _code in range(0xD800, 0xE000):
    _JSON_TABLE[_code] = "\ufffd"
_CHUNK = 64 * 1024


def _json_string(text: str, out: _Writer | None = None) -> str:
    if out is None:
        return '"' + text.translate(_JSON_TABLE) + '"'
    out.reserve(len(text) + 2)
    out.write('"')
    # In pieces, so a long string that grows as it is escaped stops near the budget.
    for start in range(0, len(text), _CHUNK):
        out.write(text[start : start + _CHUNK].translate(_JSON_TABLE))
    out.write('"')
    return ""


def to_json(value: Any, indent: str | None = None, budget: Budget | None = None) -> str:
    """Go's json.Marshal (or MarshalIndent with prefix "" and `indent`): sorted keys,
    HTML-safe escapes, Go's number forms, times as RFC 3339, bytes as base64."""
    out = _Writer(budget)
    _to_json(value, indent, 0, out)
    return out.text()


def _to_json(value: Any, indent: str | None, level: int, out: _Writer) -> None:
    out.step()
    match value:
        case None:
            out.write("null")
        case bool():
            out.write("true" if value else "false")
        case int():
            out.write(str(value))
        case float():
            if math.isnan(value) or math.isinf(value):
                raise EvaluationError(f"json: unsupported value: {format_float(value, 'g')}")
            out.write(format_float(value, "json"))
        case str():
            _json_string(value, out)
        case bytes():
            out.reserve(len(value) * 4 // 3)
            _json_string(base64.b64encode(value).decode("ascii"), out)
        case datetime():
            _json_string(format_time(value), out)
        case list() | dict():
            start, end = ("[", "]") if isinstance(value, list) else ("{", "}")
            if not value:
                out.write(start + end)
                return
            inner = "" if indent is None else "\n" + indent * (level + 1)
            out.write(start)
            items = value if isinstance(value, list) else sorted(value)
            for index, item in enumerate(items):
                out.write(("," if index else "") + inner)
                if isinstance(value, list):
                    _to_json(item, indent, level + 1, out)
                else:
                    _json_string(str(item), out)
                    out.write(": " if indent is not None else ":")
                    _to_json(value[item], indent, level + 1, out)
            out.write(end if indent is None else "\n" + indent * level + end)
        case _:
            raise EvaluationError(f"json: unsupported type: {type_name(value)}")


def from_json(text: str) -> Any:
    """Go's json.Unmarshal into an interface{}: every number is a float64."""

    def refuse(name: str) -> None:
        raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")

    return json.loads(text, parse_int=float, parse_constant=refuse)


FLOAT64_MAX_INT = 2**1024  # float(n) overflows from here


def unstorable(value: Any) -> str | None:
    """Why `value` cannot be kept as JSON (a run's parameters, in PostgreSQL's jsonb) and read
    back by relay-core's Go, or None: a number that is not finite or too large for a float64,
    a NUL character or a lone surrogate in a string or key."""
    pending = [value]  # a loop, not recursion: data nests as deep as its sender likes
    while pending:
        item = pending.pop()
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"the number {format_float(item, 'g')} is not finite"
        elif isinstance(item, int):
            if abs(item) >= FLOAT64_MAX_INT:
                return f"a number of {len(str(abs(item)))} digits is too large for a float64"
        elif isinstance(item, str):
            if "\x00" in item:
                return "a text holds a NUL character (\\u0000)"
            if _SURROGATE.search(item):
                return "a text holds a lone surrogate (not UTF-8)"
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def deep_equal(a: Any, b: Any, budget: Budget | None = None) -> bool:
    """reflect.DeepEqual on evaluated values: types must match (int is not float64, bool is
    not a number)."""
    if budget is not None:
        budget.spend()
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(deep_equal(x, y, budget) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k], budget) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return False
    return bool(a == b)


def to_string(value: Any) -> str:
    """fnlib's toString: scalars only; whole numbers without exponent."""
    match value:
        case None:
            return ""
        case str():
            return value
        case bytes():
            return value.decode("utf-8", "surrogateescape")
        case datetime():
            return format_time(value)
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            return format_float(value, "f")
    raise EvaluationError(
        f"fn: unexpected type {type_name(value)} "
        "(wanted <nil>, string, []uint8, time.Time, int, int64, float64, bool)"
    )
