"""The request path of a webhook trigger's URL, POST /api/webhooks/<id>/: any JSON object is
the event, as Relay's generic JSON webhook image (relaysh/stdlib-trigger-json) makes it.

Relay runs a webhook trigger's image, a container whose relay_sdk web server turns the HTTP
request into an event. This service runs no containers, so it stands in only for images that
pass the body through unchanged (WEBHOOK_PASS_THROUGH_IMAGES); a trigger with any other image
is made with its workflow (its document is valid), but its URL refuses every event with a 409
saying why: an event that image would have reshaped must not start a run with the wrong data.

Like a push event, the body is stored under its SHA-256, the event recorded, and a 202 given;
a worker then makes the body the event's data and starts the run (triggers.services). Unlike
one, a body is small (WEBHOOK_MAX_BODY_BYTES, at most the 1 MiB a run's event data may be),
so it is also parsed here, and a body that is no JSON object is a 400 at once: the sender
learns of it, not only the event list. The same body twice is two events (a webhook says the
same thing again on purpose); a sender that retries sends an `Idempotency-Key` header, and
the same key again is the event already recorded.
"""

import tempfile
from typing import BinaryIO

from django.conf import settings
from django.http import HttpRequest
from rest_framework import exceptions

from relay.api.exceptions import Conflict, PayloadTooLarge
from relay.api.parsers import RefusedJSON, read_json, refused
from triggers import ingest, ratelimit
from triggers.models import BodyFormat, Event, EventState, Trigger

MAX_KEY_LENGTH = 255


def receive(request: HttpRequest, trigger: Trigger) -> tuple[Event, bool]:
    """Store the body and record the event. Returns (event, created). Raises 4xx API errors."""
    if not trigger.passes_through:
        raise Conflict(
            f"This webhook trigger's image {trigger.image!r} reshapes requests into events in a "
            "container, and this service runs none: it takes events only for images that pass the "
            f"JSON body through ({', '.join(settings.WEBHOOK_PASS_THROUGH_IMAGES)}). Use one of "
            "those in the workflow's trigger, or a push trigger."
        )
    _check_media_type(request)
    length = ingest.content_length(request)
    if length > settings.WEBHOOK_MAX_BODY_BYTES:
        raise PayloadTooLarge(f"The body is {length} bytes; the most is {settings.WEBHOOK_MAX_BODY_BYTES}.")
    key = _idempotency_key(request)
    ratelimit.admit(trigger, length)  # before a byte of the body is read
    gzipped = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower() == "gzip"
    with tempfile.SpooledTemporaryFile(max_size=ingest.SPOOL_IN_MEMORY) as spool:
        sha256 = ingest.spool_body(request, length, gzipped, spool)
        size = spool.tell()
        if size > settings.WEBHOOK_MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"The body decompresses to more than {settings.WEBHOOK_MAX_BODY_BYTES} bytes."
            )
        _check_body(spool)
        if key:
            existing = (
                Event.objects.filter(trigger=trigger, key=key)
                .exclude(state__in=(EventState.FAILED, EventState.DUPLICATE))
                .order_by("received_at")
                .first()
            )
            if existing is not None:
                return existing, False
        return ingest.store(trigger, spool, BodyFormat.JSON, sha256, size, key=key), True


def _check_media_type(request: HttpRequest) -> None:
    media_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    # application/json, and the vendor types that say they are JSON (application/vnd.x+json).
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise exceptions.UnsupportedMediaType(
            media_type or "(none)",
            detail=f"Send a JSON object as application/json, not {media_type}."
            if media_type
            else "Send a JSON object as application/json; the request has no Content-Type.",
        )
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise exceptions.UnsupportedMediaType(
            encoding, detail=f"Content-Encoding {encoding} is not supported; use gzip."
        )


def _idempotency_key(request: HttpRequest) -> str:
    key = request.META.get("HTTP_IDEMPOTENCY_KEY", "").strip()
    if len(key) > MAX_KEY_LENGTH or not key.isprintable() or "\x00" in key:
        raise exceptions.ValidationError(
            {"Idempotency-Key": [f"At most {MAX_KEY_LENGTH} printable characters."]}, "invalid"
        )
    return key


def _check_body(spool: BinaryIO) -> None:
    """The API's strict reader (relay.api.parsers.read_json): what the worker could not keep
    (NaN, `1e400`, a NUL, a lone surrogate, nesting past 64) is refused here, not stored."""
    spool.seek(0)
    try:
        document = read_json(spool.read())
    except RefusedJSON as exc:
        raise refused(exc) from None
    if not isinstance(document, dict):
        kind = "an array" if isinstance(document, list) else type(document).__name__
        raise exceptions.ParseError(
            f"The body is {kind}; a webhook's event is a JSON object (its keys are what `!Data` reads)."
        )
