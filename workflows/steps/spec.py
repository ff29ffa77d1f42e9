"""What every step handler does with its spec: refuse what it does not know, and say what is
wrong in the spec's own terms (`spec.scope.nodes[0]: …`)."""

from collections.abc import Mapping
from typing import Any


class SpecError(Exception):
    """The step's spec cannot be used; the message says why. The step ends `failure` with it."""


def check_fields(spec: Mapping[str, Any], known: set[str], image: str) -> None:
    """Unknown fields are refused, as the runs API refuses them: a misspelt `noop` must not
    turn a dry run into a real one, nor a misspelt `message` post nothing."""
    unknown = sorted(set(spec) - known)
    if unknown:
        raise SpecError(
            f"spec.{unknown[0]}: {image} takes no such field"
            + (f" (nor {', '.join(unknown[1:])})" if unknown[1:] else "")
            + f"; it takes {', '.join(sorted(known))}."
        )
