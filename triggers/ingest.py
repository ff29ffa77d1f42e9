"""The request path of POST /api/events: store the body durably, record the event, queue it.
Nothing here parses the body; triggers.tasks does, in a worker.

The body is read in bounded chunks, gunzipped on the way when it says so (with a size and a
ratio limit, so a gzip bomb costs little), hashed, and saved in the `events` storage under
its SHA-256: `bodies/<aa>/<bb>/<sha256>`. Memory stays bounded whatever the size.
"""

import hashlib
import logging
import tempfile
import zlib
from typing import BinaryIO

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.http import HttpRequest
from rest_framework import exceptions

from relay.api.exceptions import LengthRequired, PayloadTooLarge
from triggers.models import BodyFormat, Event, Trigger

log = logging.getLogger(__name__)
CHUNK = 64 * 1024
SPOOL_IN_MEMORY = 256 * 1024
# Content types Puppet and the report processor send, and what the worker reads them as.
FORMATS = {
    "application/json": BodyFormat.JSON,
    "application/x-yaml": BodyFormat.YAML,
    "application/yaml": BodyFormat.YAML,
    "text/yaml": BodyFormat.YAML,
    "text/x-yaml": BodyFormat.YAML,
}


def body_format(request: HttpRequest) -> BodyFormat:
    media_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if media_type not in FORMATS:
        raise exceptions.UnsupportedMediaType(
            media_type or "(none)",
            detail=f"Send application/json or application/x-yaml, not {media_type or 'no Content-Type'}.",
        )
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise exceptions.UnsupportedMediaType(
            encoding, detail=f"Content-Encoding {encoding} is not supported; use gzip."
        )
    return FORMATS[media_type]


def content_length(request: HttpRequest) -> int:
    raw = request.META.get("CONTENT_LENGTH", "")
    if not raw.isdigit():
        raise LengthRequired()
    length = int(raw)
    if length > settings.EVENTS_MAX_BODY_BYTES:
        raise PayloadTooLarge(f"The body is {length} bytes; the most is {settings.EVENTS_MAX_BODY_BYTES}.")
    if length == 0:
        raise exceptions.ParseError("The body is empty.")
    return length


def spool_body(request: HttpRequest, length: int, gzipped: bool, into: BinaryIO) -> str:
    """Copy the (gunzipped) body into `into`; return its SHA-256. Raises 4xx API errors."""
    digest = hashlib.sha256()
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    limit = settings.EVENTS_MAX_DECOMPRESSED_BYTES
    received = written = 0

    def keep(data: bytes) -> None:
        nonlocal written
        written += len(data)
        if written > limit:
            raise PayloadTooLarge(f"The body decompresses to more than {limit} bytes.")
        if gzipped and written > settings.EVENTS_MAX_GZIP_RATIO * received + CHUNK:
            raise PayloadTooLarge(f"The body decompresses more than {settings.EVENTS_MAX_GZIP_RATIO} times.")
        digest.update(data)
        into.write(data)

    while received < length:
        chunk = request.read(min(CHUNK, length - received))
        if not chunk:
            raise exceptions.ParseError(f"The body ended after {received} of {length} bytes.")
        received += len(chunk)
        if inflater is None:
            keep(chunk)
            continue
        try:
            data = inflater.decompress(chunk, CHUNK)
            while data:
                keep(data)
                data = inflater.decompress(inflater.unconsumed_tail, CHUNK)
        except zlib.error as exc:
            raise exceptions.ParseError(f"The gzip body is corrupt: {exc}.") from None
    if inflater is not None:
        if not inflater.eof:
            raise exceptions.ParseError("The gzip body is truncated.")
        keep(inflater.flush())
    if written == 0:
        raise exceptions.ParseError("The body is empty.")
    return digest.hexdigest()


def body_name(sha256: str) -> str:
    return f"bodies/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def receive(request: HttpRequest, trigger: Trigger) -> tuple[Event, bool]:
    """Store the body and record the event. Returns (event, created): the same body again
    for the same trigger is the event already recorded."""
    fmt = body_format(request)
    length = content_length(request)
    gzipped = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower() == "gzip"
    storage = storages["events"]
    # Up to SPOOL_IN_MEMORY of a body stays in memory, the rest goes to a temporary file: a
    # web process's memory does not grow with report size, however many arrive at once.
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        sha256 = spool_body(request, length, gzipped, spool)
        size = spool.tell()
        existing = Event.objects.filter(trigger=trigger, body_sha256=sha256).first()
        if existing is not None:
            return existing, False
        name = body_name(sha256)
        if not storage.exists(name):
            spool.seek(0)
            storage.save(name, File(spool))
    # The body is durable now; the row is once this commits. Only then is the worker told.
    with transaction.atomic():
        event = Event.objects.create(trigger=trigger, body_format=fmt, body_sha256=sha256, body_size=size)
        transaction.on_commit(lambda: _enqueue(event.pk))
    return event, True


def _enqueue(event_id: object) -> None:
    from triggers.tasks import process_event

    try:
        process_event.delay(str(event_id))
    except Exception:
        log.warning("could not queue event %s; the sweeper will", event_id)
