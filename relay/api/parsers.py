import json
import re
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
    by counting while reading when it has none; a body nested deeper than MAX_JSON_DEPTH
    with 400 before parsing it. It also refuses NaN and Infinity, which are not JSON.

    Not a subclass of DRF's JSONParser: DRF hands those `request.body`, which Django caps at
    DATA_UPLOAD_MAX_MEMORY_SIZE (a 400) before this parser's own limit is asked."""

    media_type = "application/json"

    def max_bytes(self) -> int:
        return settings.API_MAX_BODY_BYTES

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        body = read_bounded(stream, parser_context, self.max_bytes())
        check_nesting(body)
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None


def check_nesting(body: bytes, most: int = MAX_JSON_DEPTH) -> None:
    """ParseError unless the body's arrays and objects nest at most `most` deep. A scan, not
    a parse: strings are cut out, then the innermost bracket pairs are removed, one level a
    pass, which takes linear time per level and no recursion."""
    if body.count(b"[") + body.count(b"{") <= most:
        return  # too few brackets to nest deeper (most bodies: no scan)
    skeleton = _NOT_BRACKET.sub(b"", _STRING.sub(b"", body))
    for _ in range(most):
        if not skeleton:
            return
        skeleton, removed = _INNERMOST.subn(b"", skeleton)
        if not removed:
            raise exceptions.ParseError("The body is not valid JSON: its brackets do not pair up.")
    if skeleton:
        raise exceptions.ParseError(f"The body is nested deeper than {most} levels.")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
