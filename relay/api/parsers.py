import json
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from relay.api.exceptions import PayloadTooLarge


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser reads the whole body, whatever its size. This one refuses a body
    over API_MAX_BODY_BYTES with 413, by its Content-Length before reading, and by counting
    while reading when it has none. It also refuses NaN and Infinity, which are not JSON."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        limit = settings.API_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        length = request.META.get("CONTENT_LENGTH") if request is not None else None
        if length and length.isdigit() and int(length) > limit:
            raise PayloadTooLarge(f"The request body is over {limit} bytes.")
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise PayloadTooLarge(f"The request body is over {limit} bytes.")
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
