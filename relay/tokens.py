"""API tokens in the GitHub style, stored as a lookup part plus a peppered HMAC digest.

A token reads `<prefix>_<lookup><secret><checksum>`, all base62 after the prefix:

- `prefix` names the kind (`rlyp` for a Puppet connection, `rlyt` for a push trigger), so
  secret scanners can match leaked tokens with `rly[pt]_[0-9A-Za-z]{61}`;
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
import re
import secrets
import zlib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

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


class TokenHolder(models.Model):
    """A row that authenticates requests with a token of kind TOKEN_PREFIX. Subclasses have an
    `owner` (the user the requests act for), loaded with the row in the same query."""

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
        parsed = parse(token, self.TOKEN_PREFIX)
        assert parsed is not None, "set_token() takes tokens made by generate()"
        self.token_lookup = parsed.lookup
        self.token_pepper_id = current_pepper_id()
        self.token_digest = digest(token, self.token_pepper_id)

    @classmethod
    def for_token(cls, raw: str) -> "TokenHolder | None":
        """The row this token belongs to, or None. Unknown, malformed and wrong tokens are
        indistinguishable to the caller. Marks the row used (at most once a minute)."""
        parsed = parse(raw, cls.TOKEN_PREFIX)
        if parsed is None:
            return None
        holder = cls._default_manager.select_related("owner").filter(token_lookup=parsed.lookup).first()
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
