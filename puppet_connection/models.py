import re
from typing import Any

from django.conf import settings
from django.db import models

from connections.models import Connection
from relay import tokens


class Platform(models.TextChoices):
    UNKNOWN = "", "unknown"
    PE = "pe", "Puppet Enterprise"
    OSS = "oss", "open source Puppet"


BACKEND_RE = re.compile(r"^[a-z0-9_-]{1,32}$")


class PuppetConnection(Connection, tokens.TokenHolder):
    """A `puppet` connection: its bridge authenticates with the connection's token.

    The plain token exists only in Vault (for workflow steps) and, once, in the response
    that created it; the database keeps its digest (see relay.tokens)."""

    TYPE = "puppet"
    TOKEN_PREFIX = "rlyp"
    VAULT_KIND = "connections/puppet"

    # The reverse name and the constraint's name from before the connection family.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="puppet_connections"
    )
    token_regenerated_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What the bridge last said it runs on (X-Relay-Platform, X-Relay-Backend headers).
    platform = models.CharField(max_length=8, choices=Platform.choices, blank=True, editable=False)
    bridge_backend = models.CharField(max_length=32, blank=True, editable=False)

    class Meta(Connection.Meta):
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_connection_name_per_owner")
        ]

    def step_data(self) -> dict[str, Any]:
        """What the published Puppet steps read: the service's URL (with a trailing slash,
        since they join `_puppet/runs` to it) and the token, from Vault."""
        return {"relayAPIURL": f"{settings.RELAY_PUBLIC_URL}/", "token": self.secret_value("token")}

    def note_bridge(self, platform: str, backend: str) -> None:
        """Remember the platform and backend the bridge reports on every call; written only
        when they change, so this costs nothing per request."""
        changes = {}
        platform = platform.strip().lower()
        if platform in (Platform.PE, Platform.OSS) and platform != self.platform:
            changes["platform"] = platform
        backend = backend.strip().lower()
        if BACKEND_RE.match(backend) and backend != self.bridge_backend:
            changes["bridge_backend"] = backend
        if changes:
            type(self).objects.filter(pk=self.pk).update(**changes)
            for field, value in changes.items():
                setattr(self, field, value)
