"""The heartbeat's fast path: `PUT /_puppet/runs/{id}/state` with a heartbeat, answered in
the ASGI application (relay.asgi) on the event loop, in one statement
(runs.models.heartbeat_sql): no thread, no DRF, no ORM.

Why not in Django: its synchronous code runs in a pool of threads (relay.django_asgi), and a
heartbeat there costs a hop to a thread, DRF and two ORM queries, about 5 ms of CPU; 1,000 a
second would need more than this machine's two cores. This runs the very same middleware
on the loop instead (relay.onloop).

It takes only the requests it can answer exactly as the runs API would: the middleware lets
them through (host allowed, no HTTPS redirect), a JSON body the API's parser and
StateSerializer accept, that runs.models.heartbeat_rule calls a heartbeat, a token it
recognises (puppet_connection.fast), asking for JSON; and only when the statement finds the
run where the heartbeat applies. Everything else (every error, every change of status, a
token to mark used, a platform header to record, a database failure) goes on to Django and
the API's own view, which answers it in full: the rules stay in runs.models and the API.
"""

import logging
import re
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponse
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer

from puppet_connection.fast import connection_for
from puppet_connection.models import BACKEND_RE, Platform
from relay import adb, onloop, tokens
from relay.api.authentication import token_from_header
from relay.api.parsers import RefusedJSON, read_json
from runs.api.serializers import StateSerializer
from runs.longpoll import Scope, Send
from runs.models import STATE_FIELDS, Run, heartbeat_rule, heartbeat_sql

log = logging.getLogger(__name__)

# Larger bodies are not heartbeats (a heartbeat is about 100 bytes).
MAX_BODY = 4096
# Django's <uuid:pk> path converter.
PATH = re.compile(r"^/_puppet/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/state$")
_ACCEPTABLE = {"", "*/*", "application/json", "application/*"}
_renderer = JSONRenderer()
served = 0  # heartbeats answered here (the tests read it)


def wants(scope: Scope) -> bool:
    """Whether this request may be a heartbeat for the fast path (by its method, path and
    length alone; its body is read next)."""
    if scope["type"] != "http" or scope["method"] != "PUT" or not PATH.match(scope["path"]):
        return False
    if adb.pool() is None:
        return False
    length = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            return False
    return length is not None and length.isdigit() and 0 < int(length) <= MAX_BODY


async def serve(scope: Scope, body: bytes, send: Send, handler: ASGIHandler) -> bool:
    """Answer the heartbeat and return True, or return False having sent nothing."""
    global served
    pk = uuid.UUID(PATH.match(scope["path"])[1])

    async def view(request: ASGIRequest) -> HttpResponse | None:
        return await _heartbeat(request, body, pk)

    if await onloop.serve(scope, body, send, handler, view):
        served += 1
        return True
    return False


# StateSerializer's fields, bound once: the serializer deep-copies its declared fields for
# every instance, which was a tenth of a heartbeat's CPU. Validating field by field with the
# very same fields and the serializer's own validate() gives the same values and refusals.
_STATE = StateSerializer()
_FIELDS = _STATE.fields
# A heartbeat has only these; a body with anything else (or nested, as run_results is) goes
# to the API, which answers it in full.
_PLAIN = {"status", "next_update_before", "job_id", "lease_id", "outcome"}


def heartbeat_of(body: bytes) -> dict[str, Any] | None:
    """The validated state (what StateSerializer(data=…).validated_data would be), when the
    body is a flat JSON object the API would accept; None when it is anything else."""
    if b"{" in body[1:] or b"[" in body:
        return None  # nested: not a heartbeat (and no depth to check, BoundedJSONParser's job)
    try:
        data = read_json(body)  # the API's own reader: what it refuses, the API answers
    except RefusedJSON:
        return None
    if type(data) is not dict or not data.keys() <= _PLAIN or "status" not in data:
        return None
    validated = {}
    try:
        for name, value in data.items():
            validated[name] = _FIELDS[name].run_validation(value)
        return StateSerializer.validate(_STATE, validated)
    except (exceptions.ValidationError, DjangoValidationError):
        return None


def _acceptable(request: ASGIRequest) -> bool:
    """The request is JSON and asks for JSON (or anything), as the API's negotiation needs."""
    if request.content_type != "application/json" or request.content_params:
        return False
    return request.headers.get("Accept", "").strip() in _ACCEPTABLE


async def _heartbeat(request: ASGIRequest, body: bytes, pk: uuid.UUID) -> HttpResponse | None:
    pool = adb.pool()
    data = heartbeat_of(body) if _acceptable(request) else None
    rule = heartbeat_rule(data) if data is not None else None
    if pool is None or data is None or rule is None:
        return None
    try:
        token = token_from_header(request.META.get("HTTP_AUTHORIZATION", ""))
    except exceptions.AuthenticationFailed:
        return None
    known = await connection_for(token, cached=True)
    if known is None or known.token_pepper_id != tokens.current_pepper_id():
        return None
    held, changes = rule
    if len(held) > 2:
        return None  # the statement names two statuses at most
    platform = request.META.get("HTTP_X_RELAY_PLATFORM", "").strip().lower()
    backend = request.META.get("HTTP_X_RELAY_BACKEND", "").strip().lower()
    now = timezone.now()
    params = {
        "run": pk,
        "connection": known.id,
        "held_0": held[0],
        "held_1": held[-1],  # the same status again when there is one
        "lease": data.get("lease_id"),
        "digest": known.token_digest,
        "pepper": known.token_pepper_id,
        "used_since": now - timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION),
        "platform": platform if platform in (Platform.PE, Platform.OSS) else "",
        "backend": backend if BACKEND_RE.match(backend) else "",
        "now": now,
        "next_update_before": changes.get("next_update_before"),
        "job_id": changes.get("job_id"),
    }
    async with pool.connection() as conn:
        cursor = await conn.execute(heartbeat_sql(), params)
        row = await cursor.fetchone()
    if row is None:
        return None
    run = Run(**dict(zip(STATE_FIELDS, row, strict=True)))
    # What the API's view answers: its renderer's bytes, its Allow and Vary.
    response = HttpResponse(_renderer.render(run.state), status=202, content_type="application/json")
    response["Allow"] = "PUT, OPTIONS"
    response["Vary"] = "Accept"
    return response
