import pytest
from django.test import Client

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.runs_helpers import accept, create_run, put_state, soon

LIST = "/admin/runs/run/"


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def test_staff_see_every_connections_runs_and_filter_them(admin_client, connection, bob):
    _, token = connection
    _, bob_token = PuppetConnection.create_with_token(owner=bob, name="bobs")
    mine = create_run(token)
    theirs = create_run(str(bob_token))
    accept(str(bob_token), theirs["id"])
    page = admin_client.get(LIST).content.decode()
    assert mine["id"] in page and theirs["id"] in page
    pending_only = admin_client.get(LIST, {"status__exact": "pending"}).content.decode()
    assert mine["id"] in pending_only and theirs["id"] not in pending_only


def test_the_run_page_shows_every_transition_and_its_token(admin_client, connection):
    conn, token = connection
    run = create_run(token)
    accept(token, run["id"])
    put_state(token, run["id"], {"status": "in-progress", "next_update_before": soon()})
    page = admin_client.get(f"{LIST}{run['id']}/change/").content.decode()
    assert page.count(conn.token_prefix) >= 2
    assert "in-progress" in page and "accepted" in page
    assert token not in page


def test_staff_can_cancel_runs_from_the_admin(admin_client, connection):
    _, token = connection
    pending, held = create_run(token), create_run(token)
    accept(token, held["id"])
    response = admin_client.post(
        LIST, {"action": "cancel_runs", "_selected_action": [pending["id"], held["id"]]}, follow=True
    )
    assert "Cancelled or asked to stop: 2" in response.content.decode()
    assert Run.objects.get(pk=pending["id"]).outcome == "cancelled"
    assert Run.objects.get(pk=held["id"]).cancel_requested is True
    assert Run.objects.get(pk=held["id"]).transitions.last().token_prefix == "staff:root"


def test_the_schema_describes_the_runs_api(client):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]
    for path in (
        "/_puppet/runs",
        "/_puppet/runs/{id}/accept",
        "/_puppet/runs/{id}/state",
        "/_puppet/runs/{id}/cancel",
    ):
        assert path in paths, sorted(paths)
