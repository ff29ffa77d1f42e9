"""The permission table of triggers (docs/api.md "Who may do what to a trigger"), cell by cell, in
the admin and in the API alike: a trigger of one's own (no workflow's) holds a credential (its
token) and a destination (its Slack webhook URL), so changing it (its token, Slack webhook,
filters, name or description) is its owner's and superusers' alone, and its owner is changed
by no one; other staff's trigger permissions give view and delete, never more. Its events keep
their own permissions (`view_event`, `delete_event`). A workflow's triggers follow the
workflow's table (tests/test_workflow_permissions.py)."""

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from relay.tokens import LEAK_RE
from tests.conftest import (
    admin_changed,
    admin_given_to_bob,
    api_changed,
    api_given_to_bob,
    client_for,
    owner_as_actor,
)
from tests.events_helpers import fixture, post
from tests.test_api_permissions import user_with
from tests.test_connection_api import assert_problem
from tests.test_workflow_admin import logged_in
from tests.workflow_helpers import NOOP, make_workflow
from triggers import services
from triggers.models import Event, Trigger

HOOK = "https://hooks.slack.com/services/T000/B000/alices-channel"
OTHER_HOOK = "https://hooks.slack.com/services/T111/B111/carols-channel"
REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")
FILTERS = ("statuses", "environments", "host_globs", "resource_types", "title_globs", "tags")

API = "/api/triggers/"
ADMIN = "/admin/triggers/trigger/"
EVENTS_ADMIN = "/admin/triggers/event/"

# The table. Y: done; N: refused (API 403); H: not seen (API 404); I: no one may, and the door
# says nothing of it (the owner is read-only: the API answers 200 and the admin saves the rest,
# the owner unchanged); -: no such door.
COLUMNS = [
    "view",  # the trigger (name, description, filters, owner; never its token or Slack webhook URL)
    "rename",
    "describe",  # change its description
    "filters",  # change which reports it matches
    "slack",  # replace its Slack webhook URL (API; the admin has no such field)
    "token",  # regenerate its token (and see the new one)
    "owner",  # give it to another user
    "delete",  # delete it (its events go with it)
    "make_for",  # make a new one owned by another user (admin; the API makes the requester's)
    "events",  # read its events (list, detail, parts)
    "delete_event",  # delete one of its events
]
TRIGGER = ("view", "add", "change", "delete")
EVENT = ("view", "add", "change", "delete")
EVERY = [*(f"{a}_trigger" for a in TRIGGER), *(f"{a}_event" for a in EVENT)]
TABLE = {
    #                                                          vie ren des fil slk tok own del mkf evt dev
    "owner": ("owner", "Y Y Y Y Y Y I Y N Y Y"),
    "superuser": ("superuser", "Y Y Y Y Y Y I Y Y Y Y"),
    "staff with every permission": (EVERY, "Y N N N N N N Y N Y Y"),
    "view_trigger": (["view_trigger"], "Y N N N N N N N N N N"),
    "change_trigger": (["change_trigger"], "Y N N N N N N N N N N"),
    "view_trigger, delete_trigger": (["view_trigger", "delete_trigger"], "Y N N N N N N Y N N N"),
    "change_trigger, delete_trigger": (["change_trigger", "delete_trigger"], "Y N N N N N N Y N N N"),
    "delete_trigger": (["delete_trigger"], "H H H H H H H H N H H"),
    "add_trigger": (["add_trigger"], "H H H H H H H H N H H"),
    "view_event": (["view_event"], "H H H H H H H H N Y N"),
    "view_event, delete_event": (["view_event", "delete_event"], "H H H H H H H H N Y Y"),
    "delete_event": (["delete_event"], "H H H H H H H H N H H"),
    "staff without permissions": ([], "H H H H H H H H N H H"),
    "not staff, every permission": ("not staff", "H H H H H H H H N H H"),
}
NO_DOOR = {("api", "make_for"), ("admin", "slack")}
CELLS = [
    pytest.param(row, column, door, cells.split()[i], id=f"{door}-{row}-{column}")
    for row, (_, cells) in TABLE.items()
    for i, column in enumerate(COLUMNS)
    for door in ("api", "admin")
    if (door, column) not in NO_DOOR
]


@dataclass
class World:
    alice: User
    bob: User
    trigger: Trigger
    token: str  # as alice's Puppet servers have it
    event: Event

    @property
    def fresh(self) -> Trigger:
        return Trigger.objects.get(pk=self.trigger.pk)

    @property
    def api_url(self) -> str:
        return f"{API}{self.trigger.pk}/"

    @property
    def admin_url(self) -> str:
        return f"{ADMIN}{self.trigger.pk}/"


@pytest.fixture
def world(alice, bob, bao) -> World:
    """Alice's trigger `reports` of her own, with filters, a Slack webhook and one read event."""
    trigger, token = Trigger.create_with_token(owner=alice, name="reports", description="fleet")
    event_id = post(str(token), REPORT).json()["id"]
    services.process(event_id)
    Trigger.objects.filter(pk=trigger.pk).update(statuses=["changed"])
    trigger.set_slack_webhook(HOOK)
    trigger = Trigger.objects.get(pk=trigger.pk)
    return World(alice, bob, trigger, str(token), Event.objects.get(pk=event_id))


def actor_for(row: str, world: World, door: str) -> User:
    who = TABLE[row][0]
    if who == "owner":
        return owner_as_actor(world.alice, door)
    if who == "superuser":
        return User.objects.create_superuser("root")
    if who == "not staff":
        return user_with(*EVERY, staff=False)
    return user_with(*who)


# Each cell: do it through the door, and say whether it was done (from the database and Vault,
# not the answer). The API's answers are checked against the cell too.


def never_shows_the_credential(response) -> None:
    # Whoever looks, and whatever they do: neither the token nor the Slack webhook URL.
    content = response.content.decode() if not getattr(response, "streaming", False) else ""
    assert HOOK not in content and OTHER_HOOK not in content


def api_view(api, w: World) -> tuple[Any, bool]:
    response = api.get(w.api_url)
    listed = [t["id"] for t in api.get(API).json()["results"]]
    seen = response.status_code == 200 and response.json()["statuses"] == ["changed"]
    assert (str(w.trigger.pk) in listed) == seen
    assert w.token not in response.content.decode()
    return response, seen


def admin_view(admin: Client, w: World) -> tuple[Any, bool]:
    page = admin.get(f"{w.admin_url}change/")
    listed = admin.get(ADMIN)
    seen = page.status_code == 200 and "fleet" in page.content.decode()
    assert (listed.status_code == 200 and f"{w.trigger.pk}/change/" in listed.content.decode()) == seen
    if seen:
        assert w.token not in page.content.decode()
    return page, seen


def form(w: World, **changes: object) -> dict:
    """The admin's change form as its page shows it (the owner is read-only there)."""
    data = {"name": "reports", "description": "fleet", "statuses": '["changed"]'}
    data |= {field: "[]" for field in FILTERS if field != "statuses"}
    return {**data, **changes}


def api_rename(api, w: World) -> tuple[Any, bool]:
    return api_changed(api, w, name="renamed")


def admin_rename(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_changed(admin, w, form, name="renamed")


def api_describe(api, w: World) -> tuple[Any, bool]:
    return api_changed(api, w, description="tidied")


def admin_describe(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_changed(admin, w, form, description="tidied")


def api_filters(api, w: World) -> tuple[Any, bool]:
    response = api.patch(w.api_url, {"statuses": [], "host_globs": ["none.invalid"]}, format="json")
    return response, w.fresh.host_globs == ["none.invalid"]


def admin_filters(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(f"{w.admin_url}change/", form(w, statuses="[]", host_globs='["none.invalid"]'))
    return response, w.fresh.host_globs == ["none.invalid"]


def api_slack(api, w: World) -> tuple[Any, bool]:
    response = api.patch(w.api_url, {"slack_webhook_url": OTHER_HOOK}, format="json")
    url = w.fresh.slack_webhook_url()
    assert url in (HOOK, OTHER_HOOK)
    return response, url == OTHER_HOOK


def token_changed(w: World, response) -> bool:
    done = w.fresh.token_digest != w.trigger.token_digest
    shown = LEAK_RE.findall(response.content.decode())
    assert bool(shown) == done  # the new token, to whoever regenerated it, and no one else
    if done:
        assert post(shown[0], REPORT).status_code == 202
    assert (post(w.token, REPORT).status_code == 401) == done
    return done


def api_token(api, w: World) -> tuple[Any, bool]:
    response = api.post(f"{w.api_url}regenerate/")
    return response, token_changed(w, response)


def admin_token(admin: Client, w: World) -> tuple[Any, bool]:
    prompt = admin.get(f"{w.admin_url}regenerate/")
    response = admin.post(f"{w.admin_url}regenerate/")
    assert (prompt.status_code == 200) == (response.status_code == 200)  # one rule for both
    return response, token_changed(w, response)


def api_owner(api, w: World) -> tuple[Any, bool]:
    return api_given_to_bob(api, w)


def admin_owner(admin: Client, w: World) -> tuple[Any, bool]:
    return admin_given_to_bob(admin, w, form)


def deleted(w: World) -> bool:
    gone = not Trigger.objects.filter(pk=w.trigger.pk).exists()
    assert Event.objects.filter(pk=w.event.pk).exists() != gone  # its events go with it
    return gone


def api_delete(api, w: World) -> tuple[Any, bool]:
    return api.delete(w.api_url), deleted(w)


def admin_delete(admin: Client, w: World) -> tuple[Any, bool]:
    return admin.post(f"{w.admin_url}delete/", {"post": "yes"}), deleted(w)


def admin_make_for(admin: Client, w: World) -> tuple[Any, bool]:
    data = {"name": "new", "description": "", "owner": w.bob.pk, **{field: "[]" for field in FILTERS}}
    response = admin.post(f"{ADMIN}add/", data)
    return response, Trigger.objects.filter(owner=w.bob, name="new").exists()


def api_events(api, w: World) -> tuple[Any, bool]:
    base = f"{w.api_url}events/"
    listed = api.get(base)
    detail = api.get(f"{base}{w.event.pk}/")
    body = api.get(f"{base}{w.event.pk}/parts/body")
    # One rule for the list, an event and its parts.
    assert listed.status_code == detail.status_code == body.status_code
    seen = detail.status_code == 200 and detail.json()["summary"]["host"] == "example-host"
    if seen:
        assert [e["id"] for e in listed.json()["results"]] == [str(w.event.pk)]
        assert b"".join(body.streaming_content) == REPORT
    return detail, seen


def admin_events(admin: Client, w: World) -> tuple[Any, bool]:
    listed = admin.get(EVENTS_ADMIN)
    page = admin.get(f"{EVENTS_ADMIN}{w.event.pk}/change/")
    seen = page.status_code == 200 and "example-host" in page.content.decode()
    assert (listed.status_code == 200 and f"{w.event.pk}/change/" in listed.content.decode()) == seen
    return page, seen


def api_delete_event(api, w: World) -> tuple[Any, bool]:
    response = api.delete(f"{w.api_url}events/{w.event.pk}/")
    return response, not Event.objects.filter(pk=w.event.pk).exists()


def admin_delete_event(admin: Client, w: World) -> tuple[Any, bool]:
    response = admin.post(f"{EVENTS_ADMIN}{w.event.pk}/delete/", {"post": "yes"})
    return response, not Event.objects.filter(pk=w.event.pk).exists()


API_SUCCESS = {"delete": 204, "delete_event": 204}
# Where the admin sees the row but may not do this to it, it answers 403; the events' pages
# (another model) are simply not found by who may not read them.
ADMIN_REFUSES = {"rename", "describe", "filters", "token", "owner", "delete"}


@pytest.mark.parametrize(("row", "column", "door", "cell"), CELLS)
def test_the_permission_table(row, column, door, cell, world):
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
        if cell == "N" and column in ADMIN_REFUSES:
            assert response.status_code == 403
        if cell == "H":
            assert response.status_code != 200
    never_shows_the_credential(response)
    assert done == (cell == "Y"), f"{row} / {column} / {door}: {response.status_code}"
    if column != "slack":
        assert Trigger.objects.filter(pk=world.trigger.pk, has_slack_webhook=False).count() == 0
        assert column == "delete" or world.fresh.slack_webhook_url() == HOOK


# Around the table -----------------------------------------------------------------------------


def test_the_api_makes_a_trigger_for_the_requester_whatever_owner_the_body_names(alice, bao):
    carol = user_with(*EVERY)
    made = client_for(carol).post(API, {"name": "new", "owner": "alice"}, format="json")
    assert made.status_code == 201 and made.json()["owner"] == "carol"
    assert not Trigger.objects.filter(owner=alice).exists()


def test_a_refusal_says_whose_the_trigger_is(world):
    api = client_for(user_with("change_trigger"))
    problem = assert_problem(api.patch(world.api_url, {"slack_webhook_url": OTHER_HOOK}, format="json"), 403)
    assert "only its owner or a superuser may change it" in problem["detail"]
    assert "may not delete another user's trigger" in assert_problem(api.delete(world.api_url), 403)["detail"]


def test_the_regenerate_link_shows_only_to_who_may_follow_it(world):
    viewer = logged_in(user_with("view_trigger", "change_trigger"))
    page = viewer.get(f"{world.admin_url}change/").content.decode()
    assert "fleet" in page and "Regenerate token" not in page
    world.alice.is_staff = True
    world.alice.save()
    assert "Regenerate token" in logged_in(world.alice).get(f"{world.admin_url}change/").content.decode()


def test_the_admin_s_delete_action_deletes_only_what_its_user_may_delete(world):
    carol = user_with("view_trigger", "change_trigger")
    mine, _ = Trigger.create_with_token(owner=carol, name="mine")
    admin = logged_in(carol)
    action = {"action": "delete_selected", "post": "yes"}
    # Alice's among them: nothing is deleted, carol's own neither.
    refused = admin.post(ADMIN, {**action, "_selected_action": [world.trigger.pk, mine.pk]})
    assert refused.status_code == 403
    assert Trigger.objects.count() == 2
    # Her own, whatever her permissions: as in the API.
    assert admin.post(ADMIN, {**action, "_selected_action": [mine.pk]}).status_code == 302
    assert list(Trigger.objects.all()) == [world.trigger]


def test_the_events_list_offers_as_filters_only_the_triggers_of_events_it_shows(world):
    Trigger.create_with_token(owner=world.bob, name="bobs-secret-project")
    world.alice.is_staff = True
    world.alice.save()
    page = logged_in(world.alice).get(EVENTS_ADMIN).content.decode()
    assert "example-host" in page and "bobs-secret-project" not in page


def test_a_workflow_s_trigger_is_deleted_by_its_document_whoever_asks(alice, staff, bao):
    source = f"""apiVersion: v1
triggers:
- name: r
  source: {{type: push}}
steps:
- name: a
  image: {NOOP}
"""
    workflow = make_workflow(alice, source)
    trigger = workflow.push_triggers.get()
    for user in (alice, staff, user_with("view_trigger", "delete_trigger")):
        problem = assert_problem(client_for(user).delete(f"{API}{trigger.pk}/"), 409)
        assert problem["detail"].startswith("This push trigger belongs to workflow")
    assert_problem(client_for(user_with("delete_trigger", name="dan")).delete(f"{API}{trigger.pk}/"), 404)
    assert Trigger.objects.filter(pk=trigger.pk).exists()
