import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from connections.models import Connection
from relay import tokens


class Platform(models.TextChoices):
    UNKNOWN = "", "not set"
    PE = "pe", "Puppet Enterprise"
    OSS = "oss", "open source Puppet"


class Backend(models.TextChoices):
    """What the connection's bridge runs Puppet with."""

    UNKNOWN = "", "not set"
    ORCHESTRATOR = "orchestrator", "the PE orchestrator"
    BOLT = "bolt", "Bolt"
    SSH = "ssh", "SSH"


BACKEND_RE = re.compile(r"^[a-z0-9_-]{1,32}$")
# The first product of a User-Agent: `relay-bridge/0.1.0` (our bridge), `Ruby` (the shipped
# agent's Net::HTTP). Anything else is not recorded.
AGENT_RE = re.compile(r"^[A-Za-z0-9._+-]{1,40}(?:/[A-Za-z0-9._+-]{1,23})?")


def settings_error(platform: str, backend: str) -> str | None:
    """Why this pair of settings cannot be, or None."""
    if platform == Platform.OSS and backend == Backend.ORCHESTRATOR:
        return (
            "The orchestrator is part of Puppet Enterprise: set the platform to pe, or the backend"
            " to bolt or ssh."
        )
    return None


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
    # What the connection's Puppet is and runs with: runs are checked against these when they
    # are created (runs.api.serializers.check_against_connection). Empty: not set, and then
    # the platform the bridge reports stands in, as it did before these settings existed.
    platform = models.CharField(
        max_length=8,
        choices=Platform.choices,
        blank=True,
        help_text="On Puppet Enterprise a Puppet run (type run) needs an environment; open source"
        " Puppet (without a backend set) takes only runs on a list of nodes.",
    )
    backend = models.CharField(
        max_length=16,
        choices=Backend.choices,
        blank=True,
        help_text="The orchestrator runs everything; Bolt runs on a list of nodes, and task runs; SSH"
        " runs only on a list of nodes.",
    )
    puppetdb = models.BooleanField(
        "PuppetDB",
        default=False,
        help_text="The bridge has PuppetDB (its puppetdb_url): open source Puppet then also takes runs"
        " whose scope is a PuppetDB query, which the bridge resolves to nodes.",
    )
    # What the bridge last said it runs on (our bridge's X-Relay-Platform and X-Relay-Backend
    # headers; the shipped Ruby agent sends neither). Shown, and compared with the settings,
    # never trusted over them.
    reported_platform = models.CharField(max_length=8, choices=Platform.choices, blank=True, editable=False)
    reported_backend = models.CharField(max_length=32, blank=True, editable=False)
    # What the bridge calls itself (its User-Agent's first product): which bridge, which version.
    reported_agent = models.CharField(max_length=64, blank=True, editable=False)

    class Meta(Connection.Meta):
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_connection_name_per_owner")
        ]

    def step_data(self) -> dict[str, Any]:
        """What the published Puppet steps read: the service's URL (with a trailing slash,
        since they join `_puppet/runs` to it) and the token, from Vault."""
        return {"relayAPIURL": f"{settings.RELAY_PUBLIC_URL}/", "token": self.secret_value("token")}

    def clean(self) -> None:
        super().clean()
        error = settings_error(self.platform, self.backend)
        if error:
            raise ValidationError({"backend": error})

    @property
    def platform_for_runs(self) -> str:
        """The platform runs are checked against: the setting (the orchestrator backend
        implies Puppet Enterprise), else, for a connection whose settings were never made,
        what its bridge reported."""
        if self.platform:
            return self.platform
        if self.backend == Backend.ORCHESTRATOR:
            return Platform.PE
        return self.reported_platform

    def bridge_warnings(self) -> list[str]:
        """Where the bridge's last report contradicts the settings (the settings win)."""
        warnings = []
        platform = self.platform or (Platform.PE if self.backend == Backend.ORCHESTRATOR else "")
        if platform and self.reported_platform and self.reported_platform != platform:
            warnings.append(
                f"The bridge says it runs on {Platform(self.reported_platform).label}, but this connection"
                f" is set to {Platform(platform).label}: runs are checked against the setting."
            )
        if self.backend and self.reported_backend and self.reported_backend != self.backend:
            warnings.append(
                f"The bridge says its backend is {self.reported_backend}, but this connection is set to"
                f" {self.backend}: runs are checked against the setting."
            )
        return warnings

    def note_bridge(self, platform: str, backend: str, agent: str = "") -> None:
        """Remember the platform and backend the bridge reports on every call, and what it
        calls itself (its User-Agent); written only when they change, so this costs nothing
        per request. Never a setting: a report that differs from one is shown as a warning
        (bridge_warnings). (The heartbeat's fast path skips this while the token's last use
        is fresh, so a new version shows within TOKEN_LAST_USED_RESOLUTION.)"""
        changes = {}
        platform = platform.strip().lower()
        if platform in (Platform.PE, Platform.OSS) and platform != self.reported_platform:
            changes["reported_platform"] = platform
        backend = backend.strip().lower()
        if BACKEND_RE.match(backend) and backend != self.reported_backend:
            changes["reported_backend"] = backend
        product = AGENT_RE.match(agent.strip())
        if product and product.group() != self.reported_agent:
            changes["reported_agent"] = product.group()
        if changes:
            type(self).objects.filter(pk=self.pk).update(**changes)
            for field, value in changes.items():
                setattr(self, field, value)
