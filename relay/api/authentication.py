"""Token authentication.

The machine endpoints, `/_puppet/*` (connection tokens) and `/api/events` (trigger tokens),
take `Authorization: Bearer <token>`, or HTTP Basic with the token as the password (any user
name), because Puppet's http report processor can only send Basic. Everything else (no
header, another scheme, garbled base64, a bad checksum, an unknown or revoked token) is a 401
with WWW-Authenticate; nothing here raises past DRF.

The user endpoints take a user API token (`rlyu_…`) as `Token <token>` or `Bearer <token>`.
Each kind of endpoint knows only its own kind of token, by the token's prefix: a user token
never opens a machine endpoint, and a connection's or trigger's token never a user one.
"""

import base64
import binascii

from django.views.decorators.debug import sensitive_variables
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from relay.models import UserToken
from relay.tokens import TokenHolder

# Longer than any token with its scheme, so junk is refused before it is decoded.
MAX_HEADER_LENGTH = 512


@sensitive_variables("header", "credentials", "decoded", "token")
def token_from_header(header: str) -> str:
    """The token in an Authorization header value; raises AuthenticationFailed."""
    if len(header) > MAX_HEADER_LENGTH:
        raise exceptions.AuthenticationFailed("Malformed Authorization header.")
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    if not credentials or " " in credentials:
        raise exceptions.AuthenticationFailed("Malformed Authorization header.")
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise exceptions.AuthenticationFailed("Malformed Basic credentials.") from None
        _, colon, token = decoded.partition(":")
        if not colon:
            raise exceptions.AuthenticationFailed("Malformed Basic credentials.")
        return token
    raise exceptions.AuthenticationFailed("Use the Bearer or Basic authentication scheme.")


class HolderTokenAuthentication(BaseAuthentication):
    """request.user is the holder's owner; request.auth is the holder (a connection or a
    trigger: each app's subclass names its model)."""

    holder_model: type[TokenHolder]

    @sensitive_variables("header", "token")
    def authenticate(self, request: Request) -> tuple[object, TokenHolder] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None  # DRF answers 401 with authenticate_header()
        token = token_from_header(header)
        holder = self.holder_model.for_token(token)
        if holder is None or not holder.owner.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return holder.owner, holder

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="relay", Basic realm="relay", charset="UTF-8"'


class UserTokenAuthentication(BaseAuthentication):
    """request.user is the token's owner; request.auth is the UserToken. Another scheme (or
    none) is left to the next authenticator, the admin's session."""

    SCHEMES = ("token", "bearer")

    @sensitive_variables("header", "credentials")
    def authenticate(self, request: Request) -> tuple[object, UserToken] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() not in self.SCHEMES:
            return None
        credentials = credentials.strip()
        if len(header) > MAX_HEADER_LENGTH or not credentials or " " in credentials:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        user_token = UserToken.for_token(credentials)
        if user_token is None or not user_token.owner.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return user_token.owner, user_token

    def authenticate_header(self, request: Request) -> str:
        return "Token"
