"""How a trigger's sender is set up: the settings to paste, filled with this service's URL
(RELAY_PUBLIC_URL) and the trigger's name, never its token. The token was shown once, when
the trigger was made (or regenerated); the text names the one to use by its visible part
(`rlyt_<lookup>…`), so a reader with several can tell which. The workflow page shows these."""

import json
import shlex
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

from triggers.models import Trigger


def token_placeholder(trigger: Trigger) -> str:
    """What stands where the token goes: never a token, and plainly not one. The name is the
    document's (its length alone is checked), so each snippet quotes this as its language
    does, and a line break in it is written as `\\n`: the snippets are pasted, maybe by
    someone other than the owner who named it."""
    name = "".join(c if c.isprintable() else repr(c)[1:-1] for c in trigger.name)
    return f"<the token of trigger {name}, {trigger.token_prefix}…>"


def events_url() -> str:
    return f"{settings.RELAY_PUBLIC_URL}/api/events"


def report_processor_settings(trigger: Trigger) -> str:
    """puppetlabs-relay's report processor (`reports = relay`), which reads relay.yaml and sends
    the token as a Bearer header: the safe way."""
    return (
        "# puppet.conf on the Puppet server, [server] section\n"
        "reports = relay\n"
        "\n"
        "# /etc/puppetlabs/puppet/relay.yaml, readable by the puppet user only\n"
        "# (the module's class relay writes it from relay_api_url and relay_trigger_token)\n"
        f"relay_api_url: {settings.RELAY_PUBLIC_URL}/\n"
        f"relay_trigger_token: {json.dumps(token_placeholder(trigger), ensure_ascii=False)}\n"
    )


def http_processor_settings(trigger: Trigger) -> str:
    """Puppet's own `http` processor, which can send the token only in the URL (Basic)."""
    scheme, netloc, path, _, _ = urlsplit(events_url())
    with_credentials = urlunsplit((scheme, f"any:{token_placeholder(trigger)}@{netloc}", path, "", ""))
    return (
        "# puppet.conf on the Puppet server, [server] section\n"
        "reports = http\n"
        f"reporturl = {with_credentials}\n"
    )


def webhook_curl(trigger: Trigger) -> str:
    """A curl line that sends one event to a webhook trigger's URL."""
    return (
        f"export RELAY_TRIGGER_TOKEN={shlex.quote(token_placeholder(trigger))}\n"
        'curl --fail-with-body -X POST -H "Authorization: Bearer $RELAY_TRIGGER_TOKEN" \\\n'
        "  -H 'Content-Type: application/json' --data '{\"example\": \"event\"}' \\\n"
        f"  {trigger.webhook_url()}\n"
    )
