import ipaddress
import socket
import subprocess
import sys

import pytest

from relay import egress
from relay.celery import app
from tests.events_helpers import big_report, fixture, post
from tests.settings import outside_env
from tests.slack_standin import SlackStandIn
from tests.test_connection_api import assert_problem
from triggers import services
from triggers.models import Event, Trigger
from triggers.slack import SlackError, post_message

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")
TRIGGERS = "/api/triggers/"


@pytest.fixture
def standin(tmp_path):
    """The stand-in, running, but not allowed: the service's own settings apply."""
    server = SlackStandIn(tmp_path)
    app.conf.task_always_eager = True  # the notification task runs here, when it is queued
    yield server
    app.conf.task_always_eager = False
    server.close()


@pytest.fixture
def slack(standin, settings):
    """The stand-in, allowed as the tests (only) may: see SlackStandIn.allow."""
    standin.allow(settings)
    return standin


def read(token: str, body: bytes, capture) -> Event:
    event_id = post(token, body).json()["id"]
    with capture(execute=True):
        services.process(event_id)
    return Event.objects.get(pk=event_id)


def hooked(owner, url: str, **filters) -> str:
    _, token = Trigger.create_with_token(
        owner=owner, name="t", secret={"slack_webhook_url": url}, has_slack_webhook=True, **filters
    )
    return str(token)


def test_a_match_posts_a_short_message_to_slack(alice, slack, django_capture_on_commit_callbacks):
    token = hooked(alice, slack.url, resource_types=["Exec"])
    event = read(token, REPORT, django_capture_on_commit_callbacks)
    assert event.state == "matched" and event.notification == "sent" and event.notified_at
    [message] = slack.received
    assert message["path"] == "/services/T000/B000/XXXX" and message["type"] == "application/json"
    # Connected to the checked address, yet TLS and Host were for the name.
    assert message["host"] == f"localhost:{slack.port}"
    text = message["json"]["text"]
    assert "*Puppet changed* on `example-host` in `production`" in text
    assert "Exec[example-command1]: 1 change(s)" in text
    assert f"/events/{event.pk}/" in text
    assert text.count("• ") <= 10


def test_a_filtered_report_sends_nothing(alice, slack, django_capture_on_commit_callbacks):
    token = hooked(alice, slack.url, environments=["staging"])
    event = read(token, REPORT, django_capture_on_commit_callbacks)
    assert event.state == "filtered" and event.notification == ""
    assert slack.received == []


def test_transient_failures_are_retried_and_the_outcome_recorded(
    alice, slack, django_capture_on_commit_callbacks
):
    slack.answers = [500, 429]
    event = read(hooked(alice, slack.url), REPORT, django_capture_on_commit_callbacks)
    assert len(slack.received) == 3  # 500, 429, then 200
    assert event.notification == "sent"


def test_a_permanent_failure_is_recorded_with_what_slack_said(
    alice, slack, django_capture_on_commit_callbacks
):
    slack.answers = [404]
    event = read(hooked(alice, slack.url), REPORT, django_capture_on_commit_callbacks)
    assert len(slack.received) == 1
    assert event.notification == "failed" and event.notification_detail == "Slack answered 404: no_service"


def test_the_outcome_never_repeats_what_another_server_answered(
    alice, slack, django_capture_on_commit_callbacks
):
    """A webhook pointed at some other server must not become a way to read its pages."""
    slack.answers = [(403, b"ami-id\ninstance-id\nAKIAIOSFODNN7EXAMPLE", {})]
    event = read(hooked(alice, slack.url), REPORT, django_capture_on_commit_callbacks)
    assert event.notification == "failed"
    assert event.notification_detail == "Slack answered 403: Forbidden"


def test_a_redirect_is_not_followed(alice, slack, django_capture_on_commit_callbacks):
    metadata = "http://169.254.169.254/latest/meta-data/"
    slack.answers = [(302, b"", {"Location": metadata}), (307, b"", {"Location": slack.url})]
    event = read(hooked(alice, slack.url), REPORT, django_capture_on_commit_callbacks)
    assert len(slack.received) == 1
    assert event.notification == "failed" and event.notification_detail == "Slack answered 302: Found"


def test_an_unreachable_slack_is_transient(slack):
    with pytest.raises(SlackError) as caught:
        post_message("https://localhost:1/hook", {"text": "x"})
    assert caught.value.transient


def test_a_certificate_for_another_name_is_refused(slack, settings, monkeypatch):
    """The socket goes to the checked address, but TLS still verifies the name. (No DNS
    server can run here: the resolver answers for the name itself.)"""
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: real("127.0.0.1" if host == "hooks.test" else host, *a, **k),
    )
    settings.SLACK_WEBHOOK_HOSTS = [
        "hooks.test"
    ]  # resolves to the stand-in, whose certificate is for localhost
    with pytest.raises(SlackError, match="SSLError"):
        post_message(f"https://hooks.test:{slack.port}/hook", {"text": "x"})
    assert slack.received == []


# What may be saved.


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://hooks.slack.com/services/T000/B000/XXXX", "https://"),
        ("ftp://hooks.slack.com/services/T000/B000/XXXX", "https://"),
        ("https://hooks.slack.com.evil.example/services/T000", "hooks.slack.com"),
        ("https://evil.example/services/T000/B000/XXXX", "hooks.slack.com"),
        ("https://hooks.slack.com@127.0.0.1/services/T000", "hooks.slack.com"),
        ("https://127.0.0.1:8200/v1/secret/data/relay", "hooks.slack.com"),
        ("https://169.254.169.254/latest/meta-data/", "hooks.slack.com"),
    ],
)
def test_a_webhook_must_be_https_to_an_allowed_host(alice_api, url, why):
    problem = assert_problem(
        alice_api.post(TRIGGERS, {"name": "t", "slack_webhook_url": url}, format="json"), 400
    )
    assert (
        problem["errors"][-1]["pointer"] == "#/slack_webhook_url" and why in problem["errors"][-1]["detail"]
    )
    assert Trigger.objects.count() == 0


def test_a_changed_webhook_is_checked_too_and_the_allowed_hosts_are_a_setting(alice_api, bao, settings):
    hook = "https://hooks.slack.com/services/T000/B000/XXXX"
    created = alice_api.post(TRIGGERS, {"name": "t", "slack_webhook_url": hook}, format="json")
    assert created.status_code == 201, created.content
    url = f"{TRIGGERS}{created.json()['id']}/"
    refused = alice_api.patch(url, {"slack_webhook_url": "https://chat.example.com/hook"}, format="json")
    assert assert_problem(refused, 400)["errors"][0]["pointer"] == "#/slack_webhook_url"
    assert bao.read(f"relay/triggers/{created.json()['id']}")["slack_webhook_url"] == hook

    settings.SLACK_WEBHOOK_HOSTS = ["hooks.slack.com", "chat.example.com"]
    changed = alice_api.patch(url, {"slack_webhook_url": "https://chat.example.com/hook"}, format="json")
    assert changed.status_code == 200, changed.content


# What may be connected to: checked again before every post, on the address connected to.


def test_a_webhook_saved_before_the_rule_is_not_called(alice, standin, django_capture_on_commit_callbacks):
    event = read(
        hooked(alice, "http://127.0.0.1:8200/v1/sys/health"), REPORT, django_capture_on_commit_callbacks
    )
    assert event.notification == "failed"
    assert (
        event.notification_detail
        == "The webhook URL is refused: A Slack webhook URL must start with https://."
    )


def test_an_allowed_host_that_resolves_to_loopback_is_refused_when_connecting(
    alice, standin, settings, django_capture_on_commit_callbacks
):
    """An allowed name is no pass: `localhost` is allowed here, with the stand-in's CA, and
    still the service does not connect, because it resolves to a loopback address."""
    settings.SLACK_WEBHOOK_HOSTS = ["hooks.slack.com", "localhost"]
    settings.SLACK_CA_BUNDLE = str(standin.ca)
    event = read(hooked(alice, standin.url), REPORT, django_capture_on_commit_callbacks)
    assert standin.received == []
    assert event.notification == "failed"  # at once: no retry for a refused address
    assert event.notification_detail == (
        "The webhook was not called: localhost resolves to 127.0.0.1, a loopback address."
    )


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.20.30.40", "private"),
        ("192.168.1.1", "private"),
        ("[::ffff:169.254.169.254]", "link-local"),
        ("[::ffff:7f00:1]", "loopback"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_no_post_goes_to_an_address_that_is_not_public(settings, host, why):
    settings.SLACK_WEBHOOK_HOSTS = [host.strip("[]")]
    settings.SLACK_TIMEOUT = 2  # were a connection tried, it would fail fast
    with pytest.raises(SlackError) as caught:
        post_message(f"https://{host}/services/T000/B000/XXXX", {"text": "x"})
    assert not caught.value.transient
    assert str(caught.value).startswith("The webhook was not called:") and why in str(caught.value)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.45.6.7", "a loopback address"),
        ("::1", "a loopback address"),
        ("169.254.169.254", "a link-local address"),  # AWS, GCP, Azure metadata
        ("fe80::1", "a link-local address"),
        ("fd00:ec2::254", "a private address"),  # AWS metadata over IPv6
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.0.1", "a private address"),
        ("fc00::1", "a private address"),
        ("100.100.100.200", "not a public address"),  # Alibaba metadata, carrier-grade NAT
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("::ffff:10.0.0.1", "a private address"),
        ("2002:a9fe:a9fe::1", "a link-local address (inside 2002:a9fe:a9fe::1)"),  # 6to4
        ("64:ff9b::7f00:1", "a loopback address (inside 64:ff9b::7f00:1)"),  # NAT64
    ],
)
def test_addresses_outside_the_public_internet_are_forbidden(address, why):
    assert egress.why_forbidden(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize("address", ["8.8.8.8", "3.5.140.2", "2606:4700:4700::1111", "2a00:1450:4001::1"])
def test_public_addresses_are_allowed(address):
    assert egress.why_forbidden(ipaddress.ip_address(address)) is None


def test_loopback_is_allowed_only_when_asked_and_nothing_else():
    assert egress.why_forbidden(ipaddress.ip_address("127.0.0.1"), allow_loopback=True) is None
    assert egress.why_forbidden(ipaddress.ip_address("::ffff:127.0.0.1"), allow_loopback=True) is None
    assert egress.why_forbidden(ipaddress.ip_address("10.0.0.1"), allow_loopback=True) == "a private address"
    with pytest.raises(egress.ForbiddenAddress) as caught:
        egress.public_addresses("localhost", 443)
    assert str(caught.value) == "localhost resolves to 127.0.0.1, a loopback address"


def test_the_name_is_resolved_once_and_the_checked_address_is_the_one_connected_to(slack, monkeypatch):
    """DNS rebinding: a name that answers a harmless address to the check and a private one
    to the connect. No DNS server can run here, so the resolver itself answers: `localhost`
    first, then 10.0.0.1 (a second lookup would take the post there, and fail)."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        if host != "localhost":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        return real("127.0.0.1" if len(lookups) == 1 else "10.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    post_message(slack.url, {"text": "x"})
    assert lookups == ["localhost"] and len(slack.received) == 1


# What a report may say.


def test_a_report_cannot_mention_everyone_or_inject_links(
    alice, slack, settings, django_capture_on_commit_callbacks
):
    host = "<!channel> & <http://evil.example|click> @channel"
    title = "<!here|here><http://evil.example/login|Log in again>"
    report = (
        big_report(1, host=f"'{host}'")
        .replace(b"/srv/www/0.html", title.encode())
        .replace(b"environment: production", b"environment: '<@U0123ABCD>'")
    )
    event = read(hooked(alice, slack.url), report, django_capture_on_commit_callbacks)
    assert event.notification == "sent", event.notification_detail
    [message] = slack.received
    text = message["json"]["text"]
    assert "`&lt;!channel&gt; &amp; &lt;http://evil.example|click&gt; @channel`" in text
    assert "File[&lt;!here|here&gt;&lt;http://evil.example/login|Log in again&gt;]" in text
    assert "in `&lt;@U0123ABCD&gt;`" in text
    # The one link is the service's own.
    assert text.count("<") == 1 and f"<{settings.RELAY_PUBLIC_URL}/api/triggers/" in text
    assert "link_names" not in message["json"]  # plain @channel stays text


def test_the_hosts_come_from_the_environment_and_the_test_allowances_cannot():
    """SLACK_WEBHOOK_HOSTS is a comma list; the loopback and CA allowances of the tests are
    not read from the environment, so no deployment turns them on by mistake."""
    show = (
        "from django.conf import settings as s;"
        " print(s.SLACK_WEBHOOK_HOSTS, s.SLACK_WEBHOOK_ALLOW_LOOPBACK, s.SLACK_CA_BUNDLE)"
    )
    env = outside_env(
        DJANGO_SETTINGS_MODULE="relay.settings",
        DEBUG="true",
        SLACK_WEBHOOK_HOSTS=" Hooks.Slack.com. , chat.example.com,",
        SLACK_WEBHOOK_ALLOW_LOOPBACK="true",
        SLACK_CA_BUNDLE="/tmp/evil-ca.pem",
    )
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {show}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "['hooks.slack.com', 'chat.example.com'] False None"
