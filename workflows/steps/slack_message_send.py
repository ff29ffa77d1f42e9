"""`relaysh/slack-step-message-send`: posts a message to a Slack channel with the Web API's
chat.postMessage (relay-integrations/relay-slack, steps/message-send). No outputs.

spec: connection (slack: `{apiToken}`), channel (an id, a name or `#name`), message (text,
Slack's mrkdwn), blocks (Block Kit blocks: a JSON text, as the published step takes them,
or a list), username (default "Relay by Puppet"). A message or blocks, or both.

Slack's refusals (`channel_not_found`, `not_in_channel`, `invalid_auth`, …) end the step
`failure` with Slack's error code. Network trouble, 429 (after its Retry-After) and 5xx are
tried again, without holding a worker, ATTEMPTS times in all."""

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.utils import timezone

from connections.models import SLACK_TOKEN_RE
from triggers.slack import SlackError, chat_post_message
from workflows.steps.base import Done, StepContext, Wait
from workflows.steps.spec import SpecError, check_fields

ATTEMPTS = 5
LONGEST_PAUSE = 60.0  # seconds, whatever Retry-After says
MOST_CHARACTERS = 40_000  # Slack truncates text beyond this
DEFAULT_USERNAME = "Relay by Puppet"


def request(spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The bot token and chat.postMessage's body."""
    check_fields(spec, {"connection", "channel", "message", "blocks", "username"}, MessageSend.image)
    connection = spec.get("connection")
    token = connection.get("apiToken") if isinstance(connection, Mapping) else None
    if not isinstance(token, str):
        raise SpecError(
            "spec.connection: give a slack connection, e.g. !Connection {type: slack, name: my-slack}."
        )
    if not SLACK_TOKEN_RE.match(token):
        raise SpecError("spec.connection: its apiToken is not a Slack token.")
    channel = spec.get("channel")
    if not isinstance(channel, str) or not channel.strip():
        raise SpecError("spec.channel: give the channel to post to, e.g. '#ops' or its id.")
    body: dict[str, Any] = {"channel": channel.strip()}
    message, blocks = spec.get("message"), spec.get("blocks")
    if message is not None and not isinstance(message, str):
        raise SpecError("spec.message: must be text (toString makes text of other values).")
    if message:
        body["text"] = message if len(message) <= MOST_CHARACTERS else message[: MOST_CHARACTERS - 1] + "…"
    if isinstance(blocks, str) and blocks.strip():
        try:
            blocks = json.loads(blocks)
        except ValueError:
            raise SpecError("spec.blocks: not JSON; give Slack's blocks as a JSON list.") from None
    if blocks:
        if not isinstance(blocks, list) or not all(isinstance(block, Mapping) for block in blocks):
            raise SpecError("spec.blocks: a list of Slack blocks (objects).")
        body["blocks"] = blocks
    if "text" not in body and "blocks" not in body:
        raise SpecError("spec.message: give the message (or blocks) to send.")
    username = spec.get("username")
    if username is not None and not isinstance(username, str):
        raise SpecError("spec.username: must be text.")
    body["username"] = username or DEFAULT_USERNAME
    return token, body


class MessageSend:
    image = "relaysh/slack-step-message-send"

    def start(self, ctx: StepContext) -> Done | Wait:
        return self.post(ctx, attempt=1)

    def check(self, ctx: StepContext) -> Done | Wait:
        # Only a retry waits: the connection's token comes with the spec again, from Vault.
        return self.post(ctx, attempt=int(ctx.state["attempt"]))

    def cancel(self, ctx: StepContext) -> None:
        pass  # nothing was posted while it waits

    def post(self, ctx: StepContext, attempt: int) -> Done | Wait:
        try:
            token, body = request(ctx.spec)
        except SpecError as exc:
            return Done(False, message=str(exc))
        try:
            answer = chat_post_message(token, body)
        except SlackError as exc:
            if exc.transient and attempt < ATTEMPTS:
                pause = min(exc.retry_after or 2.0**attempt, LONGEST_PAUSE)
                again = timezone.now() + timedelta(seconds=pause)
                return Wait(recheck_at=again, state={"attempt": attempt + 1})
            tries = f" (attempt {attempt} of {ATTEMPTS})" if exc.transient else ""
            return Done(False, message=f"{exc}{tries}.")
        # Only what has the form of Slack's ids is repeated from its answer.
        channel, ts = str(answer.get("channel", "")), str(answer.get("ts", ""))
        where = channel if re.fullmatch(r"[A-Z0-9]{1,32}", channel) else body["channel"]
        when = f" at {ts}" if re.fullmatch(r"[0-9]{1,12}\.[0-9]{1,9}", ts) else ""
        return Done(True, message=f"Posted to {where}{when}.")
