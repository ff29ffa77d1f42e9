"""RFC 9457 problem details for every API error in the project.

Each error body is `application/problem+json`:
`{"type": "urn:relay:problem:<code>", "title", "status", "detail", "instance"}`, and for
validation errors `errors: [{"pointer": "#/scope/nodes/0", "detail", "code"}]`, one entry
per invalid field (JSON Pointers into the request body).
"""

import logging
from http import HTTPStatus
from typing import Any

from django import db
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from relay.api.exceptions import ServiceUnavailable
from relay.vault import VaultUnavailable

log = logging.getLogger(__name__)
PROBLEM_CONTENT_TYPE = "application/problem+json"
# Paths whose errors are problem documents even when Django, not DRF, answers them (the step
# runtime API's are at the URL root: stepruntime.urls).
API_PREFIXES = (
    "/api/",
    "/_puppet/",
    "/conditions",
    "/decorators/",
    "/events",
    "/environment",
    "/logs",
    "/outputs/",
    "/secrets/",
    "/spec",
    "/status",
    "/validate",
    "/workflows/",
)


def problem(status_code: int, detail: str, code: str, instance: str = "", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:relay:problem:{code}",
        "title": HTTPStatus(status_code).phrase,
        "status": status_code,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    body.update(extra)
    return body


def _pointer_part(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def pointer_to(path: tuple[object, ...]) -> str:
    """The JSON Pointer (in errors' `#/a/0/b` form) to the value at `path`'s keys and indexes."""
    return "".join(["#", *(f"/{_pointer_part(part)}" for part in path)])


def field_errors(details: Any, pointer: str = "#") -> list[dict[str, str]]:
    """Flatten DRF's nested error details into RFC 9457 `errors` entries."""
    if isinstance(details, dict) and set(details) == {"message", "code"}:
        return [{"pointer": pointer, "detail": str(details["message"]), "code": str(details["code"])}]
    if isinstance(details, dict):
        errors = []
        for key, value in details.items():
            child = pointer if key == "non_field_errors" else f"{pointer}/{_pointer_part(key)}"
            errors += field_errors(value, child)
        return errors
    if isinstance(details, list):
        errors = []
        for index, value in enumerate(details):
            # A list of plain messages belongs to the field; a list of objects is indexed.
            leaf = isinstance(value, dict) and set(value) == {"message", "code"}
            errors += field_errors(value, pointer if leaf else f"{pointer}/{index}")
        return errors
    return [{"pointer": pointer, "detail": str(details), "code": "invalid"}]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Converted here, not only inside DRF's handler, so the body below can read exc.detail.
    if isinstance(exc, VaultUnavailable):
        exc = ServiceUnavailable(str(exc))
    elif isinstance(exc, (db.OperationalError, db.InterfaceError)):
        log.warning("database unavailable: %s", exc)
        exc = ServiceUnavailable("The database is unavailable. Try again shortly.")
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real server error: handler500 answers it, as a problem too
    request = context["request"]
    if isinstance(exc, exceptions.ValidationError):
        errors = field_errors(exc.get_full_details())
        detail = errors[0]["detail"] if len(errors) == 1 else "The request has invalid fields."
        body = problem(response.status_code, detail, "validation_error", request.path, errors=errors)
    else:
        assert isinstance(exc, exceptions.APIException)  # the only kind DRF's handler answers
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        body = problem(response.status_code, str(exc.detail), code, request.path)
    response.data = body
    response.content_type = PROBLEM_CONTENT_TYPE
    return response


def problem_response(request: HttpRequest, status_code: int, detail: str, code: str) -> JsonResponse:
    return JsonResponse(
        problem(status_code, detail, code, request.path),
        status=status_code,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def is_api_request(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


# Django's own error views, for errors raised outside DRF (unknown URL, a non-UUID id in a
# path, a crash). API paths get problem documents; the rest get Django's pages.
def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    from django.views import defaults

    if is_api_request(request):
        return problem_response(request, 400, "The request could not be understood.", "bad_request")
    return defaults.bad_request(request, exception)


def bad_path(request: HttpRequest, character: str) -> HttpResponse:
    from django.views import defaults

    if is_api_request(request):
        detail = f"The URL's path holds a control character ({character}); no resource is named so."
        return problem_response(request, 400, detail, "bad_path")
    return defaults.bad_request(request, None)


def bad_query(request: HttpRequest) -> HttpResponse:
    """A page's query string with a NUL in it (relay.middleware): Django's 400 page."""
    from django.views import defaults

    return defaults.bad_request(request, None)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    from django.views import defaults

    if is_api_request(request):
        return problem_response(request, 403, "You may not do this.", "permission_denied")
    return defaults.permission_denied(request, exception)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    from django.views import defaults

    if is_api_request(request):
        return problem_response(request, 404, "No such resource.", "not_found")
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    from django.views import defaults

    if is_api_request(request):
        return problem_response(request, 500, "The server failed; it has been logged.", "server_error")
    return defaults.server_error(request)
