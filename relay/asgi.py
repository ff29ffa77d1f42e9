"""The ASGI application that production, `make run` and the tests' live server serve
(relay.server): Django (its synchronous code in a pool of threads: relay.django_asgi), with

- the lifespan: the process's asynchronous database pool (relay.adb) opened at start and
  closed at the end, and the runs listener stopped;
- the long-poll's wait (runs.longpoll) in front of Django, so that a waiting bridge holds
  no thread (Django gives every request a thread of its own for its synchronous parts, from
  its first signal to its end);
- an open run page's ask for its live part waiting for a change to the run (pages.live);
- heartbeats answered on the loop when they can be (runs/api/fast.py), else by Django;
- `GET /healthz` answered on the loop (relay.onloop, with Django's middleware and the same
  view): a load balancer's probe must not queue for a thread behind slow requests, nor pay
  for a hop to one.
"""

import logging
import os

import django
from django.http import HttpRequest, HttpResponseBase

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
django.setup(set_prefix=False)

from relay.django_asgi import ThreadedASGIHandler  # noqa: E402  (after Django is set up)

django_application = ThreadedASGIHandler()
from pages import live  # noqa: E402
from relay import adb, onloop  # noqa: E402
from relay.urls import healthz  # noqa: E402
from runs.api import fast  # noqa: E402
from runs.longpoll import Message, Receive, Scope, Send, waiting_then  # noqa: E402
from runs.notify import listener  # noqa: E402

log = logging.getLogger(__name__)


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await adb.open_pool()
            except Exception as exc:  # the server must not start half able
                log.exception("cannot open the database pool")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await adb.close_pool()
            listener.stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if fast.wants(scope):
        messages = await _whole_body(receive)
        if messages is None:
            return  # the client went away
        if await fast.serve(scope, b"".join(m.get("body", b"") for m in messages), send, django_application):
            return
        receive = _replaying(messages, receive)
    elif scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
        messages = await _whole_body(receive)
        if messages is None:
            return  # the client went away
        if await onloop.serve(
            scope, b"".join(m.get("body", b"") for m in messages), send, django_application, _healthz
        ):
            return
        receive = _replaying(messages, receive)
    elif await live.waiting_then(django_application, scope, receive, send):
        return  # an open run page's ask, answered after its wait
    await waiting_then(django_application, scope, receive, send)


async def _healthz(request: HttpRequest) -> HttpResponseBase:
    return healthz(request)


async def _whole_body(receive: Receive) -> list[Message] | None:
    messages = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        messages.append(message)
        if not message.get("more_body"):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """`receive` as if nothing had been read yet."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
