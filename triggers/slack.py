"""The one place that talks to Slack: incoming webhooks (POST JSON, answer 200 `ok`)."""

import requests
from django.conf import settings


class SlackError(Exception):
    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient  # worth retrying: network trouble, 429, 5xx


def post_message(webhook_url: str, payload: dict) -> None:
    try:
        answer = requests.post(
            webhook_url, json=payload, timeout=settings.SLACK_TIMEOUT, allow_redirects=False
        )
    except requests.RequestException as exc:
        raise SlackError(f"Slack could not be reached: {type(exc).__name__}", transient=True) from None
    if 200 <= answer.status_code < 300:
        return
    detail = f"Slack answered {answer.status_code}: {answer.text[:200]}"
    raise SlackError(detail, transient=answer.status_code == 429 or answer.status_code >= 500)


def message(summary: dict, resources: list[dict], link: str, most: int = 10) -> dict:
    """A short message: host, environment, status, the matching changes (at most `most`,
    with a count of the rest) and a link to the event."""
    lines = [
        f"*Puppet {summary['status']}* on `{summary['host']}` in `{summary.get('environment') or '?'}`"
        + (" (noop)" if summary.get("noop") else "")
    ]
    for resource in resources[:most]:
        flag = " failed" if resource["failed"] else ""
        lines.append(f"• {resource['type']}[{resource['title']}]: {resource['change_count']} change(s){flag}")
    if len(resources) > most:
        lines.append(f"… and {len(resources) - most} more")
    lines.append(f"<{link}|See the report in Relay>")
    return {"text": "\n".join(lines)}
