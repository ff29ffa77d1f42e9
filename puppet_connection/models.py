import re
import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from relay import tokens

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "Use letters, digits, '.', '_' and '-', starting with a letter or digit.",
)


class Platform(models.TextChoices):
    UNKNOWN = "", "unknown"
    PE = "pe", "Puppet Enterprise"
    OSS = "oss", "open source Puppet"


BACKEND_RE = re.compile(r"^[a-z0-9_-]{1,32}$")


class PuppetConnection(tokens.TokenHolder):
    """A `puppet` connection: its bridge authenticates with the connection's token.

    The plain token exists only in Vault (for workflow steps) and, once, in the response
    that created it; the database keeps its digest (see relay.tokens)."""

    TOKEN_PREFIX = "rlyp"
    VAULT_KIND = "connections/puppet"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="puppet_connections"
    )
    name = models.CharField(max_length=64, validators=[name_validator])
    description = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(default=timezone.now, editable=False)
    token_regenerated_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What the bridge last said it runs on (X-Relay-Platform, X-Relay-Backend headers).
    platform = models.CharField(max_length=8, choices=Platform.choices, blank=True, editable=False)
    bridge_backend = models.CharField(max_length=32, blank=True, editable=False)

    class Meta:
        ordering = ["owner_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_connection_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

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
