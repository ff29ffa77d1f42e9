import json
import math
import re
import sys
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import BaseParser

from relay.api.exceptions import PayloadTooLarge
from relay.api.params import is_whole_number

# Deeper than this, a body is refused before it is parsed: json.loads recurses once per
# level, and 100,000 `[` would otherwise end in a RecursionError (a 500).
MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\[\]|\{\}")
# A NUL or a lone surrogate in a parsed string can only come from a `\u0000` or `\uD8xx`..
# `\uDFxx` escape (raw, the first is a control character json refuses, the second no UTF-8).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
# Nor can a number past a float64 (1.8e308) be written without an exponent of three digits
# or a run of 210 digits (209 digits and `e99` are below 1e309): seen in the body with its
# digits all made 9 and its E made e. Bodies with neither skip the walk. (json's number
# hooks would cost a call each, 250,000 ints took 93 ms instead of 20; a regular expression
# 40 to 400 ms on 2 MiB.)
_NUMBER_SHAPES = bytes.maketrans(b"012345678E", b"999999999e")
_HUGE_SHAPES = (b"e999", b"e+999", b"9" * 210)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# The largest whole number a float64 holds: a number past it cannot be compared or computed
# with in expressions, and PostgreSQL's jsonb takes the digits but the engine could not.
_LARGEST = int(sys.float_info.max)


class RefusedJSON(ValueError):
    """A body that is no JSON this service takes. `path` (keys and indexes) is where, for
    JSON that parses but holds what cannot be kept; None when it does not parse at all."""

    def __init__(self, detail: str, path: tuple[str | int, ...] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path

    @property
    def pointer(self) -> str:
        from relay.api.problems import pointer_to  # problems imports DRF's views, which import this

        return pointer_to(self.path or ())

    def __str__(self) -> str:
        return self.detail if self.path is None else f"{self.pointer}: {self.detail}"


def read_json(body: bytes, most: int = MAX_JSON_DEPTH) -> Any:
    """The one strict JSON reader of every door (the API's parser, the step runtime API, the
    webhook URL, the worker reading a webhook's body again). RefusedJSON, before anything is
    stored, for what the database or the engine cannot keep although Python's json reads it:
    NaN and Infinity (not JSON), a number past a float64 (`1e400`, 400 digits), a NUL
    character or a lone surrogate (U+D800 to U+DFFF) in a string or key, nesting deeper than
    `most`; and for what is no UTF-8 JSON at all."""
    nesting = nesting_error(body, most)
    if nesting:
        raise RefusedJSON(nesting)
    try:
        document = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise RefusedJSON(f"The body is not UTF-8 JSON: {exc}") from None
    except ValueError as exc:  # also json's own errors, and int()'s past 4300 digits
        raise RefusedJSON(f"The body is not valid JSON: {exc}") from None
    if _suspect(body):
        check_storable(document)
    return document


def _suspect(body: bytes) -> bool:
    """Whether the body may hold what check_storable refuses (false alarms only cost a walk)."""
    if b"\\u" in body and _SUSPECT_ESCAPE.search(body):
        return True
    shapes = body.translate(_NUMBER_SHAPES)
    return any(shape in shapes for shape in _HUGE_SHAPES)


def check_storable(value: Any, path: tuple[str | int, ...] = ()) -> None:
    """RefusedJSON, at its path, for the first string or key with a NUL character (PostgreSQL
    keeps none in text or jsonb) or a lone surrogate (no UTF-8 can carry it), or number past
    a float64. Nesting is bounded by the caller (read_json's check), so this recursion is."""
    if isinstance(value, str):
        if found := _UNSTORABLE.search(value):
            raise RefusedJSON(_unstorable(found[0], "A string"), path)
    elif isinstance(value, dict):
        for key, item in value.items():
            if found := _UNSTORABLE.search(key):
                raise RefusedJSON(_unstorable(found[0], "A key"), path)
            check_storable(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_storable(item, (*path, index))
    elif isinstance(value, float) and not math.isfinite(value):
        raise RefusedJSON("A number is too large for a float64; send a smaller one, or text.", path)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _LARGEST:
        raise RefusedJSON("A number is too large for a float64; send a smaller one, or text.", path)


def _unstorable(character: str, what: str) -> str:
    if character == "\x00":
        return f"{what} holds a NUL character (U+0000), which cannot be stored."
    return f"{what} holds a lone surrogate (U+{ord(character):04X}), which is no Unicode text."


def read_bounded(stream: Any, parser_context: dict | None, limit: int) -> bytes:
    """The body, or a 413 when it is over `limit` bytes: by its Content-Length before
    reading, and by counting while reading when it has none."""
    request = (parser_context or {}).get("request")
    length = request.META.get("CONTENT_LENGTH") if request is not None else None
    if length and is_whole_number(length) and int(length) > limit:
        raise PayloadTooLarge(f"The request body is over {limit} bytes.")
    body = stream.read(limit + 1) if stream is not None else b""
    if len(body) > limit:
        raise PayloadTooLarge(f"The request body is over {limit} bytes.")
    return body


class BoundedJSONParser(BaseParser):
    """DRF's JSON parser reads the whole body, whatever its size. This one refuses a body
    over its limit (API_MAX_BODY_BYTES) with 413, by its Content-Length before reading, and
    by counting while reading when it has none; then reads it with read_json, whose
    refusals are 400s (at the value's pointer when the JSON parses).

    Not a subclass of DRF's JSONParser: DRF hands those `request.body`, which Django caps at
    DATA_UPLOAD_MAX_MEMORY_SIZE (a 400) before this parser's own limit is asked."""

    media_type = "application/json"

    def max_bytes(self) -> int:
        return settings.API_MAX_BODY_BYTES

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        try:
            return read_json(read_bounded(stream, parser_context, self.max_bytes()))
        except RefusedJSON as exc:
            raise refused(exc) from None


def refused(exc: RefusedJSON) -> exceptions.APIException:
    """A 400: a parse error for no JSON, a validation error at its pointer for JSON that
    holds what cannot be kept (as a serializer's field would be)."""
    if exc.path is None:
        return exceptions.ParseError(exc.detail)
    detail: Any = [exceptions.ErrorDetail(exc.detail, "unstorable")]
    for part in reversed(exc.path):
        detail = {part: detail}
    return exceptions.ValidationError(detail)


def check_nesting(body: bytes, most: int = MAX_JSON_DEPTH) -> None:
    """ParseError unless the body's arrays and objects nest at most `most` deep."""
    if error := nesting_error(body, most):
        raise exceptions.ParseError(error)


def nesting_error(body: bytes, most: int = MAX_JSON_DEPTH) -> str:
    """Why the body's arrays and objects nest deeper than `most`, or "". A scan, not a parse:
    strings are cut out, then the innermost bracket pairs are removed, one level a pass,
    which takes linear time per level and no recursion."""
    if body.count(b"[") + body.count(b"{") <= most:
        return ""  # too few brackets to nest deeper (most bodies: no scan)
    skeleton = _NOT_BRACKET.sub(b"", _STRING.sub(b"", body))
    for _ in range(most):
        if not skeleton:
            return ""
        skeleton, removed = _INNERMOST.subn(b"", skeleton)
        if not removed:
            return "The body is not valid JSON: its brackets do not pair up."
    return f"The body is nested deeper than {most} levels." if skeleton else ""


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
