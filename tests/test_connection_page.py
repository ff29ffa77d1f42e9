"""A Puppet connection's admin page (issue 20 §4): the bridge's last contact, what it calls
itself, its platform and backend beside the settings, and the bridge's configuration ready to
paste, filled with this service's URL and naming the token, never showing it. The
configuration is read by the real relay-bridge (relay_bridge.config), which then calls the
live service with it."""

import html
import re

import pytest
from django.test import Client
from django.utils import timezone
from relay_bridge import config
from relay_bridge.api import RelayClient

from inventory.models import Inventory, Node
from puppet_connection import setup
from puppet_connection.models import PuppetConnection
from relay.tokens import LEAK_RE


def page_of(user, conn: PuppetConnection) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/admin/puppet_connection/puppetconnection/{conn.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def pre(page: str, css_class: str) -> str:
    return html.unescape(re.search(rf'<pre class="{css_class}">(.*?)</pre>', page, re.S).group(1))


def test_before_any_bridge_calls_the_page_says_how_to_set_one_up(staff, settings):
    settings.RELAY_PUBLIC_URL = "https://relay.example.com"
    conn, _ = PuppetConnection.create_with_token(owner=staff, name="prod", backend="bolt")
    page = page_of(staff, conn)
    assert "No bridge has called with this connection's token yet." in page
    assert "unknown" not in page  # the settings not made say so, and how to make them
    placeholder = f"<the token of connection prod, {conn.token_prefix}…>"
    assert pre(page, "bridge-yaml") == (
        "# /etc/relay/bridge.yaml on the Puppet server, mode 0600 (relay-bridge reads it as root)\n"
        "relay_api_url: https://relay.example.com/\n"
        f'relay_connection_token: "{placeholder}"\n'
        "backend: bolt\n"
        "state_dir: /var/lib/relay-bridge\n"
    )
    assert pre(page, "module-class") == (
        "class { 'relay':\n"
        "  relay_api_url          => 'https://relay.example.com/',\n"
        f"  relay_connection_token => Sensitive('{placeholder}'),\n"
        "  backend                => 'bolt',\n"
        "}\n"
    )
    assert LEAK_RE.search(page) is None  # no token, of any kind


@pytest.mark.django_db(transaction=True)
def test_the_pasted_configuration_works_and_the_page_then_shows_the_bridge(
    staff, live_server, settings, tmp_path
):
    settings.RELAY_PUBLIC_URL = live_server.url
    conn, token = PuppetConnection.create_with_token(owner=staff, name="prod", platform="pe", puppetdb=True)
    pasted = tmp_path / "bridge.yaml"
    pasted.write_text(setup.bridge_yaml(conn).replace(setup.token_placeholder(conn), token))
    loaded = config.load(pasted, environ={})  # the bridge's own reader: every key is one it takes
    assert (loaded.relay_api_url, loaded.relay_connection_token) == (f"{live_server.url}/", token)
    assert loaded.backend is None and loaded.puppetdb_url == "https://puppetdb.example.com:8081"
    client = RelayClient(loaded.relay_api_url, loaded.relay_connection_token, "oss", "ssh")
    try:
        assert client.list_runs() == []
    finally:
        client.close()
    conn.refresh_from_db()
    assert conn.reported_agent.startswith("relay-bridge/")
    page = page_of(staff, conn)
    bridge = page[
        page.index('<table class="bridge">') : page.index("</table>", page.index('<table class="bridge">'))
    ]
    assert "<th>Last contact</th><td>" in bridge and " UTC</td>" in bridge
    assert f"<th>Bridge</th><td>relay-bridge {conn.reported_agent.split('/')[1]}</td>" in bridge
    assert "<th>Platform</th><td>set to Puppet Enterprise; the bridge says open source Puppet</td>" in bridge
    assert "<th>Backend</th><td>not set; the bridge says ssh</td>" in bridge
    assert "The bridge says it runs on open source Puppet" in page  # the model's warning
    assert LEAK_RE.search(page) is None


def test_the_shipped_agent_is_named_and_its_silence_on_the_platform_explained(staff):
    from tests.conftest import bridge, client_for

    conn, token = PuppetConnection.create_with_token(owner=staff, name="old")
    client = bridge(token)
    assert client.get("/_puppet/runs", HTTP_USER_AGENT="Ruby").status_code == 200
    page = page_of(staff, PuppetConnection.objects.get(pk=conn.pk))
    assert "<th>Bridge</th><td>Ruby (the shipped puppetlabs-relay agent, which reports no platform" in page
    assert "<th>Platform</th><td>not set; the bridge says nothing</td>" in page
    assert "Runs cannot be checked against a platform: set it above, or run relay-bridge" in page
    # A User-Agent that is no product name is not kept.
    client.get("/_puppet/runs", HTTP_USER_AGENT="<script>")
    assert PuppetConnection.objects.get(pk=conn.pk).reported_agent == "Ruby"
    # The API says it too.
    shown = client_for(staff).get(f"/api/connections/puppet/{conn.pk}/").json()
    assert (shown["reported_agent"], shown["reported_platform"]) == ("Ruby", "")


def test_the_page_shows_the_inventory_its_bridge_sent_or_that_there_is_none(staff):
    conn, _ = PuppetConnection.create_with_token(owner=staff, name="prod", backend="ssh", puppetdb=True)
    assert "No inventory yet: a bridge with <code>puppetdb_url</code>" in page_of(staff, conn)
    now = timezone.now()
    Inventory.objects.create(connection=conn, synced_at=now, last_nodes=2)
    for name in ("web-1", "web-2"):
        Node.objects.create(connection=conn, certname=name, seen_at=now, report_at=now)
    page = page_of(staff, conn)
    assert (
        f'<a href="/admin/inventory/node/?connection__id__exact={conn.pk}">2 nodes</a>, last synced ' in page
    )
    # Its link lists them.
    client = Client()
    client.force_login(staff)
    listed = client.get(f"/admin/inventory/node/?connection__id__exact={conn.pk}").content.decode()
    assert "web-1" in listed and "web-2" in listed
