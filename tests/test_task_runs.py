"""Task runs in the published shape (integration contract §1, issue 18 §2), over real HTTP.

`published_task_run_start_body` is what relay-integrations/relay-puppet's
steps/task-run-start/step.py POSTs, modelled from its source: exactly the keys
`type, environment, scope, name, params, noop, targets`, where a spec field it does not
have is `get_or_default`'s default (environment None, params {}, noop False, targets []).
`ruby_task_run_from_h` is what puppetlabs-relay 2.5.1's agent does with each run of
`GET _puppet/runs` whose type is `task-run` (Model::TaskRun.from_h and Scope.from_h): it
raises on a run without `scope` or `name`, or with a scope that is not exactly one known
item, and the agent process exits."""

import pytest
import requests
from django.contrib.auth.models import User

from puppet_connection.models import PuppetConnection
from runs.models import Run, Status

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE_KEYS = {"nodes", "application", "query", "node_group"}  # Scope's descendants, by key


class MissingScopeError(Exception):
    pass


def ruby_task_run_from_h(run: dict) -> dict:
    if "scope" not in run:
        raise MissingScopeError(run["id"])
    scope = run["scope"]
    if len(scope) != 1:
        raise ValueError("Scope must have exactly one item")
    if next(iter(scope)) not in SCOPE_KEYS:
        raise ValueError(f"Scope {next(iter(scope))!r} does not exist")
    if "name" not in run:
        raise ValueError("MissingNameError")
    return {"environment": None, "params": {}, "noop": False, "targets": [], **run}


def published_task_run_start_body(spec: dict) -> dict:
    return {
        "type": "task-run",
        "environment": spec.get("environment"),
        "scope": spec["scope"],
        "name": spec["name"],
        "params": spec.get("params", {}),
        "noop": spec.get("noop", False),
        "targets": spec.get("targets", []),
    }


@pytest.fixture
def token(transactional_db) -> str:
    owner = User.objects.create_user("alice")
    return str(PuppetConnection.create_with_token(owner=owner, name="prod")[1])


def session(token: str, **headers: str) -> requests.Session:
    """The published step's and the Ruby agent's requests: a Bearer token, no other header
    of ours. With `X-Relay-Backend` (and relay-bridge's User-Agent): this service's bridge."""
    client = requests.Session()
    client.headers.update({"Authorization": f"Bearer {token}", **headers})
    return client


OUR_BRIDGE = {"X-Relay-Platform": "oss", "X-Relay-Backend": "bolt", "User-Agent": "relay-bridge/0.1.0"}


@pytest.mark.parametrize(
    "spec",
    [
        {"scope": {"nodes": ["web1", "web2"]}, "name": "package"},
        {
            "environment": "production",
            "scope": {"query": "inventory[certname] { facts.os.family = 'RedHat' }"},
            "name": "package::install",
            "params": {"name": "nginx", "version": "1.24"},
            "noop": True,
            "targets": [
                {"name": "web1", "uri": "ssh://web1.example.com", "config": {"ssh": {"user": "ops"}}}
            ],
        },
        {"scope": {"node_group": "00000000-0000-4000-8000-000000000000"}, "name": "facts"},
    ],
)
def test_the_published_task_run_start_body_is_taken_and_served(live_server, token, spec):
    client = session(token)
    body = published_task_run_start_body(spec)
    created = client.post(f"{live_server.url}/_puppet/runs", json=body, timeout=10)
    assert created.status_code == 201, created.text
    run = created.json()
    # As sent, but an environment of null, which is no key: the agent takes its own then.
    sent = {key: value for key, value in body.items() if not (key == "environment" and value is None)}
    assert {key: run[key] for key in sent} == sent and ("environment" in run) == ("environment" in sent)
    assert run["state"]["status"] == "pending"
    # The step polls the run itself until it is no longer pending.
    assert client.get(f"{live_server.url}/_puppet/runs/{run['id']}", timeout=10).json() == run
    # The Ruby agent lists it, with its scope, and can read it.
    [listed] = client.get(f"{live_server.url}/_puppet/runs", timeout=10).json()["runs"]
    assert listed == run
    parsed = ruby_task_run_from_h(listed)
    assert (parsed["scope"], parsed["name"], parsed["targets"]) == (
        spec["scope"],
        spec["name"],
        body["targets"],
    )


def test_our_create_api_turns_certname_targets_into_a_scope(live_server, token):
    """Our own clients' earlier shape (certnames as targets, no scope) is still taken, and
    stored in the published one, so no new run needs a scope the agent lacks."""
    old = {"type": "task-run", "name": "package", "params": {}, "targets": ["web1", "web2", "web1"]}
    run = session(token).post(f"{live_server.url}/_puppet/runs", json=old, timeout=10).json()
    assert (run["scope"], run["targets"]) == ({"nodes": ["web1", "web2"]}, [])
    stored = Run.objects.get(pk=run["id"])
    assert (stored.scope, stored.targets) == ({"nodes": ["web1", "web2"]}, [])
    ruby_task_run_from_h(run)


@pytest.mark.parametrize(
    ("body", "pointer", "detail"),
    [
        ({"type": "task-run", "name": "x"}, "#/scope", "A task run needs a scope"),
        ({"type": "task-run", "name": "x", "targets": [{"name": "a"}]}, "#/scope", "needs a scope"),
        ({"type": "task-run", "scope": {"application": "App[x]"}, "name": "x"}, "#/scope", "not application"),
        (
            {"type": "task-run", "scope": {"nodes": ["a"]}, "name": "x", "targets": ["a"]},
            "#/targets",
            "objects",
        ),
        (
            {"type": "task-run", "scope": {"nodes": ["a"]}, "name": "x", "targets": [7]},
            "#/targets/0",
            "target",
        ),
        (
            {
                "type": "task-run",
                "scope": {"nodes": ["a"]},
                "name": "x",
                "targets": [{"name": "a", "config": {"ssh": {"password": "hunter2"}}}],
            },
            "#/targets/0",
            "`password` is a credential",
        ),
        (
            {"type": "task-run", "scope": {"nodes": ["a"]}, "name": "x", "targets": [{"name": "a" * 70000}]},
            "#/targets",
            "bytes",
        ),
        ({"type": "plan-run", "name": "x", "scope": {"nodes": ["a"]}}, "#/scope", "no scope"),
    ],
)
def test_task_runs_that_do_not_fit_are_400_pointing_at_the_field(live_server, token, body, pointer, detail):
    answer = session(token).post(f"{live_server.url}/_puppet/runs", json=body, timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    errors = {e["pointer"]: e["detail"] for e in answer.json()["errors"]}
    assert pointer in errors and detail in errors[pointer], errors
    assert "hunter2" not in answer.text
    assert Run.objects.count() == 0


def test_a_plan_run_is_name_and_params_with_the_published_body(live_server, token):
    body = {"type": "plan-run", "environment": None, "name": "app::deploy", "params": {}}  # plan-run-start's
    answer = session(token).post(f"{live_server.url}/_puppet/runs", json=body, timeout=10)
    assert answer.status_code == 201, answer.text
    run = answer.json()
    assert (run["name"], run["params"]) == ("app::deploy", {})
    # No environment is no key (not null): the shipped agent then takes Puppet[:environment].
    assert "environment" not in run
    assert "scope" not in run and "targets" not in run


def old_task_run(status: str = Status.PENDING) -> Run:
    """A task run as this service stored them before scopes: certnames as targets, no scope."""
    return Run.objects.create(
        connection=PuppetConnection.objects.get(),
        type="task-run",
        name="package",
        params={"name": "nginx"},
        targets=["web1", "web2"],
        status=status,
    )


def test_old_task_runs_are_listed_to_our_bridge_only(live_server, token):
    pending, held = old_task_run(), old_task_run(Status.IN_PROGRESS)
    new = session(token).post(
        f"{live_server.url}/_puppet/runs",
        json=published_task_run_start_body({"scope": {"nodes": ["web3"]}, "name": "package"}),
        timeout=10,
    )
    url = f"{live_server.url}/_puppet/runs"

    # The agent parses every listed run, pending or not: one without a scope kills it.
    agent_runs = session(token, **{"User-Agent": "Ruby"}).get(url, timeout=10).json()["runs"]
    assert [r["id"] for r in agent_runs] == [new.json()["id"]]
    for run in agent_runs:
        ruby_task_run_from_h(run)
    with pytest.raises(MissingScopeError):
        ruby_task_run_from_h(session(token).get(f"{url}/{pending.id}", timeout=10).json())

    # Without `status` the list offers only the runs nobody holds (issue 18 §1); the held one
    # is listed to whoever asks for it by its status.
    ours = session(token, **OUR_BRIDGE).get(url, timeout=10).json()["runs"]
    assert [r["id"] for r in ours] == [str(pending.id), new.json()["id"]]
    working = session(token, **OUR_BRIDGE).get(url, params={"status": "in-progress"}, timeout=10)
    assert [r["id"] for r in working.json()["runs"]] == [str(held.id)]
    agent_held = session(token, **{"User-Agent": "Ruby"}).get(
        url, params={"status": "in-progress"}, timeout=10
    )
    assert agent_held.json()["runs"] == []
    first = ours[0]
    assert (first["targets"], first["name"], first["params"]) == (
        ["web1", "web2"],
        "package",
        {"name": "nginx"},
    )
    assert "scope" not in first  # as such runs always showed
    # Paged and filtered lists too.
    paged = session(token, **OUR_BRIDGE).get(url, params={"status": "pending", "limit": 1}, timeout=10)
    assert [r["id"] for r in paged.json()["runs"]] == [str(pending.id)]
    assert session(token).get(url, params={"status": "pending"}, timeout=10).json()["runs"] == [new.json()]


def test_on_open_source_puppet_a_bolt_bridge_takes_task_runs_on_nodes(live_server, token):
    def create(backend: str, body: dict) -> requests.Response:
        headers = {"X-Relay-Platform": "oss", "X-Relay-Backend": backend}
        body = {"type": "task-run", "name": "package", **body}
        return session(token, **headers).post(f"{live_server.url}/_puppet/runs", json=body, timeout=10)

    assert create("bolt", {"scope": {"nodes": ["a"]}}).status_code == 201
    refused = create("bolt", {"scope": {"query": "nodes {}"}})  # Bolt cannot ask PuppetDB
    assert [e["pointer"] for e in refused.json()["errors"]] == ["#/scope"]
    refused = create("ssh", {"scope": {"nodes": ["a"]}})
    assert [e["pointer"] for e in refused.json()["errors"]] == ["#/type"]
    assert "tasks need Bolt or the PE orchestrator" in refused.json()["errors"][0]["detail"]
