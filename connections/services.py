"""What the workflow engine asks of connections: the types, and `!Connection {type, name}`
resolved to what a step sees."""

from typing import Any

from django.apps import apps

from connections.models import Connection


def connection_types() -> dict[str, type[Connection]]:
    """Type name (`puppet`, `slack`) -> model."""
    return {model.TYPE: model for model in apps.get_models() if issubclass(model, Connection)}


def resolve_connection(owner_id: int, type: str, name: str) -> dict[str, Any] | None:
    """The owner's connection of this type and name as a step sees it, its secret read from
    Vault now: `puppet` -> {"relayAPIURL", "token"}, `slack` -> {"apiToken"}. None when the
    type is unknown or the owner has no such connection.

    Raises relay.vault.VaultUnavailable when Vault cannot answer (worth retrying) and
    connections.models.ConnectionSecretMissing when the secret lacks the token."""
    model = connection_types().get(type)
    if model is None:
        return None
    connection = model._default_manager.filter(owner_id=owner_id, name=name).first()
    return None if connection is None else connection.step_data()
