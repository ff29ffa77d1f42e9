"""Heartbeats answered on the event loop (runs/api/fast.py) against the live server, which
serves them as production does: the same answers as the API's view, the same refusals."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.api import fast
from runs.models import Run, Status
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
    assert conn.platform == "oss"


def test_a_heartbeat_for_another_connections_run_is_404(held):
    url, conn, _, run, _ = held
    _, other_token = PuppetConnection.create_with_token(owner=conn.owner, name="other")
    beat(url, str(other_token), run)
    response = beat(url, str(other_token), run)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"
