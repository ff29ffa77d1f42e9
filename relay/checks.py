"""System checks of the service's own settings (`manage.py check --deploy`)."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def deployment_id_is_set(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if settings.RELAY_DEPLOYMENT_ID:
        return []
    return [
        Warning(
            "RELAY_DEPLOYMENT_ID is not set, so the Vault reconciler deletes no orphaned secrets "
            "(it could not tell this deployment's from another's under the same prefix).",
            hint="Set RELAY_DEPLOYMENT_ID to a name for this deployment, e.g. production.",
            id="relay.W001",
        )
    ]
