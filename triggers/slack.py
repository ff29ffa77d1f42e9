"""The one place that talks to Slack: incoming webhooks (POST JSON, answer 200 `ok`).

A webhook URL is the user's, so it is held to Slack: https, a host in SLACK_WEBHOOK_HOSTS,
checked when it is saved and again before every post (a URL saved before the rule still
meets it), and the connection reaches public addresses only (relay.egress)."""

from http import HTTPStatus
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.exceptions import ValidationError

from relay import egress

# What Slack answers a webhook when it refuses a message: the only text of an answer that is
# repeated on the event. Anything else a server answers stays out of the database, so a
# webhook cannot be used to read another server's pages.
SLACK_ERROR_CODES = frozenset(
    {
        "action_prohibited",
        "channel_is_archived",
        "channel_not_found",
        "invalid_payload",
        "invalid_token",
        "no_active_hooks",
        "no_service",
        "no_service_id",
        "no_team",
        "no_text",
        "posting_to_general_channel_denied",
        "rate_limited",
        "team_disabled",
        "too_many_attachments",
        "user_not_found",
    }
)


class SlackError(Exception):
    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient  # worth retrying: network trouble, 429, 5xx


def check_webhook_url(url: str) -> None:
    """A validator (the API's serializer and post_message): https, to an allowed host."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ValidationError("A Slack webhook URL must start with https://.", code="https_required")
    allowed = settings.SLACK_WEBHOOK_HOSTS
    if parts.username is not None or (parts.hostname or "").rstrip(".") not in allowed:
        raise ValidationError(
            f"A Slack webhook URL must point at {' or '.join(allowed)}.", code="host_not_allowed"
        )


def post_message(webhook_url: str, payload: dict) -> None:
    try:
        check_webhook_url(webhook_url)
    except ValidationError as exc:
        raise SlackError(f"The webhook URL is refused: {exc.messages[0]}", transient=False) from None
    http = egress.session(settings.SLACK_WEBHOOK_ALLOW_LOOPBACK, settings.SLACK_CA_BUNDLE or True)
    try:
        # Not streamed whole: at most a few bytes of the answer are read (Slack's error code).
        answer = http.post(
            webhook_url, json=payload, timeout=settings.SLACK_TIMEOUT, allow_redirects=False, stream=True
        )
        head = answer.raw.read(64, decode_content=True) if answer.status_code >= 300 else b""
        answer.close()
    except egress.ForbiddenAddress as exc:
        # Permanent: the name may point elsewhere later, but this is no outage to wait out.
        raise SlackError(f"The webhook was not called: {exc}.", transient=False) from None
    except requests.RequestException as exc:
        raise SlackError(f"Slack could not be reached: {type(exc).__name__}", transient=True) from None
    finally:
        http.close()
    if 200 <= answer.status_code < 300:
        return
    code = head.decode("ascii", "replace").strip()
    try:
        phrase = HTTPStatus(answer.status_code).phrase
    except ValueError:
        phrase = "an unknown status"
    reason = code if code in SLACK_ERROR_CODES else phrase
    raise SlackError(
        f"Slack answered {answer.status_code}: {reason}",
        transient=answer.status_code == 429 or answer.status_code >= 500,
    )


def escape(text: object) -> str:
    """Slack reads `<…>` as a link or a mention (`<!channel>`, `<@U123>`, `<http://x|click>`)
    and `&` as the start of an escape: what a report says is shown as text, never as those."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message(summary: dict, resources: list[dict], link: str, most: int = 10) -> dict:
    """A short message: host, environment, status, the matching changes (at most `most`,
    with a count of the rest) and a link to the event. Everything taken from the report is
    escaped; the link is the service's own."""
    lines = [
        f"*Puppet {escape(summary['status'])}* on `{escape(summary['host'])}`"
        f" in `{escape(summary.get('environment') or '?')}`" + (" (noop)" if summary.get("noop") else "")
    ]
    for resource in resources[:most]:
        flag = " failed" if resource["failed"] else ""
        lines.append(
            f"• {escape(resource['type'])}[{escape(resource['title'])}]:"
            f" {escape(resource['change_count'])} change(s){flag}"
        )
    if len(resources) > most:
        lines.append(f"… and {len(resources) - most} more")
    lines.append(f"<{link}|See the report in Relay>")
    return {"text": "\n".join(lines)}
