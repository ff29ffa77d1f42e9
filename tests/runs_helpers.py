from datetime import timedelta

from django.utils import timezone

from tests.conftest import bridge

RUNS = "/_puppet/runs"


def soon(seconds: int = 45) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


def create_run(token: str, body: dict | None = None) -> dict:
    response = bridge(token).post(RUNS, body or {"scope": {"nodes": ["node-a.example.com"]}}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def accept(token: str, run_id: str, **body) -> object:
    return bridge(token).post(f"{RUNS}/{run_id}/accept", body or None, format="json")


def put_state(token: str, run_id: str, state: dict) -> object:
    return bridge(token).put(f"{RUNS}/{run_id}/state", state, format="json")
