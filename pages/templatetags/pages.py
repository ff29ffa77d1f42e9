import json as _json
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils.html import format_html

register = template.Library()


@register.filter
def utc(value: datetime | None) -> str:
    """A time to the second, in UTC and saying so: "2026-11-26 05:18:28 UTC", marked as a
    <time> that pages/static/pages/times.js shows in the browser's own time zone, saying which."""
    if value is None:
        return ""
    moment = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}">{}</time>',
        moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


@register.filter
def json(value: Any) -> str:
    """A value as JSON text (escaped by the template as any text)."""
    return _json.dumps(value, sort_keys=True, default=str)
