"""Django under the ASGI server, with its synchronous code run the way threaded gunicorn ran
it: each request's whole synchronous part (signals, middleware, view, closing) in one hop
to a bounded pool of WEB_THREADS threads per process, which keep their database connections
between requests (CONN_MAX_AGE).

Django's own ASGIHandler runs a synchronous view through a thread created for that request
(asgiref's ThreadSensitiveContext), and each of our synchronous middleware (all of Django's)
through two more hops to it and back; measured here, that cut accepts from about 210/s to
80/s and opened a database connection per request. Every view of the service is
synchronous (the admin, DRF, ingest): the work that must not hold a thread, the long-poll's
wait and the heartbeat, is done before Django (relay.asgi), so nothing is lost.

Streaming responses (run results from storage, static files) are read a chunk at a time in
the pool, not gathered whole in memory as Django's handler does with synchronous iterators.

Request bodies are read on the loop before a thread is taken, so a client that never
finishes one holds no thread; except on STREAMED_PATHS (the report door, /api/events), whose
view refuses a body by its Content-Length, token or budget before reading a byte of it, and
reads it in bounded chunks to storage (triggers/ingest.py): there the view starts with the
headers and reads the body as it comes, as under a WSGI server. A client must be
authenticated, within its budget, to hold a thread that way, and for REQUEST_READ_TIMEOUT
(relay.server) at most.
"""

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, HttpResponseBase
from django.urls import set_script_prefix

STREAMED_PATHS = frozenset({"/api/events"})


class ReceivedBody(io.RawIOBase):
    """The request body as a file that a thread of the pool reads, message by message from
    the loop; a client gone, or done sending, is the end of it."""

    def __init__(self, receive: Any, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.receive, self.loop = receive, loop
        self.pending = b""
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending and not self.ended:
            message = asyncio.run_coroutine_threadsafe(self.receive(), self.loop).result()
            self.pending = message.get("body", b"")
            self.ended = message["type"] != "http.request" or not message.get("more_body", False)
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        return count


class ThreadedASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.threads = ThreadPoolExecutor(settings.WEB_THREADS, thread_name_prefix="django")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        loop = asyncio.get_running_loop()
        if scope["path"] in STREAMED_PATHS:
            body_file: Any = io.BufferedReader(ReceivedBody(receive, loop))
        else:
            try:
                body_file = await self.read_body(receive)
            except RequestAborted:
                return
        try:
            response = await loop.run_in_executor(self.threads, self._respond, scope, body_file)
            try:
                await self.send_response(response, send)
            finally:
                await loop.run_in_executor(self.threads, response.close)  # request_finished
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """What WSGIHandler.__call__ does, in a thread of the pool."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            return error_response
        response = self.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        return response

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        if not response.streaming or response.is_async:
            await super().send_response(response, send)
            return
        headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
        headers += [
            (b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in response.cookies.values()
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        loop = asyncio.get_running_loop()
        parts = iter(response.streaming_content)
        while (part := await loop.run_in_executor(self.threads, next, parts, None)) is not None:
            for chunk, _ in self.chunk_bytes(part):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body"})
