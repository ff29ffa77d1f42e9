"""Heartbeats answered on the event loop (runs/api/fast.py) against the live server, which
serves them as production does: the same answers as the API's view, the same refusals."""

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.api import fast
from runs.api.serializers import StateSerializer
from runs.models import Run, Status, heartbeat_rule
from tests.conftest import bridge


@pytest.fixture
def held(live_server):
    owner = User.objects.create_user("ops")
    conn, token = PuppetConnection.create_with_token(owner=owner, name="dc")
    run = Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    lease = uuid.uuid4()
    run.accept(lease, conn.token_prefix)
    Run.objects.filter(pk=run.pk).update(status=Status.IN_PROGRESS)
    return live_server.url, conn, str(token), run, lease


def due() -> str:
    return (datetime.now(UTC) + timedelta(seconds=45)).isoformat()


def beat(url: str, token: str, run: Run, **extra) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}", "Accept": "*/*", **extra.pop("headers", {})}
    body = {"status": "in-progress", "next_update_before": due(), "job_id": "81", **extra}
    return requests.put(f"{url}/_puppet/runs/{run.id}/state", json=body, headers=headers, timeout=10)


def test_a_heartbeat_is_answered_on_the_loop_as_the_api_answers_it(held):
    url, _, token, run, lease = held
    beat(url, token, run)  # the first marks the token used, through the API
    served = fast.served
    response = beat(url, token, run, lease_id=str(lease))
    assert fast.served == served + 1
    assert response.status_code == 202
    state = response.json()
    run.refresh_from_db()
    assert state == run.state and state["status"] == "in-progress" and state["job_id"] == "81"
    # The API's own answer to the same PUT (the test client does not take the fast path).
    api = bridge(token).put(
        f"/_puppet/runs/{run.id}/state",
        {"status": "in-progress", "next_update_before": due(), "job_id": "81"},
        format="json",
    )
    for name in (
        "Content-Type",
        "Allow",
        "Vary",
        "X-Frame-Options",
        "X-Content-Type-Options",
        "Referrer-Policy",
    ):
        assert response.headers[name] == api.headers[name], name


def test_the_fast_answer_carries_a_requested_cancel(held):
    url, conn, token, run, _ = held
    beat(url, token, run)
    run.cancel(conn.token_prefix)
    served = fast.served
    assert beat(url, token, run).json()["cancel_requested"] is True
    assert fast.served == served + 1


def test_another_lease_is_409_and_a_complete_run_409(held):
    url, _, token, run, _ = held
    beat(url, token, run)
    response = beat(url, token, run, lease_id=str(uuid.uuid4()))
    assert response.status_code == 409 and "lease" in response.json()["detail"]
    Run.objects.filter(pk=run.pk).update(status=Status.COMPLETE, outcome="finished")
    assert beat(url, token, run).status_code == 409


def test_a_regenerated_token_or_an_inactive_owner_is_401_at_once(held):
    url, conn, token, run, _ = held
    assert beat(url, token, run).status_code == 202
    assert beat(url, token, run).status_code == 202  # now known to the fast path
    new = conn.regenerate_token()
    assert beat(url, token, run).status_code == 401
    assert beat(url, str(new), run).status_code == 202
    User.objects.filter(pk=conn.owner_id).update(is_active=False)
    assert beat(url, str(new), run).status_code == 401


def test_a_new_platform_header_is_recorded(held):
    url, conn, token, run, _ = held
    beat(url, token, run)
    assert beat(url, token, run, headers={"X-Relay-Platform": "oss"}).status_code == 202
    conn.refresh_from_db()
    assert conn.reported_platform == "oss"


def test_a_heartbeat_for_another_connections_run_is_404(held):
    url, conn, _, run, _ = held
    _, other_token = PuppetConnection.create_with_token(owner=conn.owner, name="other")
    beat(url, str(other_token), run)
    response = beat(url, str(other_token), run)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"


def test_a_host_not_allowed_is_djangos_400_not_a_500(held):
    url, _, token, run, _ = held
    beat(url, token, run)
    served = fast.served
    response = beat(url, token, run, headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/problem+json"
    assert fast.served == served


BODIES = [
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": "81"},
    {"status": "in-progress", "next_update_before": "in 45 s"},
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": "  81  ", "lease_id": None},
    {
        "status": "in-progress",
        "next_update_before": "in 45 s",
        "lease_id": "6f1c2b0e-64d4-4b5e-9f1e-0c6f0e4b9a11",
    },
    {
        "status": "in-progress",
        "next_update_before": "in 45 s",
        "lease_id": "6F1C2B0E64D44B5E9F1E0C6F0E4B9A11",
    },
    {"status": "in-progress", "next_update_before": "2099-01-01T00:00:00"},  # too far ahead
    {"status": "in-progress", "next_update_before": "2001-01-01T00:00:00Z"},  # past
    {"status": "in-progress", "next_update_before": "naive 45 s"},
    {"status": "in-progress", "next_update_before": "in 45 s +02:00"},
    {"status": "in-progress"},
    {"status": "in-progress", "next_update_before": "soon"},
    {"status": "in-progress", "next_update_before": 12},
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": 81},
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": "x" * 256},
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": None},
    {"status": "in-progress", "next_update_before": "in 45 s", "job_id": ""},
    {"status": "in-progress", "next_update_before": "in 45 s", "lease_id": "not-a-uuid"},
    {"status": "in-progress", "next_update_before": "in 45 s", "outcome": "finished"},
    {"status": "in-progress", "next_update_before": "in 45 s", "outcome": None},
    {"status": "pending"},
    {"status": "accepted", "job_id": "9"},
    {"status": "complete", "outcome": "finished"},
    {"status": "In-Progress", "next_update_before": "in 45 s"},
    {"status": None},
    {"status": 1},
    {"next_update_before": "in 45 s"},
    {"status": "pending", "run_results": None},
    {"status": "pending", "extra": 1},
]


def _body(template: dict) -> dict:
    """The template with its times made relative to now."""
    now = datetime.now(UTC)
    body = dict(template)
    due = body.get("next_update_before")
    if due == "in 45 s":
        body["next_update_before"] = (now + timedelta(seconds=45)).isoformat()
    elif due == "naive 45 s":
        body["next_update_before"] = (now + timedelta(seconds=45)).replace(tzinfo=None).isoformat()
    elif due == "in 45 s +02:00":
        body["next_update_before"] = (
            (now + timedelta(seconds=45)).astimezone(timezone(timedelta(hours=2))).isoformat()
        )
    return body


@pytest.mark.parametrize("template", BODIES)
def test_the_fast_validation_accepts_what_the_serializer_accepts_with_the_same_values_or_defers(template):
    body = _body(template)
    raw = json.dumps(body).encode()
    ours = fast.heartbeat_of(raw)
    theirs = StateSerializer(data=body)
    if ours is None:
        # Deferred to the API, which answers it in full; it must then be a body the fast
        # path has no business with: refused, or not a plain heartbeat.
        assert (
            not theirs.is_valid() or heartbeat_rule(theirs.validated_data) is None or set(body) - fast._PLAIN
        )
    else:
        assert theirs.is_valid(), theirs.errors
        assert ours == dict(theirs.validated_data)


def test_the_shipped_bridges_heartbeat_takes_the_fast_validation():
    body = _body({"status": "in-progress", "next_update_before": "in 45 s", "job_id": "81"})
    assert fast.heartbeat_of(json.dumps(body).encode()) is not None


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b"null",
        b'{"status": NaN}',
        b"\xff",
        b'{"status": "pending"',
        b'{"status": {"a": 1}}',
        b'"x"',
    ],
)
def test_a_body_that_is_no_flat_json_object_is_left_to_the_api(raw):
    assert fast.heartbeat_of(raw) is None


def test_a_pending_heartbeat_for_an_accepted_run_is_answered_on_the_loop(live_server):
    owner = User.objects.create_user("ops")
    conn, token = PuppetConnection.create_with_token(owner=owner, name="dc")
    run = Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    lease = uuid.uuid4()
    run.accept(lease, conn.token_prefix)
    url, token = live_server.url, str(token)
    body = {"status": "pending", "lease_id": str(lease)}
    headers = {"Authorization": f"Bearer {token}"}
    requests.put(f"{url}/_puppet/runs/{run.id}/state", json=body, headers=headers, timeout=10)
    served = fast.served
    response = requests.put(f"{url}/_puppet/runs/{run.id}/state", json=body, headers=headers, timeout=10)
    assert response.status_code == 202 and fast.served == served + 1
    run.refresh_from_db()
    assert run.status == Status.ACCEPTED and response.json() == run.state


def test_only_the_async_pool_commits_asynchronously(live_server):
    from django.db import connection

    from relay import adb

    async def setting() -> str:
        async with adb.pool().connection() as conn:
            return (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]

    assert asyncio.run_coroutine_threadsafe(setting(), adb._loop).result(timeout=10) == "off"
    with connection.cursor() as cursor:  # Django's: every transition, lease and outcome
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


@pytest.mark.django_db
def test_no_index_holds_a_column_a_heartbeat_writes_and_pages_keep_room():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [Run._meta.db_table])
        definitions = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Run._meta.db_table])
        options = cursor.fetchone()[0]
    assert definitions, "the table has its indexes"
    for definition in definitions:  # else heartbeats are no HOT updates
        for column in ("updated_at", "next_update_before", "job_id"):
            assert column not in definition, definition
    assert "fillfactor=80" in options
