"""The `slack` connection: a bot token the user gives, kept in Vault only, never shown back."""

import logging
import sys
from datetime import timedelta

import pytest
from django.db import connection as db_connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.views.debug import ExceptionReporter
from rest_framework.test import APIClient

from connections.models import SlackConnection
from puppet_connection.models import PuppetConnection
from relay.tasks import delete_orphan_secrets
from tests.conftest import client_for
from tests.test_connection_api import assert_problem
from tests.test_vault import dump_every_table

URL = "/api/connections/slack/"
ADMIN = "/admin/connections/slackconnection/"
TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"
OTHER = "xoxb-3333333333-4444444444444-ZyXwVuTsRqPoNmLkJiHgFeDc"


def create(api: APIClient, name: str = "team", token: str = TOKEN, **more) -> dict:
    response = api.post(URL, {"name": name, "token": token, **more}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_create_keeps_the_token_in_vault_and_never_answers_it(alice_api, bao):
    body = create(alice_api, description="ops channel")
    assert TOKEN not in str(body) and "token" not in body
    assert body["name"] == "team" and body["owner"] == "alice" and body["description"] == "ops channel"
    assert body["token_replaced_at"] is None
    assert bao.read(f"relay/connections/slack/{body['id']}") == {"token": TOKEN}
    for page in (alice_api.get(URL), alice_api.get(f"{URL}{body['id']}/")):
        assert page.status_code == 200 and TOKEN not in page.content.decode()
    assert "token" not in alice_api.get(f"{URL}{body['id']}/").json()


def test_the_token_is_nowhere_in_the_database_the_logs_or_a_repr(alice_api, bao, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django")
    with CaptureQueriesContext(db_connection):
        body = create(alice_api)
        alice_api.patch(f"{URL}{body['id']}/", {"token": OTHER}, format="json")
        alice_api.post(URL, {"name": "bad", "token": TOKEN + "!"}, format="json")
    assert "slackconnection" in caplog.text  # the statements were logged
    dump = dump_every_table()
    for token in (TOKEN, OTHER):
        assert token not in dump and token not in caplog.text
    connection = SlackConnection.objects.get()
    assert OTHER not in repr(connection) and OTHER not in repr(vars(connection))
    assert OTHER not in repr(connection.step_data()) and connection.step_data() == {"apiToken": OTHER}


@pytest.mark.parametrize(
    ("body", "pointer", "code"),
    [
        ({"name": "team"}, "#/token", "required"),
        ({"name": "team", "token": ""}, "#/token", "blank"),
        ({"name": "team", "token": 12}, "#/token", "invalid"),
        ({"name": "team", "token": "not-a-slack-token"}, "#/token", "invalid"),
        ({"name": "team", "token": TOKEN + "\r\nX-Injected: 1"}, "#/token", "invalid"),
        ({"name": "team", "token": "xoxb-" + "a" * 600}, "#/token", "max_length"),
        ({"name": "has space", "token": TOKEN}, "#/name", "invalid"),
    ],
)
def test_bad_input_is_a_400_that_does_not_repeat_the_token(alice_api, bao, body, pointer, code):
    response = alice_api.post(URL, body, format="json")
    problem = assert_problem(response, 400)
    assert [(e["pointer"], e["code"]) for e in problem["errors"]] == [(pointer, code)]
    assert TOKEN not in response.content.decode() and "a" * 600 not in response.content.decode()
    assert SlackConnection.objects.count() == 0


def test_patch_replaces_the_token_and_a_rename_keeps_it(alice_api, bao):
    body = create(alice_api)
    path = f"{URL}{body['id']}/"
    renamed = alice_api.patch(path, {"name": "renamed"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["token_replaced_at"] is None
    assert bao.read(f"relay/connections/slack/{body['id']}") == {"token": TOKEN}

    replaced = alice_api.patch(path, {"token": OTHER, "description": "new"}, format="json")
    assert replaced.status_code == 200 and OTHER not in replaced.content.decode()
    assert replaced.json()["token_replaced_at"] and replaced.json()["description"] == "new"
    assert bao.read(f"relay/connections/slack/{body['id']}") == {"token": OTHER}
    assert_problem(alice_api.patch(path, {"token": "nope"}, format="json"), 400)
    assert bao.read(f"relay/connections/slack/{body['id']}") == {"token": OTHER}


def test_there_is_no_regenerate_the_token_is_the_user_s(alice_api, bao):
    body = create(alice_api)
    assert alice_api.post(f"{URL}{body['id']}/regenerate/").status_code == 404
    assert_problem(alice_api.put(f"{URL}{body['id']}/", {"token": OTHER}, format="json"), 405)


def test_vault_down_leaves_no_row_and_no_half_done_change(alice_api, alice, own_bao):
    kept = SlackConnection.create_with_token(owner=alice, name="kept", token=TOKEN)
    own_bao.stop()
    response = alice_api.post(URL, {"name": "team", "token": TOKEN}, format="json")
    assert_problem(response, 503)
    assert "unreachable" in response.json()["detail"]
    assert list(SlackConnection.objects.values_list("name", flat=True)) == ["kept"]
    change = alice_api.patch(f"{URL}{kept.id}/", {"name": "renamed", "token": OTHER}, format="json")
    assert_problem(change, 503)
    kept.refresh_from_db()
    assert kept.name == "kept" and kept.token_replaced_at is None


def test_delete_removes_the_secret(alice_api, bao, django_capture_on_commit_callbacks):
    body = create(alice_api)
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_api.delete(f"{URL}{body['id']}/").status_code == 204
    assert bao.read(f"relay/connections/slack/{body['id']}") is None


def test_the_reconciler_removes_a_slack_secret_left_behind(alice, bao):
    connection = SlackConnection.create_with_token(owner=alice, name="team", token=TOKEN)
    SlackConnection.objects.filter(pk=connection.pk).delete()  # a queryset delete: no commit hook ran
    assert bao.read(connection.vault_path) == {"token": TOKEN}
    assert delete_orphan_secrets(timezone.now() + timedelta(minutes=11)) >= 1
    assert bao.read(connection.vault_path) is None


def test_owners_staff_and_names(alice, bob, staff, bao):
    alice_api = client_for(alice)
    body = create(alice_api)
    # Names are unique per owner and type: a puppet connection may share it, bob may too.
    PuppetConnection.create_with_token(owner=alice, name="team")
    create(client_for(bob))
    problem = assert_problem(alice_api.post(URL, {"name": "team", "token": OTHER}, format="json"), 400)
    assert problem["errors"][0]["detail"] == "You already have a slack connection with this name."
    assert [c["name"] for c in alice_api.get(URL).json()["results"]] == ["team"]
    bob_api = client_for(bob)
    assert_problem(bob_api.get(f"{URL}{body['id']}/"), 404)
    assert_problem(bob_api.patch(f"{URL}{body['id']}/", {"token": OTHER}, format="json"), 404)
    assert len(client_for(staff).get(URL).json()["results"]) == 2
    assert_problem(APIClient().get(URL), 401)


def test_the_schema_shows_the_token_as_write_only(alice_api):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "/api/connections/slack/{id}/" in schema["paths"]
    assert "/api/connections/slack/{id}/regenerate/" not in schema["paths"]
    assert schema["components"]["schemas"]["SlackConnection"]["properties"]["token"]["writeOnly"] is True


def test_an_error_page_never_shows_a_slack_token(rf, settings):
    settings.DEBUG = True
    request = rf.post("/api/connections/slack/", {"token": TOKEN})

    def crash(token: str) -> None:
        raise RuntimeError("crashed holding a token")

    try:
        crash(str(TOKEN))
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
    html = reporter.get_traceback_html()
    assert "crashed holding a token" in html and TOKEN not in html


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def test_the_admin_takes_the_token_and_never_shows_it(admin_client, staff, bao):
    page = admin_client.get(f"{ADMIN}add/")
    assert 'type="password"' in page.content.decode()
    response = admin_client.post(f"{ADMIN}add/", {"name": "team", "owner": staff.pk, "token": TOKEN})
    assert response.status_code == 302
    connection = SlackConnection.objects.get()
    assert bao.read(connection.vault_path) == {"token": TOKEN}
    change = f"{ADMIN}{connection.pk}/change/"
    for url in (ADMIN, change, f"{ADMIN}{connection.pk}/history/"):
        assert TOKEN not in admin_client.get(url).content.decode()

    # Changing without a token keeps it; with one replaces it.
    form = {"name": "renamed", "description": ""}
    assert admin_client.post(change, {**form, "token": ""}).status_code == 302
    assert bao.read(connection.vault_path) == {"token": TOKEN}
    assert admin_client.post(change, {**form, "token": OTHER}).status_code == 302
    assert bao.read(connection.vault_path) == {"token": OTHER}
    connection.refresh_from_db()
    assert connection.name == "renamed" and connection.token_replaced_at


def test_the_admin_add_form_needs_a_token(admin_client, staff, bao):
    page = admin_client.post(f"{ADMIN}add/", {"name": "team", "owner": staff.pk, "token": ""})
    assert page.status_code == 200 and "This field is required" in page.content.decode()
    page = admin_client.post(f"{ADMIN}add/", {"name": "team", "owner": staff.pk, "token": "nope"})
    assert "Not a Slack token" in page.content.decode()
    assert SlackConnection.objects.count() == 0


def test_vault_down_in_the_admin_saves_nothing(admin_client, staff, own_bao):
    own_bao.stop()
    response = admin_client.post(
        f"{ADMIN}add/", {"name": "team", "owner": staff.pk, "token": TOKEN}, follow=True
    )
    text = response.content.decode()
    assert "Nothing was saved" in text and 'value="team"' in text and TOKEN not in text
    assert SlackConnection.objects.count() == 0
