"""The permission table of connections (docs/api.md "Who may do what to a connection"), cell by
cell, for each type, in the admin and in the API alike: a connection is a credential its
owner's workflows use, so changing it (its name, description or token, regenerated or
replaced) is its owner's and superusers' alone, and its owner is changed by no one; other
staff's permissions give view and delete, never more."""

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from connections.models import Connection, SlackConnection
from puppet_connection.models import PuppetConnection
from relay.tokens import LEAK_RE
from runs.models import Run
from tests.conftest import (
    admin_changed,
    admin_given_to_bob,
    api_changed,
    api_given_to_bob,
    bridge,
    client_for,
    owner_as_actor,
)
from tests.runs_helpers import create_run
from tests.test_api_permissions import user_with
from tests.test_connection_api import assert_problem
from tests.test_workflow_admin import logged_in

SLACK_TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"
NEW_SLACK_TOKEN = "xoxb-3333333333-4444444444444-ZyXwVuTsRqPoNmLkJiHgFeDc"

TYPES = {"puppet": PuppetConnection, "slack": SlackConnection}
API = {"puppet": "/api/connections/puppet/", "slack": "/api/connections/slack/"}
ADMIN = {
    "puppet": "/admin/puppet_connection/puppetconnection/",
    "slack": "/admin/connections/slackconnection/",
}


def codenames(kind: str, *actions: str) -> list[str]:
    return [f"{action}_{TYPES[kind]._meta.model_name}" for action in actions]


# The table. Y: done; N: refused (API 403); H: not seen (API 404); I: no one may, and the door
# says nothing of it (the owner is read-only: the API answers 200 and the admin saves the rest,
# the owner unchanged); -: no such door. Each row's permissions are of the connection's type.
COLUMNS = [
    "view",  # the connection (its name, description, owner, dates; never its token)
    "rename",
    "describe",  # change its description
    "token",  # puppet: regenerate its token (and see it); slack: replace its token
    "owner",  # give it to another user
    "delete",
    "make_for",  # make a new one owned by another user (admin; the API makes the requester's)
]
EVERY = ("view", "add", "change", "delete")
TABLE = {
    #                                                  view ren des tok own del mkf
    "owner": ("owner", "Y Y Y Y I Y N"),
    "superuser": ("superuser", "Y Y Y Y I Y Y"),
    "staff with every permission": (EVERY, "Y N N N N Y N"),
    "view": (("view",), "Y N N N N N N"),
    "change": (("change",), "Y N N N N N N"),
    "view, delete": (("view", "delete"), "Y N N N N Y N"),
    "change, delete": (("change", "delete"), "Y N N N N Y N"),
    "delete": (("delete",), "H H H H H H N"),
    "add": (("add",), "H H H H H H N"),
    "staff without permissions": ((), "H H H H H H N"),
    "not staff, every permission": ("not staff", "H H H H H H N"),
}
CELLS = [
    pytest.param(kind, row, column, door, cells.split()[i], id=f"{kind}-{door}-{row}-{column}")
    for kind in TYPES
    for row, (_, cells) in TABLE.items()
    for i, column in enumerate(COLUMNS)
    for door in ("api", "admin")
    if (door, column) != ("api", "make_for")
]


@dataclass
class World:
    kind: str
    alice: User
    bob: User
    connection: Connection
    token: str  # its token, as alice's workflows and bridge have it

    @property
    def fresh(self) -> Connection:
        return type(self.connection).objects.get(pk=self.connection.pk)

    @property
    def api_url(self) -> str:
        return f"{API[self.kind]}{self.connection.pk}/"

    @property
    def admin_url(self) -> str:
        return f"{ADMIN[self.kind]}{self.connection.pk}/"


def make_connection(kind: str, owner: User) -> tuple[Connection, str]:
    if kind == "puppet":
        connection, token = PuppetConnection.create_with_token(owner=owner, name="prod", description="fleet")
        return connection, str(token)
    connection = SlackConnection.create_with_token(owner, SLACK_TOKEN, name="prod", description="fleet")
    return connection, SLACK_TOKEN


def world_of(kind: str, alice: User, bob: User) -> World:
    """Alice's connection of the type, named `prod`."""
    connection, token = make_connection(kind, alice)
    return World(kind, alice, bob, connection, token)


def actor_for(row: str, world: World, door: str) -> User:
    who = TABLE[row][0]
    every = [*codenames("puppet", *EVERY), *codenames("slack", *EVERY)]
    if who == "owner":
        return owner_as_actor(world.alice, door)
    if who == "superuser":
        return User.objects.create_superuser("root")
    if who == "not staff":
        return user_with(*every, staff=False)
    if who == EVERY:
        return user_with(*every)
    return user_with(*codenames(world.kind, *who))


# Each cell: do it through the door, and say whether it was done (from the database and Vault,
# not the answer). The API's answers are checked against the cell too.


def api_view(api, w: World) -> tuple[Any, bool]:
    response = api.get(w.api_url)
    listed = [c["id"] for c in api.get(API[w.kind]).json()["results"]]
    seen = response.status_code == 200 and response.json()["description"] == "fleet"
    assert (str(w.connection.pk) in listed) == seen
    assert w.token not in response.content.decode()  # never the credential, whoever looks
    return response, seen


def admin_view(admin: Client, w: World) -> tuple[Any, bool]:
    page = admin.get(f"{w.admin_url}change/")
    listed = admin.get(ADMIN[w.kind])
    seen = page.status_code == 200 and "fleet" in page.content.decode()
    assert (listed.status_code == 200 and f"{w.connection.pk}/change/" in listed.content.decode()) == seen
    if seen:
        assert w.token not in page.content.decode()
    return page, seen


def form(w: World, **changes: object) -> dict:
    data = {"name": "prod", "description": "fleet", "owner": w.alice.pk}
    if w.kind == "slack":
        data["token"] = ""  # keeps the token
    return {**data, **changes}


def api_rename(api, w: World) -> tuple[Any, bool]:
    return api_changed(api, w, name="renamed")


def admin_rename(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_changed(admin, w, form, name="renamed")


def api_describe(api, w: World) -> tuple[Any, bool]:
    return api_changed(api, w, description="tidied")


def admin_describe(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_changed(admin, w, form, description="tidied")


def token_changed(w: World, response) -> bool:
    if w.kind == "puppet":
        done = w.fresh.token_digest != w.connection.token_digest
        shown = LEAK_RE.findall(response.content.decode())
        assert bool(shown) == done  # the new token, to whoever regenerated it, and no one else
        if done:
            assert bridge(shown[0]).get("/_puppet/runs").status_code == 200
        assert (bridge(w.token).get("/_puppet/runs").status_code == 401) == done
        return done
    assert SLACK_TOKEN not in response.content.decode() and NEW_SLACK_TOKEN not in response.content.decode()
    token = w.fresh.read_secret()["token"]
    assert token in (SLACK_TOKEN, NEW_SLACK_TOKEN)
    return token == NEW_SLACK_TOKEN


def api_token(api, w: World) -> tuple[Any, bool]:
    if w.kind == "puppet":
        response = api.post(f"{w.api_url}regenerate/")
    else:
        response = api.patch(w.api_url, {"token": NEW_SLACK_TOKEN}, format="json")
    return response, token_changed(w, response)


def admin_token(admin: Client, w: World) -> tuple[Any, bool]:
    if w.kind == "puppet":
        prompt = admin.get(f"{w.admin_url}regenerate/")
        response = admin.post(f"{w.admin_url}regenerate/")
        assert (prompt.status_code == 200) == (response.status_code == 200)  # one rule for both
    else:
        response = admin.post(f"{w.admin_url}change/", form(w, token=NEW_SLACK_TOKEN))
    return response, token_changed(w, response)


def api_owner(api, w: World) -> tuple[Any, bool]:
    return api_given_to_bob(api, w)


def admin_owner(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_given_to_bob(admin, w, form)


def api_delete(api, w: World) -> tuple[Any, bool]:
    response = api.delete(w.api_url)
    return response, not type(w.connection).objects.filter(pk=w.connection.pk).exists()


def admin_delete(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(f"{w.admin_url}delete/", {"post": "yes"})
    return response, not type(w.connection).objects.filter(pk=w.connection.pk).exists()


def admin_make_for(admin: Client, w: World) -> tuple[Any, bool]:
    data = {"name": "new", "description": "", "owner": w.bob.pk}
    if w.kind == "slack":
        data["token"] = SLACK_TOKEN
    response = admin.post(f"{ADMIN[w.kind]}add/", data)
    return response, type(w.connection).objects.filter(owner=w.bob, name="new").exists()


API_SUCCESS = {"delete": 204}


@pytest.mark.parametrize(("kind", "row", "column", "door", "cell"), CELLS)
def test_the_permission_table(kind, row, column, door, cell, alice, bob, bao):
    world = world_of(kind, alice, bob)
    actor = actor_for(row, world, door)
    if door == "api":
        response, done = globals()[f"api_{column}"](client_for(actor), world)
        expected = {"Y": API_SUCCESS.get(column, 200), "I": 200, "N": 403, "H": 404}[cell]
        assert response.status_code == expected, response.content
        if cell in "NH":
            assert response["Content-Type"] == "application/problem+json"
    else:
        response, done = globals()[f"admin_{column}"](logged_in(actor), world)
        if cell in "YI":
            assert response.status_code in (200, 302), response.content
        if cell == "N" and column != "make_for":
            assert response.status_code == 403
    assert done == (cell == "Y"), f"{kind} / {row} / {column} / {door}: {response.status_code}"


# Around the table -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(TYPES))
def test_the_api_makes_a_connection_for_the_requester_whatever_owner_the_body_names(kind, alice, staff, bao):
    body = {"name": "new", "owner": "alice"} | ({"token": SLACK_TOKEN} if kind == "slack" else {})
    made = client_for(staff).post(API[kind], body, format="json")
    assert made.status_code == 201 and made.json()["owner"] == "root"
    assert not TYPES[kind].objects.filter(owner=alice).exists()


@pytest.mark.parametrize("kind", list(TYPES))
def test_a_refusal_says_whose_the_connection_is(kind, alice, bob, bao):
    world = world_of(kind, alice, bob)
    api = client_for(user_with(*codenames(kind, "change")))
    problem = assert_problem(api.patch(world.api_url, {"name": "renamed"}, format="json"), 403)
    assert "only its owner or a superuser may change it" in problem["detail"]
    assert "may not delete another user's" in assert_problem(api.delete(world.api_url), 403)["detail"]


def test_the_regenerate_link_shows_only_to_who_may_follow_it(alice, bob, bao):
    world = world_of("puppet", alice, bob)
    viewer = logged_in(user_with(*codenames("puppet", "view", "change")))
    page = viewer.get(f"{world.admin_url}change/").content.decode()
    assert "fleet" in page and "Regenerate token" not in page
    alice.is_staff = True
    alice.save()
    assert "Regenerate token" in logged_in(alice).get(f"{world.admin_url}change/").content.decode()


@pytest.mark.parametrize("kind", list(TYPES))
def test_the_admin_s_delete_action_deletes_only_what_its_user_may_delete(kind, alice, bob, bao):
    world = world_of(kind, alice, bob)
    carol = user_with(*codenames(kind, "view", "change"))
    mine, _ = make_connection(kind, carol)
    admin = logged_in(carol)
    action = {"action": "delete_selected", "post": "yes"}
    # Alice's among them: nothing is deleted, carol's own neither.
    refused = admin.post(ADMIN[kind], {**action, "_selected_action": [world.connection.pk, mine.pk]})
    assert refused.status_code == 403
    assert TYPES[kind].objects.count() == 2
    # Her own, whatever her permissions: as in the API.
    assert admin.post(ADMIN[kind], {**action, "_selected_action": [mine.pk]}).status_code == 302
    assert list(TYPES[kind].objects.all()) == [world.connection]


def test_an_owner_deletes_their_puppet_connection_with_its_runs_in_the_admin_as_in_the_api(alice, bob, bao):
    world = world_of("puppet", alice, bob)
    create_run(world.token)
    alice.is_staff = True  # without any permission of runs or connections
    alice.save()
    admin = logged_in(alice)
    page = admin.get(f"{world.admin_url}delete/")
    assert page.status_code == 200 and "permission" not in page.content.decode().lower()
    assert admin.post(f"{world.admin_url}delete/", {"post": "yes"}).status_code == 302
    assert not PuppetConnection.objects.exists() and not Run.objects.exists()
