import pytest
from django.test import Client

from tests.conftest import client_for
from tests.test_admin import shown_token
from tests.test_connection_api import assert_problem
from tests.test_vault import dump_every_table
from triggers.models import Trigger

URL = "/api/triggers/"
HOOK = "https://hooks.slack.com/services/T000/B000/XXXXXXXX"


def test_create_answers_the_token_once_and_keeps_it_and_the_webhook_in_vault(alice_api, bao):
    body = {
        "name": "web-changes",
        "tags": ["profile::web"],
        "statuses": ["changed"],
        "slack_webhook_url": HOOK,
    }
    response = alice_api.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert response["Cache-Control"] == "no-store"
    created = response.json()
    token = created["token"]
    assert token.startswith("rlyt_") and created["has_slack_webhook"] is True
    assert "slack_webhook_url" not in created
    assert (created["tags"], created["statuses"]) == (["profile::web"], ["changed"])
    assert bao.read(f"relay/triggers/{created['id']}") == {"token": token, "slack_webhook_url": HOOK}
    shown = alice_api.get(f"{URL}{created['id']}/").content.decode()
    assert token not in shown and HOOK not in shown
    dump = dump_every_table()
    assert token not in dump and HOOK not in dump


def test_regenerate_keeps_the_webhook_and_patch_changes_it(alice_api, bao):
    created = alice_api.post(URL, {"name": "t", "slack_webhook_url": HOOK}, format="json").json()
    new = alice_api.post(f"{URL}{created['id']}/regenerate/").json()["token"]
    assert bao.read(f"relay/triggers/{created['id']}") == {"token": new, "slack_webhook_url": HOOK}

    other = "https://hooks.slack.com/services/T111/B111/YYYYYYYY"
    patched = alice_api.patch(f"{URL}{created['id']}/", {"slack_webhook_url": other}, format="json")
    assert patched.status_code == 200 and patched.json()["has_slack_webhook"] is True
    assert bao.read(f"relay/triggers/{created['id']}") == {"token": new, "slack_webhook_url": other}
    removed = alice_api.patch(f"{URL}{created['id']}/", {"slack_webhook_url": ""}, format="json")
    assert removed.json()["has_slack_webhook"] is False
    assert bao.read(f"relay/triggers/{created['id']}") == {"token": new}


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"name": ""}, "#/name"),
        ({"name": "t", "statuses": ["exploded"]}, "#/statuses/0"),
        ({"name": "t", "tags": "profile::web"}, "#/tags"),
        ({"name": "t", "host_globs": [3]}, "#/host_globs/0"),
        ({"name": "t", "slack_webhook_url": "not a url"}, "#/slack_webhook_url"),
    ],
)
def test_bad_triggers_are_400_with_field_errors(alice_api, body, pointer):
    problem = assert_problem(alice_api.post(URL, body, format="json"), 400)
    assert problem["errors"][0]["pointer"] == pointer
    assert Trigger.objects.count() == 0


def test_users_see_only_their_own_triggers(alice, bob, alice_api):
    created = alice_api.post(URL, {"name": "t"}, format="json").json()
    assert_problem(client_for(bob).get(f"{URL}{created['id']}/"), 404)
    assert client_for(bob).get(URL).json()["results"] == []


def test_deleting_a_trigger_deletes_its_secret(alice_api, bao, django_capture_on_commit_callbacks):
    created = alice_api.post(URL, {"name": "t", "slack_webhook_url": HOOK}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_api.delete(f"{URL}{created['id']}/").status_code == 204
    assert bao.read(f"relay/triggers/{created['id']}") is None


def test_the_admin_shows_a_new_trigger_s_token_once(staff, bao):
    client = Client()
    client.force_login(staff)
    page = client.post(
        "/admin/triggers/trigger/add/",
        {
            "name": "t",
            "owner": staff.pk,
            **{
                f: "[]"
                for f in ("statuses", "environments", "host_globs", "resource_types", "title_globs", "tags")
            },
        },
    )
    assert page.status_code == 200, page.content.decode()[:2000]
    token = shown_token(page)
    assert token.startswith("rlyt_")
    trigger = Trigger.objects.get(name="t")
    assert bao.read(trigger.vault_path) == {"token": token}
    assert token not in client.get(f"/admin/triggers/trigger/{trigger.pk}/change/").content.decode()
