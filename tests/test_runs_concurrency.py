"""Exactly-once accept, hammered from many database connections at once (PostgreSQL)."""

import pytest
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition
from tests.conftest import bridge, run_concurrently

CLIENTS = 48
RUNS = 12


@pytest.mark.django_db(transaction=True)
def test_each_run_is_accepted_exactly_once_by_48_concurrent_clients():
    owner = User.objects.create_user("alice")
    conn, token = PuppetConnection.create_with_token(owner=owner, name="prod")
    runs = [Run.create_for(conn, {"scope": {"nodes": ["a"]}}) for _ in range(RUNS)]
    clients = [bridge(str(token)) for _ in range(CLIENTS)]

    def accept_all(i: int) -> list[int]:
        # Each client walks the runs from its own starting point, so every run is contended.
        order = runs[i % RUNS :] + runs[: i % RUNS]
        return [clients[i].post(f"/_puppet/runs/{run.id}/accept").status_code for run in order]

    results = run_concurrently(CLIENTS, accept_all)
    assert not [r for r in results if isinstance(r, Exception)], results
    codes = [code for per_client in results for code in per_client]
    assert codes.count(202) == RUNS
    assert codes.count(409) == RUNS * (CLIENTS - 1)
    assert set(codes) == {202, 409}
    for run in runs:
        run.refresh_from_db()
        assert run.status == "accepted" and run.lease_id is not None
        assert RunTransition.objects.filter(run=run, to_status="accepted").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_heartbeats_and_a_completion_never_reopen_a_run():
    owner = User.objects.create_user("alice")
    conn, token = PuppetConnection.create_with_token(owner=owner, name="prod")
    run = Run.create_for(conn, {"scope": {"nodes": ["a"]}})
    client = bridge(str(token))
    assert client.post(f"/_puppet/runs/{run.id}/accept").status_code == 202
    clients = [bridge(str(token)) for _ in range(32)]

    def report(i: int) -> int:
        body = {"status": "complete", "outcome": "finished"} if i == 0 else {"status": "pending"}
        return clients[i].put(f"/_puppet/runs/{run.id}/state", body, format="json").status_code

    codes = run_concurrently(32, report)
    assert codes[0] == 202
    assert set(codes[1:]) <= {202, 409}  # heartbeats after the completion are conflicts
    run.refresh_from_db()
    assert run.status == "complete" and run.outcome == "finished"
