"""Middleware of the service's own."""

import re

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

from relay.api import problems

# C0 and C1 control characters (NUL, newlines, DEL…). No name in this service holds one, and
# PostgreSQL refuses NUL in any text, even a lookup's: a path segment `%00` was a 500 in
# every view that looked it up.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class ControlCharacterPathMiddleware(MiddlewareMixin):
    """The one check of every URL's path, before any view: a control character in it (as
    decoded from `%00`…) is a 400 (a problem document on API paths), whatever the route; so is
    a NUL in the query string of a page (the admin's, the pages').
    (A MiddlewareMixin with process_request only, so relay.onloop can run it on the loop.)"""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if found := _CONTROL.search(request.path):
            return problems.bad_path(request, f"U+{ord(found[0]):04X}")
        # A NUL in the query string reached the admin's list filters as a 500 (the APIs'
        # filters refuse it themselves, naming the parameter). Only `%00` decodes to NUL ("+"
        # is a space; "%2500" is "%00" as text).
        query = request.META.get("QUERY_STRING", "")
        if ("%00" in query or "\x00" in query) and not problems.is_api_request(request):
            return problems.bad_query(request)
        return None
