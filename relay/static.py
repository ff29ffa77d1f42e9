"""WhiteNoise, able to sit in an asynchronous middleware chain.

WhiteNoise's middleware is synchronous only. Under ASGI, Django then runs it (and through it
every request) in a thread and the rest of the chain back on the loop, so an asynchronous
view would hold a thread for its whole length. This one is both: requests for the static
files it serves are answered in a thread (they read files), all others go straight on.
"""

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if not request.path_info.startswith(self.static_prefix):
            return await self.get_response(request)
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(self.serve)(static_file, request)
