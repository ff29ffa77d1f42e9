"""Step credentials on the step runtime API.

relay_sdk and `ni` send METADATA_API_URL's user part as HTTP Basic (`<token>:`); a token
as the Basic password, or `Authorization: Bearer <token>`, is taken too. Any other token
kind is refused, and so is a right token whose step is no longer in progress: the
credential died with its step (401, as for an unknown token).
"""

import base64
import binascii

from django.views.decorators.debug import sensitive_variables
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from relay.api.authentication import MAX_HEADER_LENGTH, token_from_header
from stepruntime.models import StepCredential


class StepCredentialAuthentication(BaseAuthentication):
    """request.user is the workflow's owner; request.auth is the StepCredential."""

    @sensitive_variables("header", "token")
    def authenticate(self, request: Request) -> tuple[object, StepCredential] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None  # DRF answers 401 with authenticate_header()
        token = _basic_user(header) or token_from_header(header)
        credential = StepCredential.for_token(token)
        if credential is None:
            raise exceptions.AuthenticationFailed("Invalid step credential.")
        if not credential.live:
            raise exceptions.AuthenticationFailed(
                f"The step's credential has expired: the step is {credential.step_run.status}."
            )
        owner = credential.step_run.run.workflow.owner
        if not owner.is_active:
            raise exceptions.AuthenticationFailed("Invalid step credential.")
        return owner, credential

    def authenticate_header(self, request: Request) -> str:
        return 'Basic realm="relay-step", charset="UTF-8"'


@sensitive_variables("header", "decoded")
def _basic_user(header: str) -> str:
    """The user part of Basic credentials when it is the token (`<token>:`), else ''."""
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "basic" or len(header) > MAX_HEADER_LENGTH:
        return ""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    user, colon, password = decoded.partition(":")
    return user if colon and not password and user.startswith(StepCredential.TOKEN_PREFIX + "_") else ""
