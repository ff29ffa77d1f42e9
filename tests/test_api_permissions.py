"""The API grants no more than the admin: a user manages their own connections and triggers;
anyone else's need what the admin needs, staff status and the model's view or delete
permission, and are changed by no one else but a superuser."""

import pytest
from django.contrib.auth.models import Permission, User

from puppet_connection.models import PuppetConnection
from tests.conftest import client_for
from tests.events_helpers import fixture, post
from tests.test_connection_api import assert_problem
from triggers import services
from triggers.models import Trigger

KINDS = [
    pytest.param("/api/connections/puppet/", PuppetConnection, id="connections"),
    pytest.param("/api/triggers/", Trigger, id="triggers"),
]


def user_with(*codenames: str, staff: bool = True, name: str = "carol") -> User:
    user = User.objects.create_user(name, is_staff=staff)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def perms(model: type, *actions: str) -> list[str]:
    return [f"{action}_{model._meta.model_name}" for action in actions]


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return sorted(item["name"] for item in response.json()["results"])


def assert_unchanged(holder) -> None:
    fresh = type(holder).objects.get(pk=holder.pk)
    assert (fresh.name, fresh.description, fresh.token_digest) == (
        holder.name,
        holder.description,
        holder.token_digest,
    )


@pytest.fixture
def alices(alice):
    """Alice's connection and trigger."""
    return {
        PuppetConnection: PuppetConnection.create_with_token(owner=alice, name="alices")[0],
        Trigger: Trigger.create_with_token(owner=alice, name="alices")[0],
    }


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_staff_without_permissions_see_and_manage_only_their_own(url, model, alices, bao):
    carol = user_with()
    model.create_with_token(owner=carol, name="carols")
    api = client_for(carol)
    assert names(api.get(url)) == ["carols"]
    theirs = f"{url}{alices[model].pk}/"
    assert_problem(api.get(theirs), 404)
    assert_problem(api.patch(theirs, {"description": "mine now"}, format="json"), 404)
    assert_problem(api.post(f"{theirs}regenerate/"), 404)
    assert_problem(api.delete(theirs), 404)
    assert_unchanged(alices[model])


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_view_permission_reads_everyone_s_but_changes_nothing(url, model, alices, bao):
    carol = user_with(*perms(model, "view"))
    model.create_with_token(owner=carol, name="carols")
    api = client_for(carol)
    assert names(api.get(url)) == ["alices", "carols"]
    theirs = f"{url}{alices[model].pk}/"
    assert api.get(theirs).json()["owner"] == "alice"
    assert_problem(api.patch(theirs, {"description": "mine now"}, format="json"), 403)
    assert_problem(api.post(f"{theirs}regenerate/"), 403)
    assert_problem(api.delete(theirs), 403)
    assert_unchanged(alices[model])


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_change_permission_on_someone_else_s_row_is_the_view_alone(url, model, alices, bao):
    # A connection's or trigger's token is its owner's alone (tests/test_connection_permissions.py,
    # tests/test_trigger_permissions.py).
    api = client_for(user_with(*perms(model, "change")))  # the admin: change implies view
    theirs = f"{url}{alices[model].pk}/"
    assert names(api.get(url)) == ["alices"]
    assert_problem(api.patch(theirs, {"description": "tidied by carol"}, format="json"), 403)
    assert_problem(api.post(f"{theirs}regenerate/"), 403)
    assert_problem(api.delete(theirs), 403)
    assert_unchanged(alices[model])


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_delete_permission_deletes(url, model, alices, bao):
    api = client_for(user_with(*perms(model, "view", "delete")))
    assert api.delete(f"{url}{alices[model].pk}/").status_code == 204
    assert not model.objects.filter(pk=alices[model].pk).exists()


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_a_superuser_may_do_everything(url, model, alices, staff, bao):
    api = client_for(staff)
    theirs = f"{url}{alices[model].pk}/"
    assert names(api.get(url)) == ["alices"]
    assert api.patch(theirs, {"description": "by root"}, format="json").status_code == 200
    assert api.post(f"{theirs}regenerate/").status_code == 200
    assert api.delete(theirs).status_code == 204


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_permissions_without_staff_status_grant_nothing(url, model, alices, bao):
    # The admin lets no one in who is not staff, whatever their permissions.
    api = client_for(user_with(*perms(model, "view", "change", "delete"), staff=False))
    assert names(api.get(url)) == []
    assert_problem(api.get(f"{url}{alices[model].pk}/"), 404)


@pytest.mark.parametrize(("url", "model"), KINDS)
def test_a_rename_is_checked_against_the_owner_s_names(url, model, alice, staff, bao):
    model.create_with_token(owner=alice, name="first")
    second, _ = model.create_with_token(owner=alice, name="second")
    model.create_with_token(owner=staff, name="roots")
    api = client_for(staff)
    clash = api.patch(f"{url}{second.pk}/", {"name": "first"}, format="json")
    problem = assert_problem(clash, 400)
    assert problem["errors"] == [
        {
            "pointer": "#/name",
            "detail": f"alice already has a {model._meta.verbose_name} with this name.",
            "code": "unique",
        }
    ]
    # The requester's own names do not matter.
    assert api.patch(f"{url}{second.pk}/", {"name": "roots"}, format="json").status_code == 200
    assert sorted(model.objects.filter(owner=alice).values_list("name", flat=True)) == ["first", "roots"]


@pytest.fixture
def alices_event(alice):
    trigger, token = Trigger.create_with_token(owner=alice, name="reports")
    event_id = post(str(token), fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")).json()["id"]
    services.process(event_id)
    return f"/api/triggers/{trigger.pk}/events/", event_id


def test_someone_else_s_events_need_the_event_view_permission(alices_event, bao):
    base, event_id = alices_event
    paths = [base, f"{base}{event_id}/", f"{base}{event_id}/parts/body", f"{base}{event_id}/parts/logs"]
    nobody = client_for(user_with(name="dave"))
    for path in paths:
        assert_problem(nobody.get(path), 404)
    # Seeing the trigger is not seeing its reports.
    trigger_viewer = client_for(user_with("view_trigger", name="erin"))
    for path in paths:
        assert_problem(trigger_viewer.get(path), 403)
    event_viewer = client_for(user_with("view_event", name="frank"))
    for path in paths:
        assert event_viewer.get(path).status_code == 200, path
    assert_problem(client_for(user_with("view_event", staff=False, name="gina")).get(base), 404)


def test_deleting_someone_else_s_event_needs_the_event_delete_permission(alices_event, bao):
    base, event_id = alices_event
    path = f"{base}{event_id}/"
    assert_problem(client_for(user_with(name="dave")).delete(path), 404)
    assert_problem(client_for(user_with("view_event", name="frank")).delete(path), 403)
    assert client_for(user_with("view_event", name="henry")).get(path).status_code == 200  # still there
    assert client_for(user_with("view_event", "delete_event", name="ida")).delete(path).status_code == 204
    assert client_for(user_with("view_event", name="jan")).get(path).status_code == 404
