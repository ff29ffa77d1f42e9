"""API tokens in the GitHub style, stored as a lookup part plus a peppered HMAC digest.

A token reads `<prefix>_<lookup><secret><checksum>`, all base62 after the prefix:

- `prefix` names the kind (`rlyp` for a Puppet connection, `rlyt` for a push trigger, `rlyu`
  for a user's API token), so secret scanners can match leaked tokens with
  `rly[a-z]_[0-9A-Za-z]{61}`;
- `lookup` (12 characters) finds the row; it is not secret and is shown in listings;
- `secret` (43 characters, 256 bits from `secrets`);
- `checksum` (6 characters) is CRC32 of everything before it, so typos are rejected
  before any database lookup.

The database keeps `lookup`, `HMAC-SHA256(pepper, token)` and the pepper's id. Peppers come
from settings.TOKEN_PEPPERS; the highest id signs new digests, older ids still verify, and a
digest made with an old pepper is replaced the next time its token is used.
"""

import hashlib
import hmac
import logging
import re
import secrets
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Self

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from relay.vaulted import VaultBacked

log = logging.getLogger(__name__)

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
LOOKUP_LENGTH = 12
SECRET_LENGTH = 43  # 62**43 > 2**256
CHECKSUM_LENGTH = 6  # 62**6 > 2**32
BODY_LENGTH = LOOKUP_LENGTH + SECRET_LENGTH + CHECKSUM_LENGTH
_TOKEN_RE = re.compile(rf"^([a-z]{{4}})_([0-9A-Za-z]{{{BODY_LENGTH}}})$")
# What a secret scanner (or our own error-page filter) looks for: any token of ours.
LEAK_RE = re.compile(rf"rly[a-z]_[0-9A-Za-z]{{{BODY_LENGTH}}}")


class PlainToken(str):
    """A token in the clear. Its repr() never shows it, so it stays out of debug pages,
    tracebacks and log lines that format objects with %r."""

    def __repr__(self) -> str:
        return "PlainToken('***')"


@dataclass(frozen=True)
class ParsedToken:
    prefix: str
    lookup: str

    def __repr__(self) -> str:
        return f"ParsedToken({self.prefix}_{self.lookup}…)"


def _base62(number: int, width: int) -> str:
    digits = []
    for _ in range(width):
        number, rest = divmod(number, 62)
        digits.append(ALPHABET[rest])
    return "".join(reversed(digits))


def _checksum(text: str) -> str:
    return _base62(zlib.crc32(text.encode()), CHECKSUM_LENGTH)


def generate(prefix: str) -> PlainToken:
    body = "".join(secrets.choice(ALPHABET) for _ in range(LOOKUP_LENGTH + SECRET_LENGTH))
    head = f"{prefix}_{body}"
    return PlainToken(head + _checksum(head))


def parse(raw: str, prefix: str) -> ParsedToken | None:
    """The token's lookup part, or None when it is not a well-formed token of this kind."""
    match = _TOKEN_RE.match(raw)
    if match is None or match.group(1) != prefix:
        return None
    head, checksum = raw[:-CHECKSUM_LENGTH], raw[-CHECKSUM_LENGTH:]
    if not hmac.compare_digest(_checksum(head), checksum):
        return None
    return ParsedToken(prefix=prefix, lookup=match.group(2)[:LOOKUP_LENGTH])


def current_pepper_id() -> int:
    return max(settings.TOKEN_PEPPERS)


def digest(token: str, pepper_id: int) -> str:
    pepper = settings.TOKEN_PEPPERS[pepper_id]
    return hmac.new(pepper, token.encode(), hashlib.sha256).hexdigest()


# Compared against when the lookup part is unknown, so that an unknown token and a known
# lookup part with a wrong secret take the same work and give the same answer.
_DUMMY_DIGEST = "0" * 64


class DigestToken(models.Model):
    """A row found by a token of kind TOKEN_PREFIX, which it keeps only as lookup part and
    digest. Subclasses have an `owner` (the user requests act for, loaded with the row)."""

    TOKEN_PREFIX: str = ""

    token_lookup = models.CharField(max_length=LOOKUP_LENGTH, unique=True, editable=False)
    token_digest = models.CharField(max_length=64, editable=False)
    token_pepper_id = models.PositiveSmallIntegerField(editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True

    @property
    def token_prefix(self) -> str:
        """The part of the token that may be shown: kind and lookup."""
        return f"{self.TOKEN_PREFIX}_{self.token_lookup}" if self.token_lookup else ""

    def set_token(self, token: str) -> None:
        lookup = self.lookup_of(token)
        assert lookup is not None, "set_token() takes tokens made by generate()"
        self.token_lookup = lookup
        self.token_pepper_id = current_pepper_id()
        self.token_digest = digest(token, self.token_pepper_id)

    @classmethod
    def lookup_of(cls, raw: str) -> str | None:
        """The lookup part of a well-formed token of this kind, else None."""
        parsed = parse(raw, cls.TOKEN_PREFIX)
        return parsed.lookup if parsed else None

    @classmethod
    def for_token(cls, raw: str) -> "Self | None":
        """The row this token belongs to, or None. Unknown, malformed and wrong tokens are
        indistinguishable to the caller. Marks the row used (at most once a minute)."""
        lookup = cls.lookup_of(raw)
        if lookup is None:
            return None
        holder = cls._default_manager.select_related("owner").filter(token_lookup=lookup).first()
        if holder is None or holder.token_pepper_id not in settings.TOKEN_PEPPERS:
            hmac.compare_digest(digest(raw, current_pepper_id()), _DUMMY_DIGEST)
            return None
        if not hmac.compare_digest(digest(raw, holder.token_pepper_id), holder.token_digest):
            return None
        holder._mark_used(raw)
        return holder

    def _mark_used(self, raw: str) -> None:
        now = timezone.now()
        resolution = timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION)
        if self.last_used is not None and now - self.last_used < resolution:
            return
        changes: dict[str, object] = {"last_used": now}
        if self.token_pepper_id != current_pepper_id():
            # Rotation: re-sign with the newest pepper now that we hold the plain token.
            changes["token_pepper_id"] = current_pepper_id()
            changes["token_digest"] = digest(raw, current_pepper_id())
        # The last_used condition keeps concurrent requests to one write a minute; the digest
        # condition keeps a concurrent regenerate from being overwritten.
        type(self)._default_manager.filter(
            models.Q(last_used__isnull=True) | models.Q(last_used__lt=now - resolution),
            pk=self.pk,
            token_digest=self.token_digest,
        ).update(**changes)
        for field, value in changes.items():
            setattr(self, field, value)


class TokenHolder(DigestToken, VaultBacked):
    """A token holder whose plain token is also kept in Vault (relay.vaulted: key `token`;
    other keys of that secret belong to the subclass and are kept across regenerates), for
    the workflow steps that use it.

    Subclasses have a UUID `id`, an `owner`, `token_regenerated_at` and a VAULT_KIND."""

    class Meta:
        abstract = True

    @sensitive_variables("token", "secret")
    def issue_token(self, secret: dict[str, str] | None = None) -> PlainToken:
        """Save the row with a new token and store the token in Vault (with `secret`'s other
        keys, on create).

        Call inside transaction.atomic(): the row is written first (so constraint errors come
        before Vault is touched), Vault last. If Vault fails, VaultUnavailable propagates and
        the caller's transaction rolls the row back, leaving nothing half done."""
        creating = self._state.adding
        token = generate(self.TOKEN_PREFIX)
        self.set_token(token)
        if not creating:
            self.token_regenerated_at = timezone.now()
        self.save()
        self.write_secret({**(secret or {}), "token": token}, creating=creating)
        return token

    @classmethod
    def create_with_token(
        cls, owner: AbstractBaseUser, secret: dict[str, str] | None = None, **fields: object
    ) -> "tuple[Self, PlainToken]":
        holder = cls(owner=owner, **fields)
        with transaction.atomic():
            token = holder.issue_token(secret)
        log.info("%s %s created for user %s", cls._meta.verbose_name, holder.pk, owner.pk)
        return holder, token

    def regenerate_token(self) -> PlainToken:
        """A new token replaces the old, which stops working when this commits.

        The row lock serialises concurrent regenerates, so exactly one token survives: the
        last to commit, which is also the newest version in Vault."""
        with transaction.atomic():
            locked = type(self)._default_manager.select_for_update().get(pk=self.pk)
            token = locked.issue_token()
        for field in ("token_lookup", "token_digest", "token_pepper_id", "token_regenerated_at"):
            setattr(self, field, getattr(locked, field))
        log.info("%s %s token regenerated", self._meta.verbose_name, self.pk)
        return token
