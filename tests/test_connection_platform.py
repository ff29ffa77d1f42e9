"""A `puppet` connection's platform and backend are its settings (issue 18 §3): set in the
API and the admin, runs checked against them at creation, whatever the bridge's headers
say. The headers are recorded as `reported_*`, and a report that contradicts a setting is a
warning. A connection whose settings were never made behaves as before: its reported
platform decides, its reported backend does not."""

import pytest
from django.db import connection as db_connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from puppet_connection.models import PuppetConnection
from tests.conftest import bridge
from tests.runs_helpers import RUNS
from tests.test_connection_api import assert_problem

URL = "/api/connections/puppet/"
ADMIN = "/admin/puppet_connection/puppetconnection/"
NODES = {"nodes": ["web1.example.com"]}


def set_up(conn: PuppetConnection, **settings: str) -> PuppetConnection:
    PuppetConnection.objects.filter(pk=conn.pk).update(**settings)
    conn.refresh_from_db()
    return conn


def reporting(token: str, platform: str = "", backend: str = ""):
    """A bridge client that sends our bridge's headers."""
    client = bridge(token)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if platform:
        headers["HTTP_X_RELAY_PLATFORM"] = platform
    if backend:
        headers["HTTP_X_RELAY_BACKEND"] = backend
    client.credentials(**headers)
    return client


def refused(client, body: dict, pointer: str) -> str:
    problem = assert_problem(client.post(RUNS, body, format="json"), 400)
    assert [e["pointer"] for e in problem["errors"]] == [pointer], problem
    return problem["errors"][0]["detail"]


def created(client, body: dict) -> dict:
    response = client.post(RUNS, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


# --- the API ------------------------------------------------------------------------------


def test_the_api_creates_shows_and_changes_the_settings(alice_api):
    made = alice_api.post(URL, {"name": "fleet", "platform": "oss", "backend": "bolt"}, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["platform"], body["backend"]) == ("oss", "bolt")
    assert (body["reported_platform"], body["reported_backend"], body["warnings"]) == ("", "", [])
    url = f"{URL}{body['id']}/"
    changed = alice_api.patch(url, {"platform": "pe", "backend": "orchestrator"}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["platform"], changed.json()["backend"]) == ("pe", "orchestrator")
    shown = alice_api.get(url).json()
    assert (shown["platform"], shown["backend"]) == ("pe", "orchestrator")
    conn = PuppetConnection.objects.get(pk=body["id"])
    assert (conn.platform, conn.backend) == ("pe", "orchestrator")
    # Unset again: empty.
    assert alice_api.patch(url, {"platform": "", "backend": ""}, format="json").status_code == 200
    conn.refresh_from_db()
    assert (conn.platform, conn.backend) == ("", "")


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"platform": "enterprise"}, "#/platform"),
        ({"backend": "ansible"}, "#/backend"),
        ({"platform": None}, "#/platform"),
        ({"backend": ["bolt"]}, "#/backend"),
        ({"platform": "oss", "backend": "orchestrator"}, "#/backend"),
    ],
)
def test_bad_settings_are_400_with_a_pointer(alice_api, body, pointer):
    problem = assert_problem(alice_api.post(URL, {"name": "fleet", **body}, format="json"), 400)
    assert problem["errors"][0]["pointer"] == pointer
    assert not PuppetConnection.objects.exists()


def test_the_orchestrator_cannot_be_set_on_an_open_source_connection_by_halves(alice_api, connection):
    conn, _ = connection
    set_up(conn, platform="oss")
    problem = assert_problem(
        alice_api.patch(f"{URL}{conn.pk}/", {"backend": "orchestrator"}, format="json"), 400
    )
    assert (
        problem["errors"][0]["pointer"] == "#/backend"
        and "Puppet Enterprise" in problem["errors"][0]["detail"]
    )
    set_up(conn, platform="", backend="orchestrator")
    assert_problem(alice_api.patch(f"{URL}{conn.pk}/", {"platform": "oss"}, format="json"), 400)
    conn.refresh_from_db()
    assert (conn.platform, conn.backend) == ("", "orchestrator")


def test_a_header_is_recorded_never_made_a_setting_and_a_contradiction_is_a_warning(alice_api, connection):
    conn, token = connection
    set_up(conn, platform="oss", backend="ssh")
    reporting(token, "pe", "orchestrator").get(RUNS)
    conn.refresh_from_db()
    assert (conn.platform, conn.backend) == ("oss", "ssh")
    assert (conn.reported_platform, conn.reported_backend) == ("pe", "orchestrator")
    shown = alice_api.get(f"{URL}{conn.pk}/").json()
    assert (shown["platform"], shown["backend"]) == ("oss", "ssh")
    assert (shown["reported_platform"], shown["reported_backend"]) == ("pe", "orchestrator")
    assert len(shown["warnings"]) == 2
    assert "Puppet Enterprise" in shown["warnings"][0] and "open source Puppet" in shown["warnings"][0]
    assert "orchestrator" in shown["warnings"][1] and "ssh" in shown["warnings"][1]
    # The bridge agreeing: no warning.
    reporting(token, "oss", "ssh").get(RUNS)
    assert alice_api.get(f"{URL}{conn.pk}/").json()["warnings"] == []


def test_with_no_settings_a_report_is_no_warning(alice_api, connection):
    conn, token = connection
    reporting(token, "pe", "orchestrator").get(RUNS)
    assert alice_api.get(f"{URL}{conn.pk}/").json()["warnings"] == []


# --- runs checked against the settings ------------------------------------------------------


def test_ssh_takes_only_runs_on_a_list_of_nodes(connection):
    conn, token = connection
    set_up(conn, platform="oss", backend="ssh")
    client = bridge(token)
    assert "SSH" in refused(client, {"scope": {"query": "nodes { }"}}, "#/scope")
    refused(client, {"scope": {"node_group": "00000000-0000-4000-8000-000000000000"}}, "#/scope")
    assert "only type 'run'" in refused(
        client, {"type": "task-run", "name": "package", "targets": ["web1.example.com"]}, "#/type"
    )
    refused(client, {"type": "plan-run", "name": "deploy"}, "#/type")
    created(client, {"scope": NODES})


def test_bolt_takes_runs_on_nodes_and_tasks_on_open_source_but_no_plans(connection):
    conn, token = connection
    set_up(conn, platform="oss", backend="bolt")
    client = bridge(token)
    created(client, {"scope": NODES})
    created(
        client,
        {"type": "task-run", "name": "package", "params": {"name": "vim"}, "targets": ["web1.example.com"]},
    )
    created(client, {"type": "task-run", "name": "package", "scope": NODES, "targets": [{"uri": "web1"}]})
    refused(client, {"type": "task-run", "name": "package", "scope": {"query": "nodes { }"}}, "#/scope")
    refused(client, {"type": "task-run", "name": "package", "scope": {"node_group": "abc"}}, "#/scope")
    assert "runs no plans" in refused(client, {"type": "plan-run", "name": "deploy"}, "#/type")
    assert "Bolt" in refused(client, {"scope": {"query": "nodes { }"}}, "#/scope")
    refused(client, {"scope": {"application": "App[x]"}}, "#/scope")


def test_the_orchestrator_takes_everything_with_an_environment(connection):
    conn, token = connection
    set_up(conn, backend="orchestrator")  # implies Puppet Enterprise
    client = bridge(token)
    assert "Puppet Enterprise" in refused(client, {"scope": {"query": "nodes { }"}}, "#/environment")
    created(client, {"scope": {"query": "nodes { }"}, "environment": "production"})
    created(client, {"scope": {"node_group": "abc"}, "environment": "production"})
    created(client, {"type": "plan-run", "name": "deploy", "environment": "production"})
    created(client, {"type": "task-run", "name": "package", "targets": ["a"], "environment": "production"})
    task = {
        "type": "task-run",
        "name": "package",
        "scope": {"query": "nodes { }"},
        "environment": "production",
    }
    created(client, task)


def test_on_pe_task_and_plan_runs_may_leave_the_environment_to_the_orchestrator(connection):
    # PE's command/task and command/plan_run default to production, and the published
    # task-run-start and plan-run-start send `environment: null` when their spec has none.
    conn, token = connection
    set_up(conn, platform="pe", backend="orchestrator")
    client = bridge(token)
    task = created(client, {"type": "task-run", "name": "package", "scope": NODES, "environment": None})
    plan = created(client, {"type": "plan-run", "name": "deploy", "environment": None})
    assert "environment" not in task and "environment" not in plan
    assert "run an environment" in refused(client, {"scope": NODES, "environment": None}, "#/environment")


def test_pe_with_bolt_needs_an_environment_and_bolt_s_scopes(connection):
    conn, token = connection
    set_up(conn, platform="pe", backend="bolt")
    client = bridge(token)
    problem = assert_problem(client.post(RUNS, {"scope": {"query": "nodes { }"}}, format="json"), 400)
    assert sorted(e["pointer"] for e in problem["errors"]) == ["#/environment", "#/scope"]
    created(client, {"scope": NODES, "environment": "production"})


def test_open_source_with_no_backend_set_takes_only_runs_on_nodes(connection):
    conn, token = connection
    set_up(conn, platform="oss")
    client = bridge(token)
    assert "open source" in refused(client, {"type": "plan-run", "name": "deploy"}, "#/type")
    refused(client, {"scope": {"query": "nodes { }"}}, "#/scope")
    created(client, {"scope": NODES})


def test_the_bridge_s_headers_never_override_the_settings(connection):
    conn, token = connection
    set_up(conn, platform="oss", backend="ssh")
    pe_bridge = reporting(token, "pe", "orchestrator")
    refused(pe_bridge, {"scope": {"query": "nodes { }"}, "environment": "production"}, "#/scope")
    refused(pe_bridge, {"type": "plan-run", "name": "deploy", "environment": "production"}, "#/type")
    created(pe_bridge, {"scope": NODES})  # no environment needed: the setting says oss

    set_up(conn, platform="pe", backend="orchestrator")
    oss_bridge = reporting(token, "oss", "ssh")
    refused(oss_bridge, {"scope": NODES}, "#/environment")
    created(oss_bridge, {"scope": {"query": "nodes { }"}, "environment": "production"})
    conn.refresh_from_db()
    assert (conn.platform, conn.backend, conn.reported_platform) == ("pe", "orchestrator", "oss")


def test_the_shipped_agent_sends_no_header_and_the_settings_still_apply(connection):
    """The Ruby agent names neither platform nor backend: before the settings, nothing was
    checked for its connections."""
    conn, token = connection
    set_up(conn, platform="oss", backend="bolt")
    refused(bridge(token), {"scope": {"query": "nodes { }"}}, "#/scope")
    conn.refresh_from_db()
    assert (conn.reported_platform, conn.reported_backend) == ("", "")


def test_a_connection_never_set_behaves_as_before(connection):
    """What its bridge reports decides, as the headers did: the platform, and on open source
    whether the backend is Bolt; a reported backend restricts nothing else."""
    conn, token = connection
    set_up(conn, reported_platform="pe", reported_backend="ssh")
    client = bridge(token)
    refused(client, {"scope": NODES}, "#/environment")
    created(client, {"scope": {"query": "nodes { }"}, "environment": "production"})
    created(client, {"type": "plan-run", "name": "deploy", "environment": "production"})
    # On open source, a bridge that reports Bolt also runs tasks (no plans), as before.
    set_up(conn, reported_platform="oss", reported_backend="bolt")
    created(client, {"type": "task-run", "name": "package", "scope": {"nodes": ["a"]}})
    refused(client, {"type": "plan-run", "name": "deploy"}, "#/type")
    set_up(conn, reported_platform="oss", reported_backend="ssh")
    refused(client, {"type": "task-run", "name": "package", "scope": {"nodes": ["a"]}}, "#/type")
    set_up(conn, reported_platform="", reported_backend="ssh")
    created(client, {"scope": {"application": "App[x]"}})


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_what_the_bridge_reported_and_leaves_the_settings_empty(alice):
    conn, _ = PuppetConnection.create_with_token(owner=alice, name="old")
    before = [("puppet_connection", "0002_puppetconnection_bridge_backend_and_more")]
    executor = MigrationExecutor(db_connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("puppet_connection", "PuppetConnection")
        old.objects.filter(pk=conn.pk).update(platform="pe", bridge_backend="orchestrator")
    finally:
        executor = MigrationExecutor(db_connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    conn.refresh_from_db()
    assert (conn.reported_platform, conn.reported_backend) == ("pe", "orchestrator")
    assert (conn.platform, conn.backend) == ("", "")
    assert conn.platform_for_runs == "pe" and conn.bridge_warnings() == []


# --- the admin ------------------------------------------------------------------------------


@pytest.fixture
def own_connection(staff) -> tuple[PuppetConnection, str]:
    conn, token = PuppetConnection.create_with_token(owner=staff, name="fleet")
    return conn, str(token)


@pytest.fixture
def admin(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def test_the_admin_sets_the_settings_and_refuses_the_orchestrator_on_open_source(admin, own_connection):
    conn, _ = own_connection
    page = f"{ADMIN}{conn.pk}/change/"
    form = admin.get(page).content.decode()
    assert 'name="platform"' in form and 'name="backend"' in form
    saved = admin.post(page, {"name": "fleet", "description": "", "platform": "oss", "backend": "bolt"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    conn.refresh_from_db()
    assert (conn.platform, conn.backend) == ("oss", "bolt")
    wrong = admin.post(
        page, {"name": "fleet", "description": "", "platform": "oss", "backend": "orchestrator"}
    )
    assert wrong.status_code == 200
    assert "The orchestrator is part of Puppet Enterprise" in wrong.content.decode()
    conn.refresh_from_db()
    assert conn.backend == "bolt"


def test_the_admin_adds_a_connection_with_its_settings(admin, staff):
    page = admin.post(f"{ADMIN}add/", {"name": "new", "description": "", "owner": staff.pk, "platform": "pe"})
    assert page.status_code == 200  # the token, shown once
    conn = PuppetConnection.objects.get(name="new")
    assert (conn.platform, conn.backend) == ("pe", "")


def test_the_admin_page_warns_when_the_bridge_contradicts_a_setting(admin, own_connection):
    conn, token = own_connection
    set_up(conn, platform="oss", backend="bolt")
    assert "says it runs on" not in admin.get(f"{ADMIN}{conn.pk}/change/").content.decode()
    reporting(token, "pe", "bolt").get(RUNS)
    page = admin.get(f"{ADMIN}{conn.pk}/change/").content.decode()
    assert (
        "The bridge says it runs on Puppet Enterprise, but this connection is set to open source Puppet"
        in page
    )
    assert 'class="warning"' in page  # at the top of the page, too
    assert "<th>Platform</th><td>set to open source Puppet; the bridge says Puppet Enterprise</td>" in page


# --- PuppetDB: query scopes on open source Puppet (issue 21 §2) ------------------------------

QUERY = {"query": 'inventory[certname] { facts.os.family = "Debian" }'}
AST = {"query": ["=", ["fact", "kernel"], "Linux"]}


def test_the_api_sets_and_shows_puppetdb(alice_api):
    made = alice_api.post(URL, {"name": "fleet", "platform": "oss", "backend": "ssh"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["puppetdb"] is False
    url = f"{URL}{made.json()['id']}/"
    changed = alice_api.patch(url, {"puppetdb": True}, format="json")
    assert changed.status_code == 200, changed.content
    assert alice_api.get(url).json()["puppetdb"] is True
    assert PuppetConnection.objects.get(pk=made.json()["id"]).puppetdb is True
    problem = assert_problem(alice_api.patch(url, {"puppetdb": "maybe"}, format="json"), 400)
    assert problem["errors"][0]["pointer"] == "#/puppetdb"


@pytest.mark.parametrize("backend", ["ssh", "bolt", ""])
def test_open_source_with_puppetdb_takes_query_scopes_not_node_groups(connection, backend):
    conn, token = connection
    set_up(conn, platform="oss", backend=backend)
    client = bridge(token)
    detail = refused(client, {"scope": QUERY}, "#/scope")
    assert "scope `query` needs the PE orchestrator, or PuppetDB" in detail, detail

    set_up(conn, puppetdb=True)
    run = created(client, {"scope": QUERY})
    assert run["scope"] == QUERY
    assert created(client, {"scope": AST})["scope"] == AST
    detail = refused(client, {"scope": {"node_group": "00000000-0000-4000-8000-000000000000"}}, "#/scope")
    assert "scope `node_group` needs the PE orchestrator" in detail, detail
    if backend == "bolt":
        created(client, {"type": "task-run", "name": "package", "scope": QUERY})


@pytest.mark.parametrize(
    "query",
    [[], {"a": 1}, 7, "", ["x" * 10001], "y" * 10001, ["=", "certname", "a\x00b"]],
)
def test_a_query_that_is_neither_pql_nor_an_ast_is_400(connection, query):
    conn, token = connection
    set_up(conn, platform="oss", backend="ssh", puppetdb=True)
    problem = assert_problem(bridge(token).post(RUNS, {"scope": {"query": query}}, format="json"), 400)
    assert [e["pointer"].startswith("#/scope/query") for e in problem["errors"]] == [True], problem


def test_the_admin_edits_puppetdb(staff, connection):
    conn, _ = connection
    admin = Client()
    admin.force_login(staff)
    page = admin.get(f"{ADMIN}{conn.pk}/change/")
    assert b'name="puppetdb"' in page.content
