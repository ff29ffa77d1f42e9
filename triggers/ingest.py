"""The request path of POST /api/events: store the body durably, record the event, queue it.
Nothing here reads a report; triggers.tasks does, in a worker. The door takes only a bounded
look (peek): a small JSON body is parsed to know a resend, and refused when it is no report.

The body is read in bounded chunks, gunzipped on the way when it says so (with a size and a
ratio limit, so a gzip bomb costs little), hashed, and saved in the `events` storage under
its SHA-256: `bodies/<aa>/<bb>/<sha256>`. Memory stays bounded whatever the size.
"""

import hashlib
import re
import tempfile
import zlib
from typing import BinaryIO

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest
from rest_framework import exceptions

from relay import dispatch
from relay.api.exceptions import LengthRequired, PayloadTooLarge, UnprocessableContent
from relay.api.params import is_whole_number
from triggers import objects, ratelimit
from triggers.models import BodyFormat, Event, EventState, Trigger
from triggers.objects import body_name
from triggers.parsing import NotAReport, UnreadableReport, load_json, node_budget, plain, without_nul
from triggers.reports import WHOLE, recognise

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
    if not is_whole_number(raw):
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


def receive(request: HttpRequest, trigger: Trigger) -> tuple[Event, bool]:
    """Store the body and record the event. Returns (event, created): a resend (the same
    body, transaction_uuid or key again for the trigger) is the event already recorded."""
    fmt = body_format(request)
    length = content_length(request)
    ratelimit.admit(trigger, length)  # before a byte of the body is read
    gzipped = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower() == "gzip"
    # Up to SPOOL_IN_MEMORY of a body stays in memory, the rest goes to a temporary file: a
    # web process's memory does not grow with report size, however many arrive at once.
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        sha256 = spool_body(request, length, gzipped, spool)
        size = spool.tell()
        if size > length:
            ratelimit.count_bytes(trigger, size - length)  # what gunzipping added
        transaction_uuid, key = peek(spool, fmt, size)
        existing = _resent(trigger, sha256, transaction_uuid, key)
        if existing is not None:
            return existing, False
        return store(trigger, spool, fmt, sha256, size, transaction_uuid=transaction_uuid, key=key), True


def store(
    trigger: Trigger,
    spool: BinaryIO,
    fmt: str,
    sha256: str,
    size: int,
    transaction_uuid: str = "",
    key: str = "",
) -> Event:
    """Save the spooled body under its SHA-256, record the event and queue it for a worker."""
    storage = storages["events"]
    name = body_name(sha256)
    if not storage.exists(name):
        spool.seek(0)
        storage.save(name, File(spool))
    # The body is durable now; the row is once this commits. Only then is the worker told.
    with transaction.atomic():
        # The body may be another event's, whose deletion just deleted it: see
        # triggers.objects for why claiming, then looking, is race-free.
        if objects.claim([name]):
            spool.seek(0)
            storage.save(name, File(spool))
        event = Event.objects.create(
            trigger=trigger,
            body_format=fmt,
            body_sha256=sha256,
            body_size=size,
            transaction_uuid=transaction_uuid,
            key=key,
        )
        transaction.on_commit(lambda: _enqueue(event.pk))
    return event


# A bounded look at a body: what tells a resend of the same run, and whether a body is a
# report at all. A small JSON body (a push body from the report processor) is read whole,
# which is cheap in C, and recognised as the worker would (triggers.reports.recognise): one
# that is no JSON, or no report of any shape the worker reads, is refused now with the reason
# (the module's processors count any 2xx as delivered: a 202 and then `failed` is a report
# lost without a trace); a larger JSON body is scanned for a host key at least. Anything else
# has only its first PEEK_BYTES scanned for the report's top-level transaction_uuid (Puppet
# writes it in the first lines). The worker reads the real values later and settles any race
# between resends that both got past this (see Event's unique constraints).
PEEK_WHOLE_JSON = 256 * 1024
PEEK_BYTES = 8 * 1024
_UUID_YAML = re.compile(rb"(?m)^transaction_uuid: ['\"]?([0-9A-Za-z-]{1,64})['\"]?[ \t]*\r?$")
_UUID_JSON = re.compile(rb'"transaction_uuid"\s*:\s*"([0-9A-Za-z-]{1,64})"')


def peek(spool: BinaryIO, fmt: str, size: int) -> tuple[str, str]:
    """(transaction_uuid, key) as far as a bounded look tells; "" where it does not. Raises
    a 400 (not JSON) or a 422 (not a report) for a JSON body it reads whole, and a 422 for a
    larger JSON body with no host key anywhere."""
    spool.seek(0)
    if fmt == BodyFormat.JSON and size <= PEEK_WHOLE_JSON:
        try:
            text = spool.read()
            # As the worker reads it (triggers.reader): the same bounds on nesting and size.
            document = plain(load_json(text), node_budget(len(text)))
            found = recognise(document)
        except UnreadableReport as exc:
            if isinstance(exc, NotAReport):
                raise UnprocessableContent(str(exc)) from None
            raise exceptions.ParseError(str(exc)) from None
        key = document.get("key") if found.shape != WHOLE else None
        uuid = found.report.get("transaction_uuid")
        # As the worker will store them (no NUL: PostgreSQL refuses it).
        return without_nul(uuid[:64] if isinstance(uuid, str) else ""), without_nul(
            str(key)[:255] if isinstance(key, str | int) else ""
        )
    if fmt == BodyFormat.JSON and not _mentions(spool, HOST_KEY):
        raise UnprocessableContent(
            'Not a Puppet report: it has no host anywhere (no `"host"` key in the whole body).'
        )
    spool.seek(0)
    head = spool.read(PEEK_BYTES)
    match = (_UUID_YAML if fmt == BodyFormat.YAML else _UUID_JSON).search(head)
    return (match.group(1).decode() if match else ""), ""


# Every JSON report names its host with this key (Ruby's to_json and Python's json write it as
# it is): a larger body without it anywhere is no report of any shape, whatever else it holds.
HOST_KEY = b'"host"'


def _mentions(spool: BinaryIO, needle: bytes) -> bool:
    """Whether the spooled body holds `needle`, read in CHUNKs (a chunk's end overlaps the
    next one's start, so no match is cut in two)."""
    spool.seek(0)
    tail = b""
    while chunk := spool.read(CHUNK):
        if needle in tail + chunk:
            return True
        tail = chunk[-(len(needle) - 1) :]
    return False


def _resent(trigger: Trigger, sha256: str, transaction_uuid: str, key: str) -> Event | None:
    """An earlier event of this trigger with the same body, run or key (not a failed one:
    a report that could not be read may be sent again)."""
    same = Q(body_sha256=sha256)
    if transaction_uuid:
        same |= Q(transaction_uuid=transaction_uuid)
    if key:
        same |= Q(key=key)
    return (
        Event.objects.filter(same, trigger=trigger)
        .exclude(state__in=(EventState.FAILED, EventState.DUPLICATE))
        .order_by("received_at")
        .first()
    )


def _enqueue(event_id: object) -> None:
    dispatch.publish_or_log(
        "triggers.tasks.process_event", str(event_id), what=f"event {event_id}; the sweeper will"
    )
