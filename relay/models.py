"""User API tokens: what a person or a script uses for the user endpoints."""

import logging
import re

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models
from django.utils import timezone

from relay import tokens

log = logging.getLogger(__name__)

# A key of DRF's authtoken, which this replaced: 40 hex digits (relay/migrations/0002).
LEGACY_KEY_RE = re.compile(r"^[0-9a-f]{40}$")


class UserToken(tokens.DigestToken):
    """A user's API token (`rlyu_…`), sent as `Authorization: Token …` or `Bearer …` to the
    user endpoints, never to the machine ones (relay.api.authentication).

    Only its digest is kept (relay.tokens); the plain token is shown once, by the command or
    the admin page that made it, and is in no other place, Vault included: nothing in the
    service needs it back. A user may hold several, one per machine or script; deleting one
    revokes it.

    `legacy` rows are DRF keys from before, migrated as digests so that they keep working;
    their lookup part is the key's first 12 hex digits."""

    TOKEN_PREFIX = "rlyu"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(
        max_length=64, blank=True, help_text="What it is for, e.g. the machine or script that uses it."
    )
    created = models.DateTimeField(default=timezone.now, editable=False)
    legacy = models.BooleanField(default=False, editable=False, help_text="A DRF key from before.")

    class Meta:
        ordering = ["owner_id", "-created"]
        verbose_name = "user API token"

    def __str__(self) -> str:
        return self.name or self.token_prefix

    @property
    def token_prefix(self) -> str:
        return f"{self.token_lookup}…" if self.legacy else super().token_prefix

    @classmethod
    def lookup_of(cls, raw: str) -> str | None:
        if LEGACY_KEY_RE.match(raw):
            return raw[: tokens.LOOKUP_LENGTH]
        return super().lookup_of(raw)

    @classmethod
    def create_for(cls, owner: AbstractBaseUser, name: str = "") -> "tuple[UserToken, tokens.PlainToken]":
        row = cls(owner=owner, name=name)
        token = row.issue_token()
        log.info("user API token %s created for user %s", row.token_prefix, owner.pk)
        return row, token

    def issue_token(self) -> tokens.PlainToken:
        """Save this new row with a new token, and answer the token: the one time it exists."""
        token = tokens.generate(self.TOKEN_PREFIX)
        self.set_token(token)
        self.save()
        return token

    def revoke(self) -> None:
        self.delete()
        log.info("user API token %s of user %s revoked", self.token_prefix, self.owner_id)
