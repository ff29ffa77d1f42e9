from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"

    def ready(self) -> None:
        from relay import checks  # noqa: F401 - registers the system checks
        from relay.api import schema  # noqa: F401 - registers the OpenAPI extensions
