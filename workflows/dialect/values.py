"""Values as relay-core's Go code sees them, and their text forms.

Relay evaluates YAML and JSON data: None, bool, int (YAML integers), float (JSON and
expression numbers are Go float64), str, list, dict, and datetime (from `now()`). Python's
`True == 1` and `1 == 1.0` do not hold in Go's reflect.DeepEqual, and Go prints numbers and
JSON its own way, so those are spelled out here.
"""

import base64
import json
import math
from datetime import UTC, datetime
from typing import Any

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


def sprint(value: Any) -> str:
    """Go's fmt.Sprintf("%v", value)."""
    match value:
        case None:
            return "<nil>"
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            return format_float(value, "g")
        case str():
            return value
        case bytes():
            return "[" + " ".join(str(b) for b in value) + "]"
        case datetime():
            return format_time(value)
        case list():
            return "[" + " ".join(sprint(v) for v in value) + "]"
        case dict():
            return "map[" + " ".join(f"{k}:{sprint(value[k])}" for k in sorted(value)) + "]"
    return str(value)


_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
}
_JSON_ESCAPES["&"] = "\\u0026"
_JSON_ESCAPES["\u2028"] = "\\u2028"
_JSON_ESCAPES["\u2029"] = "\\u2029"


def _json_string(text: str) -> str:
    out = []
    for char in text:
        if char in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[char])
        elif ord(char) < 0x20:
            out.append(f"\\u{ord(char):04x}")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            out.append("\ufffd")  # Go writes invalid UTF-8 as the replacement character
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def to_json(value: Any, indent: str | None = None, _level: int = 0) -> str:
    """Go's json.Marshal (or MarshalIndent with prefix "" and `indent`): sorted keys,
    HTML-safe escapes, Go's number forms, times as RFC 3339, bytes as base64."""
    match value:
        case None:
            return "null"
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            if math.isnan(value) or math.isinf(value):
                raise EvaluationError(f"json: unsupported value: {format_float(value, 'g')}")
            return format_float(value, "json")
        case str():
            return _json_string(value)
        case bytes():
            return _json_string(base64.b64encode(value).decode("ascii"))
        case datetime():
            return _json_string(format_time(value))
        case list():
            items = [to_json(v, indent, _level + 1) for v in value]
            return _json_container("[", "]", items, indent, _level)
        case dict():
            items = [
                _json_string(str(k))
                + (": " if indent is not None else ":")
                + to_json(value[k], indent, _level + 1)
                for k in sorted(value)
            ]
            return _json_container("{", "}", items, indent, _level)
    raise EvaluationError(f"json: unsupported type: {type_name(value)}")


def _json_container(start: str, end: str, items: list[str], indent: str | None, level: int) -> str:
    if not items:
        return start + end
    if indent is None:
        return start + ",".join(items) + end
    inner = "\n" + indent * (level + 1)
    return start + inner + ("," + inner).join(items) + "\n" + indent * level + end


def from_json(text: str) -> Any:
    """Go's json.Unmarshal into an interface{}: every number is a float64."""

    def refuse(name: str) -> None:
        raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")

    return json.loads(text, parse_int=float, parse_constant=refuse)


def deep_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual on evaluated values: types must match (int is not float64, bool is
    not a number)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
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
