"""The one place that talks to Slack: incoming webhooks (POST JSON, answer 200 `ok`), and
the Web API's chat.postMessage (below) for workflow steps.

A webhook URL is the user's, so it is held to Slack: https, a host in SLACK_WEBHOOK_HOSTS,
checked when it is saved and again before every post (a URL saved before the rule still
meets it), and the connection reaches public addresses only (relay.egress)."""

import json
import re
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.exceptions import ValidationError
from django.views.decorators.debug import sensitive_variables

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
    def __init__(self, message: str, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient  # worth retrying: network trouble, 429, 5xx
        self.retry_after = retry_after  # seconds, when Slack said (429's Retry-After)


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


# What a Web API answer may say that is repeated in a step's message: its error code
# (`channel_not_found`, `not_in_channel`, `invalid_auth`, …), nothing else it holds.
API_ERROR_CODE_RE = re.compile(r"^[a-z_]{1,64}$")
# An ok answer echoes the message (text up to 40,000 characters, blocks); no more is read.
API_ANSWER_MAX_BYTES = 256 * 1024


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "an unknown status"


@sensitive_variables("token")
def chat_post_message(token: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Post a message with Slack's Web API, chat.postMessage at SLACK_API_URL: a JSON body
    with the bot token as Bearer. Slack answers 200 `{"ok": true, "channel", "ts", …}`, which
    is returned, or 200 `{"ok": false, "error": "<code>"}` when it refuses.

    Raises SlackError: transient for network trouble, 429 (with Slack's Retry-After) and
    5xx; not for a refusal, nor for an answer that is not Slack's (which is not repeated).
    The connection reaches public addresses only, like a webhook's (relay.egress)."""
    url = f"{settings.SLACK_API_URL}/chat.postMessage"
    if urlsplit(url).scheme.lower() != "https":
        raise SlackError("SLACK_API_URL must start with https://", transient=False)
    http = egress.session(settings.SLACK_API_ALLOW_LOOPBACK, settings.SLACK_CA_BUNDLE or True)
    try:
        answer = http.post(
            url,
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json; charset=utf-8"},
            timeout=settings.SLACK_TIMEOUT,
            allow_redirects=False,
            stream=True,
        )
        body = answer.raw.read(API_ANSWER_MAX_BYTES + 1, decode_content=True)
        answer.close()
    except egress.ForbiddenAddress as exc:
        raise SlackError(f"Slack was not called: {exc}", transient=False) from None
    except requests.RequestException as exc:
        raise SlackError(f"Slack could not be reached: {type(exc).__name__}", transient=True) from None
    finally:
        http.close()
    status = answer.status_code
    if status == 429:
        wait = answer.headers.get("Retry-After", "")
        retry_after = float(wait) if wait.isascii() and wait.isdigit() else None
        raise SlackError("Slack answered 429: rate limited", transient=True, retry_after=retry_after)
    if status >= 500:
        raise SlackError(f"Slack answered {status}: {_phrase(status)}", transient=True)
    try:
        data = json.loads(body) if len(body) <= API_ANSWER_MAX_BYTES else None
    except ValueError:
        data = None
    if status != 200 or not isinstance(data, dict):
        detail = f"Slack answered {status} ({_phrase(status)}), not as its Web API does"
        raise SlackError(detail, transient=False)
    if data.get("ok") is not True:
        error = data.get("error")
        code = error if isinstance(error, str) and API_ERROR_CODE_RE.match(error) else "no error code"
        raise SlackError(f"Slack refused the message: {code}", transient=False)
    return data
