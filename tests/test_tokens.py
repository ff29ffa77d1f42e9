import math
import re

import pytest

from puppet_connection.models import PuppetConnection
from relay import tokens
from tests.conftest import bridge


def test_a_token_has_a_prefix_256_bits_and_a_checksum():
    token = tokens.generate("rlyp")
    assert re.fullmatch(r"rlyp_[0-9A-Za-z]{61}", token)
    assert tokens.SECRET_LENGTH * math.log2(62) >= 256
    assert tokens.LEAK_RE.fullmatch(token)
    assert tokens.parse(token, "rlyp").lookup == token[5:17]


def test_tokens_are_all_different():
    assert len({tokens.generate("rlyp") for _ in range(1000)}) == 1000


@pytest.mark.parametrize("position", range(5, 66))
def test_any_one_character_typo_fails_the_checksum(position):
    token = tokens.generate("rlyp")
    replacement = "a" if token[position] != "a" else "b"
    typo = token[:position] + replacement + token[position + 1 :]
    assert tokens.parse(typo, "rlyp") is None


def test_a_token_of_another_kind_is_not_parsed():
    assert tokens.parse(tokens.generate("rlyt"), "rlyp") is None
    assert tokens.parse("", "rlyp") is None
    assert tokens.parse("rlyp_short", "rlyp") is None


def test_repr_never_shows_the_token(connection):
    conn, token = connection
    assert token not in repr(tokens.PlainToken(token))
    assert token not in repr(conn)
    assert token not in str(conn)
    assert token not in repr(tokens.parse(token, "rlyp"))
    assert token not in repr(conn.__dict__)


def test_the_row_keeps_a_digest_of_the_current_pepper(connection):
    conn, token = connection
    assert conn.token_digest == tokens.digest(token, 1)
    assert conn.token_pepper_id == 1
    assert token not in conn.token_digest


def test_a_rotated_pepper_still_verifies_old_digests_and_re_signs_them(connection, settings):
    conn, token = connection
    settings.TOKEN_PEPPERS = {**settings.TOKEN_PEPPERS, 2: b"second-pepper-0123456789abcdefghijkl"}
    assert bridge(token).get("/_puppet/runs").status_code == 200
    conn.refresh_from_db()
    assert conn.token_pepper_id == 2
    assert conn.token_digest == tokens.digest(token, 2)

    settings.TOKEN_PEPPERS = {2: settings.TOKEN_PEPPERS[2]}  # pepper 1 retired
    assert bridge(token).get("/_puppet/runs").status_code == 200


def test_a_digest_whose_pepper_was_retired_no_longer_verifies(connection, settings):
    _conn, token = connection
    settings.TOKEN_PEPPERS = {2: b"second-pepper-0123456789abcdefghijkl"}
    assert PuppetConnection.for_token(token) is None
    assert bridge(token).get("/_puppet/runs").status_code == 401


def test_deleting_rows_of_other_models_keeps_django_s_fast_delete(db):
    # Django deletes related rows with one DELETE, without loading them, only when no delete
    # signal listens for their model: the Vault receiver must listen to token holders alone.
    from django.contrib.auth.models import Group, Permission, User
    from django.db import connection
    from django.db.models.signals import post_delete
    from django.test.utils import CaptureQueriesContext

    from triggers.models import Trigger

    assert post_delete.has_listeners(PuppetConnection) and post_delete.has_listeners(Trigger)
    group = Group.objects.create(name="ops")
    group.permissions.set(Permission.objects.all()[:20])
    User.objects.create_user("carol").groups.add(group)
    with CaptureQueriesContext(connection) as queries:
        Group.objects.filter(pk=group.pk).delete()
    loaded = [
        q["sql"] for q in queries if q["sql"].startswith("SELECT") and "auth_group_permissions" in q["sql"]
    ]
    assert loaded == []
    assert not post_delete.has_listeners(Permission.group_set.through)


def test_deleting_a_user_deletes_the_secrets_of_everything_they_own(
    alice, bao, django_capture_on_commit_callbacks
):
    from triggers.models import Trigger

    conn, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    trigger, _ = Trigger.create_with_token(owner=alice, name="prod")
    with django_capture_on_commit_callbacks(execute=True):
        alice.delete()
    assert bao.read(conn.vault_path) is None and bao.read(trigger.vault_path) is None
