import pytest

from relay.celery import app
from tests.events_helpers import fixture, post
from tests.slack_standin import SlackStandIn
from triggers import services
from triggers.models import Event, Trigger

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def slack():
    standin = SlackStandIn()
    app.conf.task_always_eager = True  # the notification task runs here, when it is queued
    yield standin
    app.conf.task_always_eager = False
    standin.close()


def read(token: str, body: bytes, capture) -> Event:
    event_id = post(token, body).json()["id"]
    with capture(execute=True):
        services.process(event_id)
    return Event.objects.get(pk=event_id)


def test_a_match_posts_a_short_message_to_slack(alice, slack, django_capture_on_commit_callbacks):
    _, token = Trigger.create_with_token(
        owner=alice,
        name="t",
        secret={"slack_webhook_url": slack.url},
        has_slack_webhook=True,
        resource_types=["Exec"],
    )
    event = read(str(token), REPORT, django_capture_on_commit_callbacks)
    assert event.state == "matched" and event.notification == "sent" and event.notified_at
    [message] = slack.received
    assert message["path"] == "/services/T000/B000/XXXX" and message["type"] == "application/json"
    text = message["json"]["text"]
    assert "*Puppet changed* on `example-host` in `production`" in text
    assert "Exec[example-command1]: 1 change(s)" in text
    assert f"/events/{event.pk}/" in text
    assert text.count("• ") <= 10


def test_a_filtered_report_sends_nothing(alice, slack, django_capture_on_commit_callbacks):
    _, token = Trigger.create_with_token(
        owner=alice,
        name="t",
        secret={"slack_webhook_url": slack.url},
        has_slack_webhook=True,
        environments=["staging"],
    )
    event = read(str(token), REPORT, django_capture_on_commit_callbacks)
    assert event.state == "filtered" and event.notification == ""
    assert slack.received == []


def test_transient_failures_are_retried_and_the_outcome_recorded(
    alice, slack, django_capture_on_commit_callbacks
):
    slack.answers = [500, 429]
    _, token = Trigger.create_with_token(
        owner=alice, name="t", secret={"slack_webhook_url": slack.url}, has_slack_webhook=True
    )
    event = read(str(token), REPORT, django_capture_on_commit_callbacks)
    assert len(slack.received) == 3  # 500, 429, then 200
    assert event.notification == "sent"


def test_a_permanent_failure_is_recorded_with_what_slack_said(
    alice, slack, django_capture_on_commit_callbacks
):
    slack.answers = [404]
    _, token = Trigger.create_with_token(
        owner=alice, name="t", secret={"slack_webhook_url": slack.url}, has_slack_webhook=True
    )
    event = read(str(token), REPORT, django_capture_on_commit_callbacks)
    assert len(slack.received) == 1
    assert event.notification == "failed" and "404: no_service" in event.notification_detail


def test_an_unreachable_slack_is_transient(alice):
    from triggers.slack import SlackError, post_message

    with pytest.raises(SlackError) as caught:
        post_message("http://127.0.0.1:1/hook", {"text": "x"})
    assert caught.value.transient
