import json as _json
from datetime import UTC, datetime
from typing import Any

from django import template

register = template.Library()


@register.filter
def utc(value: datetime | None) -> str:
    """A time to the second, in UTC and saying so: "2026-11-26 05:18:28 UTC"."""
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def json(value: Any) -> str:
    """A value as JSON text (escaped by the template as any text)."""
    return _json.dumps(value, sort_keys=True, default=str)
