"""The API's own errors, beside DRF's; relay.api.problems renders them all as RFC 9457.
(A module of their own: DRF's views import the parsers, which raise these.)"""

from rest_framework import exceptions, status


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "A service this request needs is unavailable. Try again later."
    default_code = "service_unavailable"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = "Content-Length is required."
    default_code = "length_required"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the resource's current state."
    default_code = "conflict"


class TooManyRequests(exceptions.APIException):
    """A budget counted in requests or things (events, runs in progress) is spent."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "This budget is spent."
    default_code = "too_many_requests"


class UnprocessableContent(exceptions.APIException):
    """The body is read, and is not anything this endpoint can use (RFC 9110's 422)."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The request body is not anything this endpoint can use."
    default_code = "unprocessable_content"
