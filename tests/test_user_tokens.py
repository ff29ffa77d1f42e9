"""User API tokens (`rlyu_…`): stored as digests, shown once, for the user endpoints only."""

import importlib
import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection as db_connection
from django.test import Client
from rest_framework.test import APIClient

from relay import tokens
from relay.models import UserToken
from tests.conftest import api_token_for, bridge
from tests.events_helpers import post
from tests.test_admin import shown_token
from tests.test_connection_api import assert_problem
from tests.test_vault import dump_every_table
from triggers.models import Trigger

URL = "/api/connections/puppet/"


def client(header: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=header)
    return api


def test_a_user_token_is_kept_as_a_digest_and_works_as_token_or_bearer(alice):
    token = api_token_for(alice)
    assert re.fullmatch(r"rlyu_[0-9A-Za-z]{61}", token) and tokens.LEAK_RE.fullmatch(token)
    dump = dump_every_table()
    assert token[5:17] in dump and token not in dump and token[17:-6] not in dump
    for scheme in ("Token", "Bearer", "token", "bearer"):
        response = client(f"{scheme} {token}").get(URL)
        assert response.status_code == 200, (scheme, response.content)


def test_a_user_token_never_opens_a_machine_endpoint(alice):
    token = api_token_for(alice)
    assert_problem(client(f"Bearer {token}").get("/_puppet/runs"), 401)
    assert post(token, b"host: x\nstatus: changed\n", basic=False).status_code == 401
    assert post(token, b"host: x\nstatus: changed\n", basic=True).status_code == 401


def test_connection_and_trigger_tokens_never_open_user_endpoints(alice, connection, bao):
    _, connection_token = connection
    _, trigger_token = Trigger.create_with_token(owner=alice, name="t")
    for token in (connection_token, str(trigger_token)):
        for scheme in ("Token", "Bearer"):
            assert_problem(client(f"{scheme} {token}").get(URL), 401)


def test_a_revoked_or_wrong_token_is_401_like_an_unknown_one(alice):
    token = api_token_for(alice)
    wrong_secret = token[:17] + tokens.generate("rlyu")[17:]  # the right lookup, a valid checksum
    assert UserToken.for_token(wrong_secret) is None
    unknown = client(f"Token {tokens.generate('rlyu')}").get(URL)
    wrong = client(f"Token {wrong_secret}").get(URL)
    assert (wrong.status_code, wrong.json()["detail"]) == (unknown.status_code, unknown.json()["detail"])
    assert unknown.status_code == 401
    UserToken.objects.get(token_lookup=token[5:17]).revoke()
    assert_problem(client(f"Token {token}").get(URL), 401)


def test_a_deactivated_user_s_token_is_refused(alice):
    token = api_token_for(alice)
    alice.is_active = False
    alice.save()
    assert_problem(client(f"Token {token}").get(URL), 401)


def test_a_user_may_hold_several_tokens_and_revoke_one(alice):
    first, second = api_token_for(alice), api_token_for(alice)
    UserToken.objects.get(token_lookup=first[5:17]).revoke()
    assert client(f"Token {first}").get(URL).status_code == 401
    assert client(f"Token {second}").get(URL).status_code == 200
    row = UserToken.objects.get(token_lookup=second[5:17])
    assert row.last_used is not None and second not in repr(row) and second not in str(row)


def test_the_command_prints_the_token_alone_on_its_last_line(alice):
    out = io.StringIO()
    call_command("create_user_token", "alice", "--name", "ci", stdout=out)
    token = out.getvalue().splitlines()[-1]
    assert re.fullmatch(r"rlyu_[0-9A-Za-z]{61}", token)
    assert UserToken.objects.get(token_lookup=token[5:17]).name == "ci"
    assert client(f"Token {token}").get(URL).status_code == 200
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("create_user_token", "nobody", stdout=io.StringIO())


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def test_the_admin_makes_a_token_and_shows_it_once(admin_client, alice):
    page = admin_client.post("/admin/relay/usertoken/add/", {"owner": alice.pk, "name": "laptop"})
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    token = shown_token(page)
    assert token.startswith("rlyu_")
    assert client(f"Token {token}").get(URL).status_code == 200
    listing = admin_client.get("/admin/relay/usertoken/").content.decode()
    row = UserToken.objects.get()
    assert row.token_prefix in listing and token not in listing
    assert token not in admin_client.get(f"/admin/relay/usertoken/{row.pk}/change/").content.decode()
    admin_client.post(f"/admin/relay/usertoken/{row.pk}/delete/", {"post": "yes"})
    assert_problem(client(f"Token {token}").get(URL), 401)


def test_staff_without_superuser_make_tokens_only_for_themselves(alice):
    from django.contrib.auth.models import Permission

    carol = User.objects.create_user("carol", is_staff=True)
    carol.user_permissions.set(Permission.objects.filter(codename__endswith="_usertoken"))
    admin = Client()
    admin.force_login(carol)
    refused = admin.post("/admin/relay/usertoken/add/", {"owner": alice.pk, "name": "alice-now"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert not UserToken.objects.filter(owner=alice).exists()
    own = admin.post("/admin/relay/usertoken/add/", {"owner": carol.pk, "name": "mine"})
    assert shown_token(own).startswith("rlyu_")


def test_no_admin_page_lists_drf_keys(admin_client):
    assert admin_client.get("/admin/authtoken/tokenproxy/").status_code == 404
    assert admin_client.get("/admin/authtoken/").status_code == 404
    assert "authtoken" not in admin_client.get("/admin/").content.decode()


def test_existing_drf_keys_are_digested_and_keep_working(alice, bob):
    # DRF's authtoken table as an older release left it, with two keys in the clear.
    keys = {
        alice: "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b",
        bob: "0123456789abcdef0123456789abcdef01234567",
    }
    with db_connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz NOT NULL,"
            " user_id integer NOT NULL UNIQUE REFERENCES auth_user (id))"
        )
        for user, key in keys.items():
            cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [key, user.pk])
    migration = importlib.import_module("relay.migrations.0002_drf_keys_to_user_tokens")
    from django.apps import apps

    with db_connection.schema_editor() as editor:
        migration.digest_drf_keys(apps, editor)

    assert "authtoken_token" not in db_connection.introspection.table_names()
    assert all(key not in dump_every_table() for key in keys.values())
    for user, key in keys.items():
        for scheme in ("Token", "Bearer"):
            assert client(f"{scheme} {key}").get(URL).status_code == 200
        assert UserToken.objects.get(owner=user).legacy
    assert_problem(client("Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4c").get(URL), 401)
    assert_problem(bridge(keys[alice]).get("/_puppet/runs"), 401)
