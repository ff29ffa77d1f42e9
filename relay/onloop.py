"""Answering a request on the event loop with Django's middleware but without a thread: for
the few requests that must not wait for one (the heartbeat, runs/api/fast.py; /healthz,
relay.asgi) and whose answer needs no I/O but what the caller awaits itself.

It runs the very same middleware (settings.MIDDLEWARE) as Django would, their
process_request and process_response, on the loop. That is safe for these requests because
none of them does I/O for them: they send no cookie, and nothing reads their session or
user. A middleware that refuses or redirects (an HTTPS redirect), or raises (a Host not
allowed), hands the request back to Django, which answers it in full.
"""

import io
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponseBase
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string
from whitenoise.middleware import WhiteNoiseMiddleware

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
View = Callable[[ASGIRequest], Awaitable[HttpResponseBase | None]]


def _middleware() -> list[MiddlewareMixin] | None:
    """settings.MIDDLEWARE as instances to call on the loop; None (nothing on the loop) if
    one of them is of a kind this cannot call safely."""
    chain = []
    for path in settings.MIDDLEWARE:
        cls = import_string(path)
        if cls is WhiteNoiseMiddleware:
            continue  # it only serves static/ paths
        if not issubclass(cls, MiddlewareMixin):
            log.warning("nothing answered on the loop: %s is not a MiddlewareMixin", path)
            return None
        chain.append(cls(_never))
    return chain


def _never(request: Any) -> HttpResponseBase:
    raise AssertionError("only process_request and process_response are called on the loop")


_chain: list[MiddlewareMixin] | None = None
_chain_built = False


async def serve(scope: Scope, body: bytes, send: Send, handler: ASGIHandler, view: View) -> bool:
    """Answer the request with `view` between the middleware and return True; or return
    False having sent nothing (the middleware or the view left it to Django, or failed)."""
    global _chain, _chain_built
    if not _chain_built:
        _chain, _chain_built = _middleware(), True
    if _chain is None:
        return False
    request = ASGIRequest(scope, io.BytesIO(body))
    try:
        for middleware in _chain:
            if hasattr(middleware, "process_request") and middleware.process_request(request) is not None:
                return False  # a redirect or refusal: Django's to give
    except Exception:  # a Host not allowed (DisallowedHost), say: Django answers it, a 400
        return False
    try:
        response = await view(request)
    except Exception:
        log.exception("answering %s on the loop failed; Django answers it", scope["path"])
        return False
    if response is None:
        return False
    for middleware in reversed(_chain):
        if hasattr(middleware, "process_response"):
            response = middleware.process_response(request, response)
    await handler.send_response(response, send)
    return True
