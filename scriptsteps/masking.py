"""Secrets out of a step's log: every value the step was given from a `!Secret`, a
connection, its runtime credential or an earlier step's sensitive output is replaced by `***`
before anything is stored, also when a value arrives split across two reads of the output.

A step may print a value encoded, so each is masked in the forms a shell step makes of it:
escaped inside a JSON string (`ni get`, with Go's escapes of `<>&`), percent-encoded (`jq
@uri`, `curl --data-urlencode`, `urllib.parse.quote`: %XX in upper and lower case, `+` or %20
for a space) and in base64 (`base64`, `Authorization: Basic`). Inside a longer base64 text a
value's characters depend on where it starts (its offset mod 3): for each of the three
alignments, the characters made of the value's bits alone (its stable core) are masked; the
one or two characters at each end that mix in its neighbours' bits stay (a few bits, never
the value). An `Authorization: Basic` line (`curl -v -u user:$SECRET`) is masked whole, user
included: its credentials are one base64 text whatever the secret's alignment in it.
"""

import base64
import binascii
import json
import re
import textwrap
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"
# Shorter values would mask ordinary words ("yes", "1234"); they are too short to be secrets.
MIN_LENGTH = 4
# A base64 core shorter than this could be a piece of any base64 text (or a word).
MIN_CORE = 8
# HTTP Basic credentials: `Basic <base64 of user:password>`, what curl -v prints of `-u`.
BASIC = re.compile(r"(\bBasic[ \t]+)([A-Za-z0-9+/]+={0,2})(?![A-Za-z0-9+/=])", re.IGNORECASE)
BASIC_OPEN = re.compile(r"\bBasic[ \t]+[A-Za-z0-9+/]*={0,2}\Z", re.IGNORECASE)
MAX_BASIC = 4096  # characters of credentials held back while they may go on


def variants(values: Iterable[str]) -> list[str]:
    """The values as a step may print them: as given, escaped inside a JSON string (what
    `ni get` prints for a value with quotes, backslashes or newlines), percent-encoded, and
    in base64. Longest first, so that a value containing another is masked whole."""
    found: set[str] = set()
    for value in values:
        if not isinstance(value, str) or len(value) < MIN_LENGTH:
            continue
        found.add(value)
        for escaped in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
            found.add(escaped)
            found.add(go_json_escaped(escaped))
        for line in value.splitlines():  # a multi-line secret printed line by line
            if len(line.strip()) >= MIN_LENGTH * 2:
                found.add(line)
        found.update(url_encoded(value))
        found.update(base64_cores(value.encode("utf-8")))
    return sorted(found, key=lambda v: (-len(v), v))


def go_json_escaped(text: str) -> str:
    """JSON string text as Go's encoding/json writes it (`ni get`): `<`, `>` and `&` as
    \\u003c, \\u003e and \\u0026."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def strings_in(value: Any) -> list[str]:
    """What a step prints of a JSON value (an output): its strings and numbers, each alone
    (`ni output get` prints a string as is, a structure as JSON)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool) or value is None:
        return []  # true, false, null: words, not secrets
    if isinstance(value, int | float):
        return [json.dumps(value)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings_in(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    return []


def url_encoded(value: str) -> set[str]:
    """Percent-encoded forms: every reserved character as %XX (RFC 3986, what curl and jq
    encode), with `/` or `!'()*` left as they are (Python's and JavaScript's defaults), hex
    digits in either case, a space as %20 or `+` (forms)."""
    forms = {
        quote(value, safe=""),
        quote(value),
        quote(value, safe="!'()*"),  # JavaScript's encodeURIComponent
        quote_plus(value),
    }
    lower = {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in forms}
    return {form for form in forms | lower if form != value}


def base64_cores(raw: bytes) -> set[str]:
    """For each alignment of `raw` in a longer base64 text (0, 1 or 2 bytes before it), the
    characters that only its bits make, in the standard and the URL-safe alphabets. At
    alignment 0 that is the standalone encoding without its last, mixed character; and a
    long value's standalone encoding broken into lines, each line."""
    cores = set()
    for before in range(3):
        encoded = base64.b64encode(bytes(before) + raw).decode()
        start = -(-8 * before // 6)  # the first character with none of the bytes before
        end = 8 * (before + len(raw)) // 6  # the last character with none of the bytes after
        core = encoded[start:end]
        if len(core) >= MIN_CORE:
            cores.add(core)
            cores.add(core.translate(str.maketrans("+/", "-_")))
    whole = base64.b64encode(raw).decode()
    if len(raw) % 3 == 0:
        cores.add(whole)  # whole groups: no mixed character at the end
    for width in (76, 64):  # `base64` and `openssl base64` break lines there
        if len(whole) > width:
            cores.update(line for line in textwrap.wrap(whole, width) if len(line) >= MIN_CORE)
    return cores


def is_credentials(token: str) -> bool:
    """Whether a `Basic` token is credentials (`user:password` in base64) rather than a word
    that happens to follow "basic" in a sentence."""
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


class Masker:
    """Feed text as it comes; what `feed` returns is safe to store. It holds back the end of
    the text that could be the start of a secret (or of Basic credentials) until the next
    feed (or `flush`)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets: list[str] = []
        self.by_start: dict[str, list[str]] = {}  # by their first MIN_LENGTH characters
        self.pending = ""
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """More values to mask from now on (the text held back included)."""
        new = set(variants(secrets)) - set(self.secrets)
        if new:
            self.secrets = sorted([*self.secrets, *new], key=lambda v: (-len(v), v))
            self.by_start = {}
            for secret in self.secrets:
                self.by_start.setdefault(secret[:MIN_LENGTH], []).append(secret)

    def feed(self, text: str) -> str:
        text = self.pending + text
        # Credentials that may go on are held whole, untouched until they end.
        window = text[-MAX_BASIC:]
        credentials = BASIC_OPEN.search(window)
        cut = len(text) - len(window) + credentials.start() if credentials is not None else len(text)
        head = self._replace(text[:cut])
        hold = self._held(head)
        self.pending = head[len(head) - hold :] + text[cut:]
        return head[: len(head) - hold]

    def flush(self) -> str:
        text, self.pending = self._replace(self.pending), ""
        return text

    def _replace(self, text: str) -> str:
        # Credentials first: masked whole, rather than around a secret's core inside them.
        if "asic" in text or "ASIC" in text:
            text = BASIC.sub(self._basic, text)
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    @staticmethod
    def _basic(match: re.Match) -> str:
        return match.group(1) + MASK if is_credentials(match.group(2)) else match.group(0)

    def _held(self, text: str) -> int:
        """The length of the longest end of `text` that begins some secret, or `Basic`."""
        hold = 0
        if self.secrets:
            # Only where a secret's first characters are can one start (a long secret, a key,
            # would otherwise cost a comparison per character and variant).
            for start in range(max(len(text) - len(self.secrets[0]) + 1, 0), len(text)):
                if len(text) - start >= MIN_LENGTH:
                    candidates = self.by_start.get(text[start : start + MIN_LENGTH])
                    if not candidates:
                        continue
                else:
                    candidates = self.secrets
                tail = text[start:]
                if any(secret.startswith(tail) for secret in candidates):
                    hold = len(tail)
                    break
        for size in range(min(len("Basic "), len(text)), 0, -1):  # "Bas": maybe Basic's start
            if "basic ".startswith(text[-size:].lower()):
                hold = max(hold, size)
                break
        return hold
