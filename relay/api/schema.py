"""How the OpenAPI schema (drf-spectacular) describes our own authentication."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ConnectionTokenScheme(OpenApiAuthenticationExtension):
    target_class = "relay.api.authentication.ConnectionTokenAuthentication"
    name = "connectionToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The connection's token (rlyp_...). HTTP Basic with the token as the "
            "password is accepted too.",
        }


class TriggerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "relay.api.authentication.TriggerTokenAuthentication"
    name = "triggerToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The push trigger's token (rlyt_...). HTTP Basic with the token as the password "
            "(any user name) is accepted too, as Puppet's reporturl sends it.",
        }


class UserTokenScheme(OpenApiAuthenticationExtension):
    target_class = "relay.api.authentication.UserTokenAuthentication"
    name = "userToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A user API token (rlyu_...), from `manage.py create_user_token USER` or the "
            "admin. `Authorization: Token <token>` is accepted too.",
        }
