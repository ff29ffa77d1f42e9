import pytest
from django.test import Client

from puppet_connection.models import PuppetConnection
from relay.tokens import LEAK_RE
from tests.conftest import bridge

ADD = "/admin/puppet_connection/puppetconnection/add/"
LIST = "/admin/puppet_connection/puppetconnection/"
TOKEN_RE = LEAK_RE  # any token of ours: rlyp_ (connections), rlyt_ (triggers)


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def shown_token(response) -> str:
    found = TOKEN_RE.findall(response.content.decode())
    assert len(set(found)) == 1, "the page shows exactly one token"
    return found[0]


def test_adding_a_connection_shows_its_token_once(admin_client, staff, bao):
    page = admin_client.post(ADD, {"name": "prod", "description": "fleet", "owner": staff.pk})
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"].split(", ")
    assert "copy it now; it will not be shown again" in page.content.decode().lower()
    token = shown_token(page)
    conn = PuppetConnection.objects.get(name="prod")
    assert bridge(token).get("/_puppet/runs").status_code == 200
    assert bao.read(conn.vault_path) == {"token": token}

    # Never again: not on the list, the change page, the history, or the regenerate prompt.
    for url in (
        LIST,
        f"{LIST}{conn.pk}/change/",
        f"{LIST}{conn.pk}/history/",
        f"{LIST}{conn.pk}/regenerate/",
    ):
        page = admin_client.get(url)
        assert page.status_code == 200, url
        assert token not in page.content.decode()
        assert token[17:-6] not in page.content.decode()


def test_the_list_shows_name_owner_prefix_and_dates(admin_client, connection):
    conn, _ = connection
    page = admin_client.get(LIST).content.decode()
    for column in ("Name", "Owner", "Token prefix", "Created", "Last used", "Token regenerated at"):
        assert column in page
    assert conn.token_prefix in page and "alice" in page


def test_regenerate_shows_a_new_token_once_and_the_old_one_dies(admin_client, connection, bao):
    conn, old = connection
    page = admin_client.post(f"{LIST}{conn.pk}/regenerate/")
    assert page.status_code == 200 and "no-store" in page["Cache-Control"].split(", ")
    new = shown_token(page)
    assert new != old
    assert bridge(old).get("/_puppet/runs").status_code == 401
    assert bridge(new).get("/_puppet/runs").status_code == 200
    assert bao.read(conn.vault_path) == {"token": new}
    assert new not in admin_client.get(f"{LIST}{conn.pk}/change/").content.decode()


def test_the_regenerate_prompt_changes_nothing(admin_client, connection):
    conn, old = connection
    admin_client.get(f"{LIST}{conn.pk}/regenerate/")
    assert bridge(old).get("/_puppet/runs").status_code == 200


def test_vault_down_during_add_shows_an_error_and_saves_nothing(admin_client, staff, own_bao):
    own_bao.stop()
    response = admin_client.post(
        ADD, {"name": "prod", "description": "fleet", "owner": staff.pk}, follow=True
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "Nothing was saved" in text and "unreachable" in text
    assert 'value="prod"' in text  # what was typed is kept
    assert PuppetConnection.objects.count() == 0
    assert not TOKEN_RE.search(text)


def test_vault_down_during_regenerate_keeps_the_old_token(admin_client, alice, own_bao):
    conn, old = PuppetConnection.create_with_token(owner=alice, name="prod")
    own_bao.stop()
    response = admin_client.post(f"{LIST}{conn.pk}/regenerate/", follow=True)
    assert "The token was not changed" in response.content.decode()
    assert bridge(str(old)).get("/_puppet/runs").status_code == 200


def test_deleting_in_the_admin_deletes_the_vault_secret(
    admin_client, connection, bao, django_capture_on_commit_callbacks
):
    conn, token = connection
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"{LIST}{conn.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert bao.read(conn.vault_path) is None
    assert bridge(token).get("/_puppet/runs").status_code == 401


def test_bulk_delete_in_the_admin_deletes_every_secret(
    admin_client, alice, bao, django_capture_on_commit_callbacks
):
    conns = [PuppetConnection.create_with_token(owner=alice, name=f"c{i}")[0] for i in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            LIST, {"action": "delete_selected", "_selected_action": [c.pk for c in conns], "post": "yes"}
        )
    assert PuppetConnection.objects.count() == 0
    assert all(bao.read(c.vault_path) is None for c in conns)


def test_a_duplicate_name_in_the_admin_is_a_form_error(admin_client, staff):
    PuppetConnection.create_with_token(owner=staff, name="prod")
    page = admin_client.post(ADD, {"name": "prod", "owner": staff.pk})
    assert page.status_code == 200 and "already exists" in page.content.decode()
    assert PuppetConnection.objects.count() == 1


def test_the_owner_of_a_connection_cannot_be_changed(admin_client, connection, bob):
    conn, _ = connection
    page = admin_client.post(
        f"{LIST}{conn.pk}/change/", {"name": "renamed", "description": "", "owner": bob.pk}
    )
    assert page.status_code == 302
    conn.refresh_from_db()
    assert conn.name == "renamed" and conn.owner.username == "alice"  # owner stays: it is read-only
