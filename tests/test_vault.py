import logging
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection as db_connection
from django.db import transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from puppet_connection.models import PuppetConnection
from relay import vault
from relay.tasks import delete_orphan_secrets, reconcile_vault_secrets
from tests.conftest import bridge, client_for, point_vault_at, run_concurrently
from tests.test_connection_api import vault_keys
from triggers.models import Trigger

URL = "/api/connections/puppet/"
APP_POLICY = """
path "secret/data/relay/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/relay/*" { capabilities = ["read", "list", "update", "delete"] }
"""


def dump_every_table() -> str:
    """Every row of every table in the database, as text."""
    rows = []
    with db_connection.cursor() as cursor:
        for table in db_connection.introspection.table_names():
            cursor.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')
            rows += [row[0] for row in cursor.fetchall()]
    return "\n".join(rows)


def test_the_token_is_in_vault_and_nowhere_in_the_database_or_the_logs(alice_api, bao, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, hvac and urllib3 included
    caplog.set_level(logging.DEBUG, logger="django")  # Django's default config holds it at INFO
    with CaptureQueriesContext(db_connection):  # makes django.db.backends log every statement
        created = alice_api.post(URL, {"name": "prod"}, format="json").json()
        token = created["token"]
        bridge(token).get("/_puppet/runs")
        regenerated = alice_api.post(f"{URL}{created['id']}/regenerate/").json()["token"]
        bridge(regenerated).get("/_puppet/runs")
        bridge(token).get("/_puppet/runs")  # the old one, refused

    assert bao.read(f"relay/connections/puppet/{created['id']}") == {"token": regenerated}
    dump = dump_every_table()
    assert regenerated[5:17] in dump  # the lookup part is stored (so the dump is searchable)
    assert "SELECT" in caplog.text and "puppet_connection" in caplog.text  # logs were captured
    for plain in (token, regenerated):
        secret_part = plain[17:-6]
        assert plain not in dump and secret_part not in dump
        assert plain not in caplog.text and secret_part not in caplog.text


def test_vault_stopped_during_create_leaves_nothing_and_the_api_says_503(alice_api, own_bao):
    own_bao.stop()
    response = alice_api.post(URL, {"name": "prod"}, format="json")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert "unreachable" in response.json()["detail"]
    assert PuppetConnection.objects.count() == 0


def test_a_sealed_vault_is_a_503_and_no_row(alice_api, own_bao):
    own_bao.root().sys.seal()
    response = alice_api.post(URL, {"name": "prod"}, format="json")
    assert response.status_code == 503 and "sealed" in response.json()["detail"]
    assert PuppetConnection.objects.count() == 0


def test_a_vault_that_forbids_the_write_is_a_503_and_leaves_no_secret(alice_api, bao):
    read_only = bao.token_with_policy(
        "relay-read-only",
        'path "secret/data/relay/*" { capabilities = ["read"] }\n'
        'path "secret/metadata/relay/*" { capabilities = ["read", "list"] }\n',
    )
    point_vault_at(bao, read_only)
    before = bao.root().secrets.kv.v2.list_secrets("relay/connections/puppet/", mount_point="secret")
    response = alice_api.post(URL, {"name": "prod"}, format="json")
    assert response.status_code == 503 and "permission" in response.json()["detail"]
    assert PuppetConnection.objects.count() == 0
    after = bao.root().secrets.kv.v2.list_secrets("relay/connections/puppet/", mount_point="secret")
    assert after["data"]["keys"] == before["data"]["keys"]


def test_create_refuses_to_overwrite_an_existing_secret(alice, bao):
    # Check-and-set 0: a secret already at the connection's path is never replaced.
    conn = PuppetConnection(id=uuid.uuid4(), owner=alice, name="prod")
    bao.root().secrets.kv.v2.create_or_update_secret(
        conn.vault_path, {"token": "someone else's"}, mount_point="secret"
    )
    with pytest.raises(vault.VaultUnavailable, match="check-and-set"), transaction.atomic():
        conn.issue_token()
    assert not PuppetConnection.objects.filter(pk=conn.pk).exists()
    assert bao.read(conn.vault_path) == {"token": "someone else's"}


def test_a_vault_outage_does_not_stop_existing_tokens(own_bao, alice):
    _, token = PuppetConnection.create_with_token(owner=alice, name="on-own-bao")
    own_bao.stop()
    assert bridge(str(token)).get("/_puppet/runs").status_code == 200


def test_regenerate_during_an_outage_changes_nothing(alice_api, own_bao, alice):
    conn, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    own_bao.stop()
    response = alice_api.post(f"{URL}{conn.id}/regenerate/")
    assert response.status_code == 503
    assert bridge(str(token)).get("/_puppet/runs").status_code == 200
    conn.refresh_from_db()
    assert conn.token_regenerated_at is None


def test_delete_during_an_outage_revokes_at_once_and_the_reconciler_removes_the_secret_later(
    alice_api, alice, bao, django_capture_on_commit_callbacks
):
    conn, token = PuppetConnection.create_with_token(owner=alice, name="prod")
    settings.VAULT_ADDR = "http://127.0.0.1:1"  # Vault unreachable
    vault.reset()
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_api.delete(f"{URL}{conn.id}/").status_code == 204
    assert bridge(str(token)).get("/_puppet/runs").status_code == 401
    assert reconcile_vault_secrets() == 0  # Vault still down: skipped quietly

    point_vault_at(bao, bao.root().token)  # Vault is back
    assert bao.read(conn.vault_path) == {"token": token}
    assert delete_orphan_secrets(timezone.now()) == 0  # too young: may be a create in flight
    assert delete_orphan_secrets(timezone.now() + timedelta(minutes=11)) >= 1
    assert bao.read(conn.vault_path) is None


def test_the_reconciler_keeps_secrets_of_live_connections_and_foreign_keys(connection, bao):
    conn, token = connection
    bao.root().secrets.kv.v2.create_or_update_secret(
        "relay/connections/puppet/not-a-uuid", {"x": "y"}, mount_point="secret"
    )
    delete_orphan_secrets(timezone.now() + timedelta(days=1))
    assert bao.read(conn.vault_path) == {"token": token}
    assert bao.read("relay/connections/puppet/not-a-uuid") == {"x": "y"}


@pytest.mark.django_db(transaction=True)
def test_two_regenerates_at_once_leave_exactly_one_valid_token(bao):
    from django.contrib.auth.models import User

    alice = User.objects.create_user("alice")
    conn, first = PuppetConnection.create_with_token(owner=alice, name="prod")
    api = [client_for(alice) for _ in range(8)]
    responses = run_concurrently(8, lambda i: api[i].post(f"{URL}{conn.id}/regenerate/"))
    assert [r.status_code for r in responses] == [200] * 8
    issued = [r.json()["token"] for r in responses]
    valid = [t for t in [str(first), *issued] if PuppetConnection.for_token(t) is not None]
    assert len(valid) == 1
    assert bao.read(conn.vault_path) == {"token": valid[0]}


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_of_one_name_make_one_connection(bao):
    from django.contrib.auth.models import User

    alice = User.objects.create_user("alice")
    api = [client_for(alice) for _ in range(8)]
    responses = run_concurrently(8, lambda i: api[i].post(URL, {"name": "prod"}, format="json"))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [400] * 7
    assert PuppetConnection.objects.count() == 1


def test_a_short_lived_vault_token_is_renewed_before_it_expires(alice, bao):
    short = bao.token_with_policy("relay-app", APP_POLICY, ttl="4s", renewable=True)
    point_vault_at(bao, short)
    PuppetConnection.create_with_token(owner=alice, name="one")
    time.sleep(3)  # past two thirds of the TTL: the next call renews first
    PuppetConnection.create_with_token(owner=alice, name="two")
    time.sleep(2.5)  # past the original TTL
    PuppetConnection.create_with_token(owner=alice, name="three")
    assert PuppetConnection.objects.count() == 3


def test_approle_login_is_used_when_configured(alice, bao):
    root = bao.root()
    if "approle/" not in root.sys.list_auth_methods()["data"]:
        root.sys.enable_auth_method("approle")
    root.sys.create_or_update_policy("relay-app", APP_POLICY)
    root.auth.approle.create_or_update_approle("relay", token_policies=["relay-app"], token_ttl="1h")
    settings.VAULT_TOKEN = ""
    settings.VAULT_ROLE_ID = root.auth.approle.read_role_id("relay")["data"]["role_id"]
    settings.VAULT_SECRET_ID = root.auth.approle.generate_secret_id("relay")["data"]["secret_id"]
    vault.reset()
    conn, token = PuppetConnection.create_with_token(owner=alice, name="via-approle")
    assert bao.read(conn.vault_path) == {"token": token}


def test_a_wrong_approle_secret_is_a_clear_error(alice, bao):
    settings.VAULT_TOKEN = ""
    settings.VAULT_ROLE_ID = "no-such-role"
    settings.VAULT_SECRET_ID = "wrong"
    vault.reset()
    with pytest.raises(vault.VaultUnavailable):
        PuppetConnection.create_with_token(owner=alice, name="x")
    assert PuppetConnection.objects.count() == 0


def test_a_vault_outage_does_not_tell_api_users_where_vault_is(alice_api, own_bao, caplog):
    own_bao.stop()
    response = alice_api.post(URL, {"name": "prod"}, format="json")
    assert response.status_code == 503 and "unreachable" in response.json()["detail"]
    shown = response.content.decode()
    assert own_bao.addr not in shown and str(own_bao.port) not in shown and "127.0.0.1" not in shown
    assert own_bao.addr in caplog.text  # the operator's log says where


def deployment_tag(bao, path: str) -> dict | None:
    return bao.root().secrets.kv.v2.read_secret_metadata(path, mount_point="secret")["data"][
        "custom_metadata"
    ]


def test_secrets_are_tagged_with_the_deployment_and_keep_it_when_rewritten(alice, bao, settings):
    settings.RELAY_DEPLOYMENT_ID = "production"
    conn, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    trigger, _ = Trigger.create_with_token(owner=alice, name="prod")
    assert deployment_tag(bao, conn.vault_path) == {"relay_deployment": "production"}
    assert deployment_tag(bao, trigger.vault_path) == {"relay_deployment": "production"}
    conn.regenerate_token()
    assert deployment_tag(bao, conn.vault_path) == {"relay_deployment": "production"}


def test_a_secret_from_before_the_tags_is_tagged_when_it_is_next_written(alice, bao, settings):
    settings.RELAY_DEPLOYMENT_ID = "production"
    conn, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    bao.root().secrets.kv.v2.update_metadata(conn.vault_path, custom_metadata={}, mount_point="secret")
    conn.regenerate_token()
    assert deployment_tag(bao, conn.vault_path) == {"relay_deployment": "production"}


def test_the_reconciler_deletes_only_its_own_deployment_s_orphans(alice, bao, settings, caplog):
    # Production and staging share one Vault and one VAULT_PATH_PREFIX.
    settings.RELAY_DEPLOYMENT_ID = "production"
    production = [
        PuppetConnection.create_with_token(owner=alice, name="prod")[0],
        Trigger.create_with_token(owner=alice, name="prod")[0],
    ]
    settings.RELAY_DEPLOYMENT_ID = "staging"
    staging = [
        PuppetConnection.create_with_token(owner=alice, name="staging")[0],
        Trigger.create_with_token(owner=alice, name="staging")[0],
    ]
    untagged = f"relay/connections/puppet/{uuid.uuid4()}"  # written before deployments had tags
    bao.root().secrets.kv.v2.create_or_update_secret(untagged, {"token": "old"}, mount_point="secret")
    # Staging's database holds none of production's rows, and its own are gone (deleted
    # while Vault was down: the commit hooks that delete their secrets never ran).
    PuppetConnection.objects.all().delete()
    Trigger.objects.all().delete()

    assert delete_orphan_secrets(timezone.now() + timedelta(minutes=11)) >= 2
    for holder in staging:
        assert bao.read(holder.vault_path) is None
    for holder in production:
        assert bao.read(holder.vault_path) is not None
    assert bao.read(untagged) == {"token": "old"}
    assert f"{untagged} left alone: it has no deployment tag" in caplog.text


def test_without_a_deployment_id_the_reconciler_deletes_nothing(alice, bao, settings, caplog):
    conn, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    PuppetConnection.objects.all().delete()
    settings.RELAY_DEPLOYMENT_ID = ""
    assert delete_orphan_secrets(timezone.now() + timedelta(minutes=11)) == 0
    assert bao.read(conn.vault_path) is not None
    assert "RELAY_DEPLOYMENT_ID is not set" in caplog.text


def test_the_documented_policy_is_enough_for_everything_the_service_does(
    alice, bao, django_capture_on_commit_callbacks
):
    readme = (Path(__file__).resolve().parent.parent / "docs" / "production.md").read_text()
    documented = re.search(r"# relay.hcl\n(.*?)```", readme, re.S).group(1)
    assert re.sub(r"\s+", " ", documented).strip() == re.sub(r"\s+", " ", APP_POLICY).strip()
    point_vault_at(bao, bao.token_with_policy("relay-app", APP_POLICY))
    conn, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    conn.regenerate_token()
    trigger, _ = Trigger.create_with_token(owner=alice, name="prod")
    trigger.set_slack_webhook("https://hooks.slack.com/services/T000/B000/XXXXXXXX")
    assert deployment_tag(bao, trigger.vault_path) == {"relay_deployment": settings.RELAY_DEPLOYMENT_ID}
    Trigger.objects.filter(pk=trigger.pk).delete()  # its secret left for the reconciler
    assert delete_orphan_secrets(timezone.now() + timedelta(minutes=11)) >= 1
    assert bao.read(trigger.vault_path) is None
    with django_capture_on_commit_callbacks(execute=True):
        conn.delete()
    assert bao.read(conn.vault_path) is None


def test_a_secret_that_cannot_be_tagged_is_not_kept(alice_api, bao):
    # An older policy, without `update` on the metadata: the write works, the tag does not.
    old_policy = APP_POLICY.replace('"list", "update", "delete"', '"list", "delete"')
    point_vault_at(bao, bao.token_with_policy("relay-old", old_policy))
    before = vault_keys(bao)
    response = alice_api.post(URL, {"name": "prod"}, format="json")
    assert response.status_code == 503 and "permission" in response.json()["detail"]
    assert PuppetConnection.objects.count() == 0
    assert vault_keys(bao) == before
