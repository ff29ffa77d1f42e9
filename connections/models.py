"""Connections: what `!Connection {type, name}` in a workflow names. One base, a type each.

A connection belongs to a user and has a name, unique per owner within its type. Its secret
lives in Vault at `<VAULT_PATH_PREFIX>/connections/<type>/<uuid>`, never in the row
(relay.vaulted). Each type says what a step sees of it (`step_data`), read from Vault when
the step starts. The types: `puppet` (puppet_connection: a token the service makes, whose
bridge authenticates with it) and `slack` (below: a bot token the user gives).

Adding a type: a subclass of Connection with TYPE and VAULT_KIND and its step_data(), its
admin (connections.admin.ConnectionAdmin), serializer and viewset (connections.api), and
the viewset in connections/api/urls.py.
"""

import logging
import re
import uuid
from typing import Any, ClassVar, Self

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from relay.tokens import PlainToken
from relay.vaulted import VaultBacked

log = logging.getLogger(__name__)

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "Use letters, digits, '.', '_' and '-', starting with a letter or digit.",
)


class ConnectionSecretMissing(Exception):
    """The connection's Vault secret lacks what its type needs (deleted by hand?)."""


class Connection(VaultBacked):
    """A user's connection of one type (TYPE), with its secret in Vault."""

    TYPE: ClassVar[str] = ""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=64, validators=[name_validator])
    description = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        abstract = True
        ordering = ["owner_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="%(app_label)s_%(class)s_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

    def step_data(self) -> dict[str, Any]:
        """What a workflow step sees for this connection, with its secret read from Vault now
        (VaultUnavailable when Vault cannot answer, ConnectionSecretMissing when the secret
        lacks what the type needs)."""
        raise NotImplementedError

    def secret_value(self, key: str) -> PlainToken:
        """One value of the connection's secret, whose repr() never shows it."""
        value = self.read_secret().get(key)
        if not value:
            raise ConnectionSecretMissing(
                f"The {self.TYPE} connection '{self.name}' has no {key} in Vault; set it again."
            )
        return PlainToken(value)


# Slack's tokens: `xoxb-` (a bot's), `xoxp-` (a user's), and the other `xox?-` kinds, or a
# rotating one (`xoxe.xoxb-…`). Only the characters Slack uses, so nothing else can reach the
# Authorization header (the API and the admin bound its length).
SLACK_TOKEN_RE = re.compile(r"^xox[a-z](?:\.xox[a-z])?-[0-9A-Za-z-]+\Z")


class SlackConnection(Connection):
    """A `slack` connection: a Slack app's bot token, given by the user. It is kept in Vault
    only, never shown back; it can be replaced. Steps see `{"apiToken": …}`, the field the
    published relaysh/slack-step-message-send reads."""

    TYPE = "slack"
    VAULT_KIND = "connections/slack"

    token_replaced_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta(Connection.Meta):
        verbose_name = "slack connection"

    @classmethod
    def create_with_token(cls, owner: AbstractBaseUser, token: str, **fields: object) -> Self:
        connection = cls(owner=owner, **fields)
        connection.save_with_token(token)
        log.info("slack connection %s created for user %s", connection.pk, owner.pk)
        return connection

    @sensitive_variables("token")
    def save_with_token(self, token: str) -> None:
        """Save the row and store its token: a new secret for a new row (never overwriting
        one), a replaced token for an existing one. The row first, Vault last, in one
        transaction: a Vault failure leaves neither (nor a half-done rename)."""
        creating = self._state.adding
        with transaction.atomic():
            if not creating:
                # The row lock serialises concurrent replaces: the last to commit is also the
                # newest version in Vault (check-and-set on the version it read).
                type(self)._default_manager.select_for_update().filter(pk=self.pk).first()
                self.token_replaced_at = timezone.now()
            self.save()
            self.write_secret({"token": token}, creating=creating)
        if not creating:
            log.info("slack connection %s token replaced", self.pk)

    def step_data(self) -> dict[str, Any]:
        return {"apiToken": self.secret_value("token")}
