"""The connection family: each type resolves, for a workflow step, to what the published
step images read, with the token read from Vault when it is resolved."""

from urllib.parse import urljoin

import pytest
from django.core.management import call_command

from connections.models import ConnectionSecretMissing, SlackConnection
from connections.services import connection_types, resolve_connection
from puppet_connection.models import PuppetConnection
from relay import vault
from tests.conftest import bridge

SLACK_TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"


def test_the_types_are_puppet_and_slack():
    assert connection_types() == {"puppet": PuppetConnection, "slack": SlackConnection}


def test_puppet_resolves_to_the_public_url_and_the_token_from_vault(alice, bao, settings):
    settings.RELAY_PUBLIC_URL = "https://relay.example.com/relay"
    connection, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    data = resolve_connection(alice.pk, "puppet", "prod")
    assert data == {"relayAPIURL": "https://relay.example.com/relay/", "token": str(token)}
    # The published steps join their paths to it: the service's path must survive.
    assert urljoin(data["relayAPIURL"], "_puppet/runs") == "https://relay.example.com/relay/_puppet/runs"
    assert str(token) not in repr(data)

    # Read when resolved: a regenerated token is the one a step sees next.
    new = connection.regenerate_token()
    seen = resolve_connection(alice.pk, "puppet", "prod")["token"]
    assert seen == str(new) and bridge(seen).get("/_puppet/runs").status_code == 200


def test_slack_resolves_to_the_api_token_the_published_step_reads(alice, bao):
    connection = SlackConnection.create_with_token(owner=alice, name="team", token=SLACK_TOKEN)
    data = resolve_connection(alice.pk, "slack", "team")
    assert data == {"apiToken": SLACK_TOKEN} and SLACK_TOKEN not in repr(data)
    connection.save_with_token("xoxb-9-9-replaced")
    assert resolve_connection(alice.pk, "slack", "team") == {"apiToken": "xoxb-9-9-replaced"}


def test_unknown_types_names_and_other_owners_resolve_to_none(alice, bob, bao):
    PuppetConnection.create_with_token(owner=alice, name="prod")
    SlackConnection.create_with_token(owner=alice, name="team", token=SLACK_TOKEN)
    assert resolve_connection(alice.pk, "github", "prod") is None
    assert resolve_connection(alice.pk, "puppet", "team") is None  # a name of the other type
    assert resolve_connection(alice.pk, "slack", "prod") is None
    assert resolve_connection(bob.pk, "puppet", "prod") is None
    assert resolve_connection(bob.pk, "slack", "team") is None


def test_a_secret_gone_from_vault_is_a_clear_error(alice, bao):
    connection = SlackConnection.create_with_token(owner=alice, name="team", token=SLACK_TOKEN)
    vault.delete(connection.vault_path)
    with pytest.raises(ConnectionSecretMissing, match="slack connection 'team' has no token in Vault"):
        resolve_connection(alice.pk, "slack", "team")


def test_vault_down_is_vault_unavailable_for_the_engine_to_retry(alice, own_bao):
    PuppetConnection.create_with_token(owner=alice, name="prod")
    own_bao.stop()
    with pytest.raises(vault.VaultUnavailable, match="unreachable"):
        resolve_connection(alice.pk, "puppet", "prod")


def test_the_models_and_their_migrations_agree(db):
    # The puppet connection moved onto the family's base with no migration of its own: its
    # table, constraint and reverse name are as existing databases have them.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
