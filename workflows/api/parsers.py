from typing import Any

from rest_framework import exceptions
from rest_framework.parsers import BaseParser

from relay.api.exceptions import PayloadTooLarge
from workflows.dialect.yamlload import MAX_BYTES


class WorkflowDocumentParser(BaseParser):
    """A workflow document as the request body: the YAML text, undecoded (the dialect's own
    loader reads it). Refuses a body over the dialect's limit with 413, by its Content-Length
    before reading, and by counting while reading when it has none."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> str:
        request = (parser_context or {}).get("request")
        length = request.META.get("CONTENT_LENGTH") if request is not None else None
        if length and length.isdigit() and int(length) > MAX_BYTES:
            raise PayloadTooLarge(f"A workflow document is at most {MAX_BYTES} bytes.")
        body = stream.read(MAX_BYTES + 1) if stream is not None else b""
        if len(body) > MAX_BYTES:
            raise PayloadTooLarge(f"A workflow document is at most {MAX_BYTES} bytes.")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"A workflow document is UTF-8 text: {exc}") from None


class LegacyYAMLParser(WorkflowDocumentParser):
    media_type = "application/x-yaml"


class TextYAMLParser(WorkflowDocumentParser):
    media_type = "text/yaml"


class LegacyTextYAMLParser(WorkflowDocumentParser):
    media_type = "text/x-yaml"


# DRF matches the Content-Type against each parser's one media type.
WORKFLOW_DOCUMENT_PARSERS = [WorkflowDocumentParser, LegacyYAMLParser, TextYAMLParser, LegacyTextYAMLParser]
