"""How Puppet's report processors authenticate to `/api/events`: with the trigger's token."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from relay.api.authentication import HolderTokenAuthentication
from relay.api.permissions import HoldsToken
from triggers.models import Trigger


class TriggerTokenAuthentication(HolderTokenAuthentication):
    holder_model = Trigger


class IsTrigger(HoldsToken):
    """The request carries a valid push-trigger token (TriggerTokenAuthentication)."""

    holder_model = Trigger


class TriggerTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema (drf-spectacular) describes it."""

    target_class = TriggerTokenAuthentication
    name = "triggerToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The push trigger's token (rlyt_...). HTTP Basic with the token as the password "
            "(any user name) is accepted too, as Puppet's reporturl sends it.",
        }
