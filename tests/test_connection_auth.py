import base64
from datetime import timedelta

import pytest
from django.db import connection as db_connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from puppet_connection.models import PuppetConnection
from relay import tokens
from tests.conftest import bridge

RUNS = "/_puppet/runs"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bearer_and_basic_both_authenticate(connection):
    _, token = connection
    assert bridge(token).get(RUNS).json() == {"runs": []}
    client = APIClient()
    # Puppet's http report processor sends reporturl's user:password as Basic; any user name.
    for user in ("any", "", "relay"):
        client.credentials(HTTP_AUTHORIZATION=basic(user, token))
        assert client.get(RUNS).status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"bearer   {token}  ")
    assert client.get(RUNS).status_code == 200


def _wrong_secret(token: str) -> str:
    """The right lookup part, a different secret, and a valid checksum."""
    head = token[:17] + ("A" if token[17] != "A" else "B") + token[18:-6]
    return head + tokens._checksum(head)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "Bearer rlyp_nonsense",
        "Bearer " + tokens.generate("rlyt"),  # a trigger token is not a connection token
        "Bearer " + tokens.generate("rlyp"),  # well formed, unknown
        "Basic",
        "Basic !!!not-base64!!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        "Token abc",
        "Digest username=x",
        "Bearer " + "x" * 5000,
        "Bearer r\u00e9sum\u00e9",
    ],
)
def test_malformed_or_unknown_authorization_is_401_never_500(connection, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get(RUNS)
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response["WWW-Authenticate"].startswith("Bearer realm=")
    assert response.json()["status"] == 401


def test_no_authorization_is_401_with_a_challenge():
    response = APIClient().get(RUNS)
    assert response.status_code == 401
    assert "Basic" in response["WWW-Authenticate"] and "Bearer" in response["WWW-Authenticate"]


def test_a_right_lookup_with_a_wrong_secret_looks_exactly_like_an_unknown_token(connection):
    _, token = connection
    wrong = bridge(_wrong_secret(token)).get(RUNS)
    unknown = bridge(tokens.generate("rlyp")).get(RUNS)
    assert tokens.parse(_wrong_secret(token), "rlyp").lookup == tokens.parse(token, "rlyp").lookup
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.content == unknown.content
    assert sorted(wrong.headers.items()) == sorted(unknown.headers.items())


def test_a_token_whose_owner_is_deactivated_is_refused(connection):
    conn, token = connection
    conn.owner.is_active = False
    conn.owner.save()
    assert bridge(token).get(RUNS).status_code == 401


def _updates(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith("UPDATE") and "puppet_connection" in q["sql"]]


def test_last_used_is_written_at_most_once_a_minute(connection):
    conn, token = connection
    client = bridge(token)
    with CaptureQueriesContext(db_connection) as first:
        client.get(RUNS)
    assert len(_updates(first.captured_queries)) == 1
    conn.refresh_from_db()
    used = conn.last_used
    assert used is not None

    with CaptureQueriesContext(db_connection) as more:
        for _ in range(5):
            assert client.get(RUNS).status_code == 200
    assert _updates(more.captured_queries) == []

    # A minute later (the clock is the stored value: move it back instead of waiting).
    PuppetConnection.objects.filter(pk=conn.pk).update(last_used=used - timedelta(seconds=61))
    with CaptureQueriesContext(db_connection) as later:
        client.get(RUNS)
    assert len(_updates(later.captured_queries)) == 1
    conn.refresh_from_db()
    assert conn.last_used > used - timedelta(seconds=1)
    assert conn.last_used <= timezone.now()
