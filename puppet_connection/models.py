import logging
import re
import uuid

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from relay import tokens, vault

log = logging.getLogger(__name__)

VAULT_KIND = "connections/puppet"

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

    @property
    def vault_path(self) -> str:
        return vault.path_for(VAULT_KIND, self.id)

    @sensitive_variables("token")
    def issue_token(self) -> tokens.PlainToken:
        """Save the connection with a new token and store the token in Vault.

        Call inside transaction.atomic(): the row is written first (so constraint errors come
        before Vault is touched), Vault last. If Vault fails, VaultUnavailable propagates and
        the caller's transaction rolls the row back, leaving nothing half done."""
        creating = self._state.adding
        token = tokens.generate(self.TOKEN_PREFIX)
        self.set_token(token)
        if not creating:
            self.token_regenerated_at = timezone.now()
        self.save()
        # Check-and-set: create only if absent; replace only the version we have just seen.
        cas = 0 if creating else vault.current_version(self.vault_path)
        vault.write(self.vault_path, {"token": token}, cas=cas)
        return token

    @classmethod
    def create_with_token(
        cls, owner: AbstractBaseUser, name: str, description: str = ""
    ) -> tuple["PuppetConnection", tokens.PlainToken]:
        connection = cls(owner=owner, name=name, description=description)
        with transaction.atomic():
            token = connection.issue_token()
        log.info("puppet connection %s created for user %s", connection.id, owner.pk)
        return connection, token

    def regenerate_token(self) -> tokens.PlainToken:
        """A new token replaces the old, which stops working when this commits.

        The row lock serialises concurrent regenerates, so exactly one token survives: the
        last to commit, which is also the newest version in Vault."""
        with transaction.atomic():
            locked = type(self).objects.select_for_update().get(pk=self.pk)
            token = locked.issue_token()
        for field in ("token_lookup", "token_digest", "token_pepper_id", "token_regenerated_at"):
            setattr(self, field, getattr(locked, field))
        log.info("puppet connection %s token regenerated", self.id)
        return token


@receiver(post_delete, sender=PuppetConnection)
def _delete_vault_secret(sender: type, instance: PuppetConnection, **kwargs: object) -> None:
    # A signal, not delete(), so admin bulk deletes and cascades from a deleted user count too.
    # After commit, so a rolled-back delete keeps its secret. If Vault is down now, the
    # token has already stopped working (its digest is gone) and the periodic
    # reconcile_vault_secrets task removes the secret later.
    path = instance.vault_path

    def purge() -> None:
        try:
            vault.delete(path)
        except vault.VaultUnavailable as exc:
            log.warning("vault secret %s left for the reconciler: %s", path, exc)

    transaction.on_commit(purge)
