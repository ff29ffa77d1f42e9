"""The fleet inventory on the service's side (issue 21 §3): the bridge's `/_puppet/inventory`
extension (syncs, pages, their bounds), the inventory API with its filters, and the scope
preview (inventory.scope). Pages are sent here as the bridge sends them; the bridge reading
a real PuppetDB is tests/test_bridge_inventory.py."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from inventory.models import Inventory, Node
from inventory.scope import ASKED, RESOLVED_AT_RUN_TIME, resolve_scope
from puppet_connection.models import PuppetConnection
from tests.conftest import bridge, client_for
from tests.test_connection_api import assert_problem

FACTS = ["os.family", "kernel"]
BASE = "/_puppet/inventory"


def recent(minutes: int = 1) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).isoformat()


def node(certname: str, family: str = "Debian", **fields) -> dict:
    return {
        "certname": certname,
        "environment": "production",
        "report_status": "unchanged",
        "report_timestamp": recent(),
        "facts_timestamp": recent(),
        "deactivated": None,
        "expired": None,
        "facts": {"os.family": family, "kernel": "Linux"},
        **fields,
    }


def start(token: str, facts: list[str] = FACTS) -> dict:
    answer = bridge(token).post(f"{BASE}/syncs", {"facts": facts}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def page(token: str, sync: dict, nodes: list) -> dict:
    answer = bridge(token).put(f"{BASE}/syncs/{sync['id']}/nodes", {"nodes": nodes}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def end(token: str, sync: dict, since: str = "2026-01-01T00:00:00+00:00") -> dict:
    answer = bridge(token).post(f"{BASE}/syncs/{sync['id']}/done", {"since": since}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def synced(token: str, nodes: list) -> None:
    sync = start(token)
    page(token, sync, nodes)
    end(token, sync)


@pytest.fixture
def token(connection) -> str:
    return connection[1]


def test_a_first_sync_is_full_and_later_ones_incremental_from_the_time_kept(token, connection):
    sync = start(token)
    assert (sync["full"], sync["since"]) == (True, None)
    assert page(token, sync, [node("web-1"), node("db-1", "RedHat")]) == {"stored": 2, "refused": []}
    end(token, sync, since="2026-11-26T10:00:00+00:00")

    again = start(token)
    assert (again["full"], again["since"]) == (False, "2026-11-26T10:00:00+00:00")
    page(token, again, [node("web-1", report_status="failed")])
    end(token, again, since="2026-11-26T11:00:00+00:00")
    rows = {n.certname: n for n in Node.objects.filter(connection=connection[0])}
    assert set(rows) == {"web-1", "db-1"}  # an incremental sync drops nothing
    assert rows["web-1"].report_status == "failed"
    assert rows["db-1"].facts == {"os.family": "RedHat", "kernel": "Linux"}


def test_a_full_sync_drops_the_nodes_puppetdb_no_longer_has(token, connection):
    synced(token, [node("web-1"), node("gone-1")])
    Inventory.objects.filter(connection=connection[0]).update(full_synced_at=None)  # a day later
    sync = start(token)
    assert sync["full"]
    page(token, sync, [node("web-1")])
    assert end(token, sync) == {"dropped": 1}
    assert list(Node.objects.values_list("certname", flat=True)) == ["web-1"]


def test_a_changed_allow_list_makes_the_next_sync_full(token):
    synced(token, [node("web-1")])
    assert start(token, [*FACTS, "puppetversion"])["full"]


def test_a_failed_sync_keeps_the_time_so_nothing_is_lost(token, connection):
    synced(token, [node("web-1")])
    kept = Inventory.objects.get(connection=connection[0]).since
    sync = start(token)
    answer = bridge(token).post(
        f"{BASE}/syncs/{sync['id']}/done", {"error": "PuppetDB at x could not be reached"}, format="json"
    )
    assert answer.status_code == 200
    inventory = Inventory.objects.get(connection=connection[0])
    assert (inventory.since, inventory.last_error) == (kept, "PuppetDB at x could not be reached")
    assert start(token)["since"] == kept


def test_a_sync_under_way_refuses_a_second_until_it_has_been_idle(token, connection, settings):
    first = start(token)
    page(token, first, [node("a")])
    problem = assert_problem(bridge(token).post(f"{BASE}/syncs", {"facts": FACTS}, format="json"), 409)
    assert "A sync is under way" in problem["detail"]
    end(token, first)  # the first goes on undisturbed
    assert start(token)["id"] != first["id"]


def test_pages_of_a_sync_that_another_replaced_are_409(token, connection, settings):
    old = start(token)
    idle = datetime.now(UTC) - timedelta(seconds=settings.INVENTORY_SYNC_IDLE + 1)
    Inventory.objects.filter(connection=connection[0]).update(sync_touched_at=idle)  # its bridge died
    start(token)
    answer = bridge(token).put(f"{BASE}/syncs/{old['id']}/nodes", {"nodes": [node("a")]}, format="json")
    assert_problem(answer, 409)
    done = {"since": "2026-11-26T10:00:00+00:00"}
    assert_problem(bridge(token).post(f"{BASE}/syncs/{old['id']}/done", done, format="json"), 409)
    assert not Node.objects.exists()


def test_odd_certnames_and_bad_nodes_are_refused_alone_and_the_rest_of_the_page_kept(token, connection):
    sync = start(token)
    answer = page(
        token,
        sync,
        [
            node("Web 1; rm -rf"),
            node("ok-1"),
            node("late", report_timestamp="yesterday"),
            node("leaky", facts={"os.family": "Debian", "password": "hunter2"}),
            "not a node",
            node("big", facts={"kernel": "x" * 10000}),
        ],
    )
    reasons = {r["certname"]: r["reason"] for r in answer["refused"]}
    assert answer["stored"] == 2  # ok-1, and big without its fact
    assert "Not a certname Puppet issues" in reasons["Web 1; rm -rf"]
    assert "report_timestamp" in reasons["late"]
    assert "password not in the allow-list" in reasons["leaky"]
    assert "JSON object" in reasons["nodes[4]"]
    assert "facts.kernel: over" in reasons["big"]
    assert Node.objects.get(certname="big").facts == {}
    assert not Node.objects.filter(facts__has_key="password").exists()


def test_a_page_over_the_byte_bound_is_413_and_over_the_node_bound_400(token, settings):
    sync = start(token)
    body = json.dumps({"nodes": [node("a", facts={"kernel": "x" * 1000})] * 11000})
    assert len(body) > 10 * 1024 * 1024
    url = f"{BASE}/syncs/{sync['id']}/nodes"
    problem = assert_problem(bridge(token).generic("PUT", url, body, content_type="application/json"), 413)
    assert str(settings.INVENTORY_PAGE_MAX_BYTES) in problem["detail"]
    settings.INVENTORY_PAGE_MAX_NODES = 3
    problem = assert_problem(
        bridge(token).put(url, {"nodes": [node(f"n{i}") for i in range(4)]}, format="json"), 400
    )
    assert "At most 3 nodes a page" in json.dumps(problem)


@pytest.mark.parametrize(
    "body", [[], {"facts": "os.family"}, {"facts": ["os..family"]}, {"facts": ["a; drop"]}, {"facts": [1]}]
)
def test_an_invalid_allow_list_is_400(token, body):
    assert_problem(bridge(token).post(f"{BASE}/syncs", body, format="json"), 400)


def test_on_demand_a_sync_is_due_until_one_has_ended_after_the_request(token, connection, alice):
    synced(token, [node("a")])
    assert bridge(token).get(BASE).json()["due"] is False
    answer = client_for(alice).post(f"/api/connections/puppet/{connection[0].pk}/sync/")
    assert answer.status_code == 202
    assert bridge(token).get(BASE).json()["due"] is True
    synced(token, [node("a")])
    assert bridge(token).get(BASE).json()["due"] is False


def fleet(token: str) -> None:
    old = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    synced(
        token,
        [
            node("web-1"),
            node("web-2", report_status="failed"),
            node("db-1", "RedHat"),
            node("old-1", report_timestamp=old),
            node("off-1", deactivated=recent()),
            node("ttl-1", expired=recent(), report_timestamp=old),
        ],
    )


def names(answer) -> list[str]:
    assert answer.status_code == 200, answer.content
    return [n["certname"] for n in answer.json()["nodes"]]


def test_the_nodes_api_filters_by_fact_status_state_and_pages(token, connection, alice):
    fleet(token)
    api, url = client_for(alice), f"/api/connections/puppet/{connection[0].pk}/nodes/"
    assert names(api.get(url)) == ["db-1", "off-1", "old-1", "ttl-1", "web-1", "web-2"]
    assert names(api.get(url, {"fact.os.family": "RedHat"})) == ["db-1"]
    assert names(api.get(url, {"fact.os.family": "Debian", "status": "failed"})) == ["web-2"]
    assert names(api.get(url, {"state": "stale"})) == ["old-1"]
    assert names(api.get(url, {"state": "deactivated"})) == ["off-1"]
    assert names(api.get(url, {"state": "expired"})) == ["ttl-1"]
    assert names(api.get(url, {"state": "active", "certname": "web"})) == ["web-1", "web-2"]
    first = api.get(url, {"limit": 4})
    assert names(first) == ["db-1", "off-1", "old-1", "ttl-1"]
    assert names(api.get(first.json()["next"])) == ["web-1", "web-2"]
    one = api.get(url, {"certname": "web-1"}).json()["nodes"][0]
    assert (one["state"], one["environment"], one["facts"]) == (
        "active",
        "production",
        {"os.family": "Debian", "kernel": "Linux"},
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"fact.password": "x"}, "fact.password"),
        ({"fact.os.name": "Debian"}, "fact.os.name"),
        ({"status": "broken"}, "status"),
        ({"state": "asleep"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "٣"}, "limit"),
        ({"certname": "a\x00"}, "certname"),
    ],
)
def test_a_filter_outside_the_allow_list_or_unknown_is_400(token, connection, alice, params, field):
    fleet(token)
    answer = client_for(alice).get(f"/api/connections/puppet/{connection[0].pk}/nodes/", params)
    problem = assert_problem(answer, 400)
    assert field in json.dumps(problem)


def test_another_users_inventory_is_404(token, connection, bob):
    fleet(token)
    answer = client_for(bob).get(f"/api/connections/puppet/{connection[0].pk}/nodes/")
    assert_problem(answer, 404)
    answer = client_for(bob).post(
        f"/api/connections/puppet/{connection[0].pk}/preview/", {"scope": {"nodes": ["web-1"]}}, format="json"
    )
    assert_problem(answer, 404)


def test_the_preview_flags_unknown_stale_deactivated_and_expired_nodes(token, connection, alice):
    fleet(token)
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    scope = {"nodes": ["web-1", "new-1", "old-1", "off-1", "ttl-1"]}
    answer = client_for(alice).post(url, {"scope": scope}, format="json")
    assert answer.status_code == 200, answer.content
    shown = answer.json()
    assert (shown["resolved"], shown["count"], shown["flags"]) == (True, 5, [])
    assert [(n["certname"], n["state"]) for n in shown["nodes"]] == [
        ("web-1", "active"),
        ("new-1", "unknown"),
        ("old-1", "stale"),
        ("off-1", "deactivated"),
        ("ttl-1", "expired"),
    ]
    assert (shown["unknown"], shown["stale"], shown["deactivated"], shown["expired"]) == (
        ["new-1"],
        ["old-1"],
        ["off-1"],
        ["ttl-1"],
    )


def test_the_preview_of_a_pending_run_and_of_a_query(token, connection, alice):
    fleet(token)
    run = bridge(token).post("/_puppet/runs", {"scope": {"nodes": ["web-2", "who"]}}, format="json").json()
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    shown = client_for(alice).post(url, {"run": run["id"]}, format="json").json()
    assert shown["unknown"] == ["who"]
    query = client_for(alice).post(url, {"scope": {"query": "nodes[certname] {}"}}, format="json").json()
    assert (query["resolved"], query["flags"], query["nodes"]) == (False, [ASKED], [])
    bad = client_for(alice).post(url, {"scope": {"nodes": ["Bad Name"]}, "x": 1}, format="json")
    assert_problem(bad, 400)


def test_resolve_scope_for_other_code(token, connection):
    assert resolve_scope(connection[0], {"nodes": ["a", "b", "a"]}) == (["a", "b"], ["no inventory"])
    fleet(token)
    assert resolve_scope(connection[0], {"nodes": ["a"]}) == (["a"], [])
    assert resolve_scope(connection[0], {"query": ["=", "certname", "a"]}) == (None, [RESOLVED_AT_RUN_TIME])


def test_the_admin_lists_a_connections_nodes_filtered_by_fact_state_and_status(
    token, connection, client, alice, bob
):
    fleet(token)
    User = type(alice)
    User.objects.filter(pk__in=[alice.pk, bob.pk]).update(is_staff=True)
    client.force_login(alice)
    url = "/admin/inventory/node/"
    page = client.get(url)
    assert page.status_code == 200
    assert "os.family: Debian (5)" in page.content.decode()  # the fact filter's choices
    shown = client.get(url, {"fact": "os.family=RedHat"}).content.decode()
    assert "db-1" in shown and "web-1" not in shown
    shown = client.get(url, {"state": "stale"}).content.decode()
    assert "old-1" in shown and "web-1" not in shown
    shown = client.get(url, {"report_status": "failed"}).content.decode()
    assert "web-2" in shown and "web-1" not in shown
    client.force_login(bob)  # staff, but not the connection's owner, without view permissions
    assert "web-1" not in client.get(url).content.decode()


PREVIEWED = """apiVersion: v1
parameters:
  where:
    default: [web-1]
steps:
- name: a
  image: {noop}
- name: gate
  type: approval
  description: Run Puppet?
  dependsOn: a
- name: fixed
  image: relaysh/puppet-step-run
  dependsOn: gate
  spec:
    connection: !Connection {{type: puppet, name: prod-puppet}}
    scope: {{nodes: [web-1, new-1, off-1]}}
- name: computed
  image: relaysh/puppet-step-run
  dependsOn: gate
  spec:
    connection: !Connection {{type: puppet, name: prod-puppet}}
    scope: {{nodes: !Parameter where}}
"""


def test_the_approval_shows_each_puppet_run_steps_scope_preview(token, alice):
    from tests.workflow_helpers import NOOP, make_workflow, waiting_at_gate
    from workflows import engine

    fleet(token)
    run = engine.create_run(make_workflow(alice, PREVIEWED.format(noop=NOOP)), {})
    waiting_at_gate(run)
    client = Client()
    client.force_login(alice)
    page = client.get(f"/app/runs/{run.pk}/").content.decode()
    fixed = page[page.index('id="preview-fixed"') :]
    fixed = fixed[: fixed.index("</div>")]
    assert "3 nodes" in fixed
    assert "not in the inventory (accepted; maybe new): new-1" in fixed
    assert "deactivated</span> off-1" in fixed
    computed = page[page.index('id="preview-computed"') :]
    assert "its scope is computed when the step starts" in computed[: computed.index("</div>")]
    # The admin's approval page shows the same (to its owner, once staff).
    alice.is_staff = True
    alice.save()
    gate = run.steps.get(name="gate")
    admin_page = client.get(reverse("admin:workflows_approval_change", args=[gate.pk])).content.decode()
    shown = admin_page[admin_page.index('id="preview-fixed"') :]
    assert "not in the inventory (accepted; maybe new): new-1" in shown[: shown.index("</div>")]


@pytest.mark.parametrize("since", ["x", "2026-11-26 10:00:00", "2026-13-45T00:00:00Z", None])
def test_an_end_without_a_time_puppetdb_can_take_is_400_and_the_sync_goes_on(token, since):
    sync = start(token)
    answer = bridge(token).post(f"{BASE}/syncs/{sync['id']}/done", {"since": since}, format="json")
    assert "since" in json.dumps(assert_problem(answer, 400))
    end(token, sync)


def test_a_forged_node_cursor_is_an_invalid_cursor(token, connection, alice):
    import base64

    fleet(token)
    cursor = base64.b64encode(b"p=a\x00b").decode()
    url = f"/api/connections/puppet/{connection[0].pk}/nodes/"
    assert assert_problem(client_for(alice).get(url, {"cursor": cursor}), 404)["detail"] == "Invalid cursor"


def test_a_query_preview_is_asked_of_the_bridge_and_shown_once_it_answers(token, connection, alice):
    fleet(token)
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    ask = {"scope": {"query": ["=", ["fact", "kernel"], "Linux"]}}
    first = client_for(alice).post(url, ask, format="json").json()
    assert (first["resolved"], first["flags"]) == (False, [ASKED])
    client_for(alice).post(url, ask, format="json")  # asked once, not twice
    listed = bridge(token).get(BASE).json()["queries"]
    assert [q["query"] for q in listed] == [ask["scope"]["query"]]

    answers = [
        {"key": listed[0]["key"], "certnames": ["web-1", "off-1", "new-9"]},
        {"key": "nobody", "error": "x"},
    ]
    assert bridge(token).post(f"{BASE}/queries", {"answers": answers}, format="json").json() == {"taken": 1}
    assert bridge(token).get(BASE).json()["queries"] == []
    shown = client_for(alice).post(url, ask, format="json").json()
    assert (shown["resolved"], shown["count"], shown["unknown"], shown["deactivated"]) == (
        True,
        3,
        ["new-9"],
        ["off-1"],
    )
    assert shown["flags"][0].startswith("resolved by the bridge through PuppetDB at ")
    names, _ = resolve_scope(connection[0], ask["scope"])
    assert names == ["web-1", "off-1", "new-9"]


def test_a_query_puppetdb_refused_shows_its_message(token, connection, alice):
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    ask = {"scope": {"query": "nodes[certname] { nonsense"}}
    client_for(alice).post(url, ask, format="json")
    key = bridge(token).get(BASE).json()["queries"][0]["key"]
    error = "PuppetDB refused the query (400): PQL parse error at line 1"
    bridge(token).post(f"{BASE}/queries", {"answers": [{"key": key, "error": error}]}, format="json")
    shown = client_for(alice).post(url, ask, format="json").json()
    assert shown["resolved"] is False
    assert shown["flags"] == [f"PuppetDB could not resolve it: {error}"]


@pytest.mark.parametrize(
    "answers",
    [None, "x", [{"key": "k"}], [{"key": "k", "certnames": ["Bad Name"]}], [{"key": 1, "certnames": []}]],
)
def test_bad_query_answers_are_400(token, answers):
    assert_problem(bridge(token).post(f"{BASE}/queries", {"answers": answers}, format="json"), 400)


def test_the_admin_offers_no_connection_its_user_may_not_see(token, connection, client, bob):
    """The node list's connection filter names only the connections the user may see: the
    names of other users' connections are theirs to see (connections.permissions)."""
    fleet(token)
    for name in ("bob-puppet", "bob-lab"):
        PuppetConnection.create_with_token(owner=bob, name=name)
    type(bob).objects.filter(pk=bob.pk).update(is_staff=True)
    client.force_login(bob)
    page = client.get("/admin/inventory/node/")
    assert page.status_code == 200
    assert "prod-puppet" not in page.content.decode()


@pytest.mark.parametrize("value", ["os.family=\x00", "os\x00family=Debian"])
def test_a_nul_in_the_admins_fact_filter_is_no_500(token, connection, client, alice, value):
    fleet(token)
    type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
    client.force_login(alice)
    page = client.get("/admin/inventory/node/", {"fact": value})
    assert page.status_code < 500


def test_only_the_connections_owner_has_its_bridge_resolve_a_query(token, connection, alice):
    """A preview query runs on the owner's PuppetDB through their bridge, and a query can
    test any fact (`facts.secret ~ "^a"`), past the allow-list: staff who may only see the
    connection get the inventory's answer, and nothing is asked of the bridge."""
    from tests.test_api_permissions import user_with

    viewer = user_with("view_puppetconnection")
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    ask = {"scope": {"query": 'inventory[certname] { facts.secret ~ "^a" }'}}
    shown = client_for(viewer).post(url, ask, format="json").json()
    assert (shown["resolved"], shown["flags"]) == (False, [RESOLVED_AT_RUN_TIME])
    assert bridge(token).get(BASE).json()["queries"] == []
    shown = client_for(alice).post(url, ask, format="json").json()
    assert shown["flags"] == [ASKED]
    assert len(bridge(token).get(BASE).json()["queries"]) == 1


def test_a_query_naming_more_nodes_than_a_run_may_is_answered_as_such_and_the_others_kept(
    token, connection, alice, settings
):
    """One query matching more nodes than a run may name (RUN_MAX_NODES) refused every
    answer of the bridge's batch, each minute again: no preview was ever answered."""
    settings.RUN_MAX_NODES = 2
    url = f"/api/connections/puppet/{connection[0].pk}/preview/"
    wide, narrow = {"scope": {"query": "nodes[certname] {}"}}, {"scope": {"query": ["=", "certname", "a"]}}
    for ask in (wide, narrow):
        client_for(alice).post(url, ask, format="json")
    keys = {json.dumps(q["query"]): q["key"] for q in bridge(token).get(BASE).json()["queries"]}
    answers = [
        {"key": keys[json.dumps(wide["scope"]["query"])], "certnames": ["a", "b", "c"]},
        {"key": keys[json.dumps(narrow["scope"]["query"])], "certnames": ["a"]},
    ]
    answer = bridge(token).post(f"{BASE}/queries", {"answers": answers}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"taken": 2}
    assert client_for(alice).post(url, narrow, format="json").json()["nodes"][0]["certname"] == "a"
    flags = client_for(alice).post(url, wide, format="json").json()["flags"]
    assert flags == ["PuppetDB could not resolve it: the query names 3 nodes, more than a run may (2)."]


def test_only_whoever_may_change_the_connection_asks_for_a_sync_in_the_admin(
    token, connection, client, alice
):
    """As in the API (POST …/sync/ changes: the owner or a superuser): staff who may only
    see the connection do not set its bridge to work."""
    from tests.test_api_permissions import user_with

    synced(token, [node("web-1")])
    inventory_row = Inventory.objects.get()
    action = {"action": "sync_now", "_selected_action": [str(inventory_row.pk)]}
    client.force_login(user_with("view_puppetconnection"))
    client.post("/admin/inventory/inventory/", action)
    assert Inventory.objects.get().sync_requested_at is None
    type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
    client.force_login(alice)
    assert client.post("/admin/inventory/inventory/", action).status_code == 302
    assert Inventory.objects.get().sync_requested_at is not None
