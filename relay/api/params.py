"""Whole numbers from query strings and headers.

`str.isdigit()` and `int()` take any Unicode digit: `int("٣")` is 3 and `"²".isdigit()` is
true though `int("²")` raises. A number on the wire is ASCII digits, and few enough of them
that `int()` never refuses it."""

from rest_framework import exceptions
from rest_framework.request import Request

MAX_DIGITS = 18


def is_whole_number(raw: str) -> bool:
    return 0 < len(raw) <= MAX_DIGITS and raw.isascii() and raw.isdigit()


def query_int(request: Request, name: str, default: int, lowest: int = 0, highest: int | None = None) -> int:
    """The query parameter `name` as a whole number from `lowest` to `highest`, or `default`
    when it is absent; anything else is a 400 naming the parameter."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if is_whole_number(raw) and int(raw) >= lowest and (highest is None or int(raw) <= highest):
        return int(raw)
    bounds = f"from {lowest} to {highest}" if highest is not None else f"of at least {lowest}"
    raise exceptions.ValidationError({name: [f"A whole number {bounds} (ASCII digits)."]})


def query_text(request: Request, name: str) -> str | None:
    """The query parameter `name` as text, or None when absent or empty. A NUL character is a
    400: PostgreSQL refuses it in any text, even a query's, which would be a 500."""
    value = request.query_params.get(name)
    if not value:
        return None
    if "\x00" in value:
        raise exceptions.ValidationError({name: ["Null characters are not allowed."]})
    return value
