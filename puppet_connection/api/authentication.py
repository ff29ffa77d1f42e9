"""How a bridge authenticates to `/_puppet/*`: with its connection's token."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.request import Request

from puppet_connection.models import PuppetConnection
from relay.api.authentication import HolderTokenAuthentication
from relay.api.permissions import HoldsToken
from relay.tokens import TokenHolder


class ConnectionTokenAuthentication(HolderTokenAuthentication):
    """Also records what the bridge says it runs on: `X-Relay-Platform: pe|oss` and
    `X-Relay-Backend: orchestrator|bolt|ssh`, sent by our bridge on every call (a report,
    never trusted over the connection's settings), and its User-Agent (`relay-bridge/0.1.0`)."""

    holder_model = PuppetConnection

    def authenticate(self, request: Request) -> tuple[object, TokenHolder] | None:
        result = super().authenticate(request)
        if result is not None:
            result[1].note_bridge(
                request.META.get("HTTP_X_RELAY_PLATFORM", ""),
                request.META.get("HTTP_X_RELAY_BACKEND", ""),
                request.META.get("HTTP_USER_AGENT", ""),
            )
        return result


class IsConnection(HoldsToken):
    """The request carries a valid connection token (ConnectionTokenAuthentication)."""

    holder_model = PuppetConnection


class ConnectionTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema (drf-spectacular) describes it."""

    target_class = ConnectionTokenAuthentication
    name = "connectionToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The connection's token (rlyp_...). HTTP Basic with the token as the "
            "password is accepted too.",
        }
