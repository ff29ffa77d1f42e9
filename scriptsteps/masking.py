"""Secrets out of a step's log: every value the step was given from a `!Secret`, a
connection or its runtime credential is replaced by `***` before anything is stored, also
when a value arrives split across two reads of the output."""

import json
from collections.abc import Iterable

MASK = "***"
# Shorter values would mask ordinary words ("yes", "1234"); they are too short to be secrets.
MIN_LENGTH = 4


def variants(values: Iterable[str]) -> list[str]:
    """The values as a step may print them: as given, and escaped inside a JSON string (what
    `ni get` prints for a value with quotes, backslashes or newlines). Longest first, so that
    a value containing another is masked whole."""
    found: set[str] = set()
    for value in values:
        if not isinstance(value, str) or len(value) < MIN_LENGTH:
            continue
        found.add(value)
        found.add(json.dumps(value)[1:-1])
        found.add(json.dumps(value, ensure_ascii=False)[1:-1])
        for line in value.splitlines():  # a multi-line secret printed line by line
            if len(line.strip()) >= MIN_LENGTH * 2:
                found.add(line)
    return sorted(found, key=lambda v: (-len(v), v))


class Masker:
    """Feed text as it comes; what `feed` returns is safe to store. It holds back the end of
    the text that could be the start of a secret until the next feed (or `flush`)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = variants(secrets)
        self.pending = ""

    def feed(self, text: str) -> str:
        if not self.secrets:
            return text
        text = self._replace(self.pending + text)
        hold = self._held(text)
        self.pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold] if hold else text

    def flush(self) -> str:
        text, self.pending = self._replace(self.pending), ""
        return text

    def _replace(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def _held(self, text: str) -> int:
        """The length of the longest end of `text` that begins some secret."""
        longest = min(len(self.secrets[0]) - 1, len(text))
        for size in range(longest, 0, -1):
            tail = text[-size:]
            if any(secret.startswith(tail) for secret in self.secrets):
                return size
        return 0
