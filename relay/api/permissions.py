from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from relay.tokens import TokenHolder


class _HoldsToken(BasePermission):
    prefix = ""

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.auth, TokenHolder) and request.auth.TOKEN_PREFIX == self.prefix


class IsConnection(_HoldsToken):
    """The request carries a valid connection token (see ConnectionTokenAuthentication)."""

    prefix = "rlyp"


class IsTrigger(_HoldsToken):
    """The request carries a valid push-trigger token (see TriggerTokenAuthentication)."""

    prefix = "rlyt"
