"""How the OpenAPI schema (drf-spectacular) describes the user token (the connection's and the
trigger's token: beside their authentication, in their apps)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
