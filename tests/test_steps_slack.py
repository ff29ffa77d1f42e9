"""relaysh/slack-step-message-send, driven as the engine drives it (tests/step_helpers.py),
with a `slack` connection's token from Vault, against the Slack stand-in's chat.postMessage
over HTTPS (tests/slack_standin.py)."""

import logging
from datetime import UTC, datetime, timedelta

import pytest

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from tests.slack_standin import API_PATH, SlackStandIn
from tests.step_helpers import Connection, Step
from workflows.steps.base import Done, Wait

SEND = "relaysh/slack-step-message-send"
TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"


@pytest.fixture
def slack(tmp_path, settings, alice, bao):
    """The stand-in, reachable as Slack's Web API (test-only settings), knowing alice's bot token."""
    standin = SlackStandIn(tmp_path)
    standin.allow_api(settings, TOKEN)
    SlackConnection.create_with_token(owner=alice, name="team", token=TOKEN)
    yield standin
    standin.close()


def send(owner, **spec) -> Step:
    return Step(SEND, {"connection": Connection("slack", "team"), **spec}, owner.pk)


def test_it_posts_with_chat_post_message_as_slack_documents_it(slack, alice):
    step = send(alice, channel="#general", message="Puppet *finished* on `web1`")
    done = step.start()
    assert isinstance(done, Done) and done.success, done.message
    assert done.outputs == {} and done.message.startswith("Posted to C0123456789 at ")
    [request] = slack.received
    assert request["path"] == API_PATH and request["host"] == f"localhost:{slack.port}"
    assert request["authorization"] == f"Bearer {TOKEN}"  # the token read from Vault
    assert request["type"] == "application/json; charset=utf-8"
    assert request["json"] == {
        "channel": "#general",
        "text": "Puppet *finished* on `web1`",
        "username": "Relay by Puppet",
    }
    assert slack.posted() == [request["json"]]


def test_blocks_as_the_published_step_s_json_text_or_as_a_list(slack, alice):
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "Hello from Relay!"}}]
    assert (
        send(
            alice,
            channel="C0123456789",
            blocks='[{"type": "section", "text": {"type": "mrkdwn", "text": "Hello from Relay!"}}]',
            username="Relay Workflows",
        )
        .start()
        .success
    )
    assert send(alice, channel="general", blocks=blocks, message="fallback").start().success
    assert slack.posted() == [
        {"channel": "C0123456789", "blocks": blocks, "username": "Relay Workflows"},
        {"channel": "general", "text": "fallback", "blocks": blocks, "username": "Relay by Puppet"},
    ]


def test_slack_s_refusals_fail_the_step_with_its_error_code(slack, alice, bob):
    done = send(alice, channel="#nowhere", message="hi").start()
    assert not done.success and done.message == "Slack refused the message: channel_not_found."
    SlackConnection.create_with_token(owner=bob, name="team", token="xoxb-9-9-revokedtoken")
    done = send(bob, channel="#general", message="hi").start()
    assert not done.success and done.message == "Slack refused the message: invalid_auth."
    assert slack.posted() == [] and len(slack.received) == 2  # each tried once: refusals are final


def test_a_429_waits_for_retry_after_without_a_worker_and_then_posts(slack, alice):
    slack.answers = [429]
    step = send(alice, channel="#general", message="hi")
    first = step.start()
    assert isinstance(first, Wait) and first.wake_on is None and first.state == {"attempt": 2}
    assert first.recheck_at <= datetime.now(UTC) + timedelta(seconds=1)  # Slack's Retry-After: 1
    done = step.until_done(timeout=10)
    assert done.success and len(slack.received) == 2 and len(slack.posted()) == 1


def test_5xx_and_network_trouble_are_tried_five_times_with_backoff(slack, alice, settings):
    slack.answers = [500, 500, 500, 500, 500]
    step = send(alice, channel="#general", message="hi")
    pauses = []
    outcome = step.start()
    while isinstance(outcome, Wait):
        pauses.append((outcome.recheck_at - datetime.now(UTC)).total_seconds())
        outcome = step.check()  # the engine would wait until recheck_at
    assert [round(p) for p in pauses] == [2, 4, 8, 16]
    assert not outcome.success
    assert outcome.message == "Slack answered 500: Internal Server Error (attempt 5 of 5)."
    settings.SLACK_API_URL = "https://localhost:1/api"  # nobody listens
    first = send(alice, channel="#general", message="hi").start()
    assert isinstance(first, Wait) and first.state == {"attempt": 2}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"channel": "#general"}, "spec.message: give the message (or blocks) to send."),
        ({"message": "hi"}, "spec.channel: give the channel to post to"),
        ({"channel": "#general", "message": {"a": 1}}, "spec.message: must be text"),
        ({"channel": "#general", "blocks": "[not json"}, "spec.blocks: not JSON"),
        ({"channel": "#general", "blocks": '{"type": "section"}'}, "spec.blocks: a list of Slack blocks"),
        (
            {"channel": "#general", "text": "hi"},
            "spec.text: relaysh/slack-step-message-send takes no such field",
        ),
        ({"channel": "#general", "message": "hi", "username": 3}, "spec.username: must be text."),
    ],
)
def test_a_bad_spec_fails_the_step_and_posts_nothing(slack, alice, spec, message):
    done = send(alice, **spec).start()
    assert not done.success and message in done.message
    assert slack.received == []


def test_the_connection_must_be_a_slack_one(slack, alice):
    PuppetConnection.create_with_token(owner=alice, name="prod")
    puppet = Step(
        SEND, {"connection": Connection("puppet", "prod"), "channel": "#general", "message": "hi"}, alice.pk
    )
    assert "spec.connection: give a slack connection" in puppet.start().message
    forged = Step(
        SEND, {"connection": {"apiToken": f"{TOKEN}\r\nX-Other: 1"}, "channel": "c", "message": "m"}, alice.pk
    )
    assert forged.start().message == "spec.connection: its apiToken is not a Slack token."
    assert slack.received == []


def test_a_long_message_is_cut_where_slack_would_cut_it(slack, alice):
    assert send(alice, channel="#general", message="x" * 50_000).start().success
    [posted] = slack.posted()
    assert len(posted["text"]) == 40_000 and posted["text"].endswith("…")


def test_slack_s_api_is_reached_only_over_https_at_public_addresses(slack, alice, settings):
    settings.SLACK_API_ALLOW_LOOPBACK = False  # as in production: the stand-in is on loopback
    done = send(alice, channel="#general", message="hi").start()
    assert not done.success
    assert done.message == "Slack was not called: localhost resolves to 127.0.0.1, a loopback address."
    settings.SLACK_API_URL = f"http://localhost:{slack.port}/api"
    done = send(alice, channel="#general", message="hi").start()
    assert not done.success and done.message == "SLACK_API_URL must start with https://."
    assert slack.received == []


def test_an_answer_that_is_not_slack_s_is_not_followed_nor_repeated(slack, alice):
    slack.answers = [
        (302, b"", {"Location": "https://169.254.169.254/latest/meta-data/"}),
        (200, b"<html>internal admin page: secret=hunter2</html>", {}),
        (
            200,
            b'{"ok": false, "error": "<!channel> see http://evil.example"}',
            {"Content-Type": "application/json"},
        ),
    ]
    first = send(alice, channel="#general", message="hi").start()
    assert first.message == "Slack answered 302 (Found), not as its Web API does."
    second = send(alice, channel="#general", message="hi").start()
    assert not second.success and "hunter2" not in second.message
    third = send(alice, channel="#general", message="hi").start()
    assert third.message == "Slack refused the message: no error code."
    assert len(slack.received) == 3  # the redirect was not followed


def test_the_token_is_nowhere_in_what_the_step_says_or_logs(slack, alice, caplog):
    caplog.set_level(logging.DEBUG)
    slack.answers = [429]
    step = send(alice, channel="#general", message="hi")
    step.until_done(timeout=10)
    send(alice, channel="#nowhere", message="hi").start()
    assert "chat.postMessage" in caplog.text  # urllib3's request lines were captured
    for outcome in step.outcomes:
        assert TOKEN not in repr(outcome)
    assert TOKEN not in caplog.text
