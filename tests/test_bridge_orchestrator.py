"""The PE orchestrator backend, worked by the bridge's run worker against a live server of
the project and the orchestrator stand-in (tests/standins/orchestrator.py, contract §4):
every job state and error kind to its outcome, paging of node results, retries, cancel,
tasks and plans, TLS against the Puppet CA, and re-attaching after a restart."""

import pytest
from relay_bridge.api import RelayClient
from relay_bridge.backends import choose, make
from relay_bridge.backends.orchestrator import OrchestratorBackend
from relay_bridge.config import Config, ConfigError
from relay_bridge.worker import RunWorker

from puppet_connection.models import PuppetConnection
from runs.models import Run, RunTransition
from tests.standins.orchestrator import Orchestrator, make_tls

pytestmark = pytest.mark.django_db(transaction=True)


def backend_for(pe: Orchestrator, **options) -> OrchestratorBackend:
    settings = {"api_url": pe.url, "token": pe.token, "cacert": str(pe.ca), **options}
    return OrchestratorBackend(settings, backoff=0.01)


def work(relay: RelayClient, backend: OrchestratorBackend, tmp_path, body: dict | None = None) -> Run:
    body = body or {"scope": {"nodes": ["web1", "web2"]}}
    created = relay.create_run({"environment": "production", **body})
    RunWorker(relay, backend, created, tmp_path / "state", heartbeat=0.05).work()
    return Run.objects.get(pk=created["id"])


def sent(pe: Orchestrator, method: str, path: str) -> list[dict]:
    return [r for r in pe.seen if r["method"] == method and r["path"].split("?")[0].endswith(path)]


def test_a_finished_job_finishes_the_run_with_its_nodes(pe, relay, tmp_path):
    pe.script = ["new", "ready", "running", "finished"]  # every state before the final ones: poll on
    run = work(relay, backend_for(pe), tmp_path)

    assert (run.status, run.outcome, run.job_id) == ("complete", "finished", "81")
    assert run.run_results["job"] == {"name": "81", "state": "finished"}
    assert [n["name"] for n in run.run_results["nodes"]] == ["web1", "web2"]
    assert {n["state"] for n in run.run_results["nodes"]} == {"finished"}
    [deploy] = sent(pe, "POST", "/command/deploy")
    assert deploy["body"] == {
        "environment": "production",
        "scope": {"nodes": ["web1", "web2"]},
        "description": f"Relay run {run.id}",
        "no_noop": True,
    }
    assert deploy["headers"]["X-Authentication"] == pe.token
    # The job name, not its URL, is the run's job_id from the first in-progress state on.
    in_progress = RunTransition.objects.get(run=run, to_status="in-progress")
    assert in_progress is not None and run.job_id == "81"
    assert len(sent(pe, "GET", "/jobs/81")) == 4  # one poll per heartbeat until final


@pytest.mark.parametrize(
    ("final", "outcome", "node_state"),
    [("failed", "failed", "failed"), ("stopped", "failed", "stopped")],
)
def test_failed_and_stopped_jobs_are_final(pe, relay, tmp_path, final, outcome, node_state):
    pe.script = ["running", final]
    run = work(relay, backend_for(pe), tmp_path)
    assert (run.status, run.outcome) == ("complete", outcome)
    assert run.run_results["job"]["state"] == final
    assert {n["state"] for n in run.run_results["nodes"]} == {node_state}
    if final == "stopped":  # stopped by someone in PE, not by a cancel from Relay
        assert run.run_results["result"]["msg"] == "The orchestrator job 81 was stopped."


def test_noop_flags_and_scopes_go_as_the_contract_says(pe, relay, tmp_path):
    pe.queries["nodes[certname] { }"] = ["db1"]
    pe.node_groups["00000000-group"] = ["app1", "app2"]
    backend = backend_for(pe, concurrency=4)
    for scope in ({"query": "nodes[certname] { }"}, {"node_group": "00000000-group"}):
        body = {
            "scope": scope,
            "environment": "staging",
            "noop": True,
            "debug": True,
            "trace": True,
            "evaltrace": True,
        }
        assert work(relay, backend, tmp_path, body).outcome == "finished"
    bodies = [r["body"] for r in sent(pe, "POST", "/command/deploy")]
    assert [b["scope"] for b in bodies] == [
        {"query": "nodes[certname] { }"},
        {"node_group": "00000000-group"},
    ]
    for body in bodies:
        assert body["noop"] is True and "no_noop" not in body  # never both
        assert (body["debug"], body["trace"], body["evaltrace"], body["concurrency"]) == (True, True, True, 4)


def test_node_results_are_read_page_by_page(pe, relay, tmp_path):
    nodes = [f"node{i:03d}.example.com" for i in range(250)]
    run = work(
        relay,
        backend_for(pe, page_size=100),
        tmp_path,
        {"scope": {"nodes": nodes}, "environment": "production"},
    )
    assert [n["name"] for n in run.run_results["nodes"]] == nodes
    pages = [r["path"] for r in sent(pe, "GET", "/jobs/81/nodes")]
    assert pages == [
        "/orchestrator/v1/jobs/81/nodes?limit=100&offset=0",
        "/orchestrator/v1/jobs/81/nodes?limit=100&offset=100",
        "/orchestrator/v1/jobs/81/nodes?limit=100&offset=200",
    ]


@pytest.mark.parametrize(
    ("body", "kind", "msg"),
    [
        (
            {"scope": {"nodes": ["a"]}, "environment": "nowhere"},
            "puppetlabs.orchestrator/unknown-environment",
            "Unknown environment nowhere",
        ),
        (
            {"scope": {"query": "broken["}},
            "puppetlabs.orchestrator/query-error",
            "Error parsing query broken[",
        ),
        (
            {"scope": {"node_group": "gone"}},
            "puppetlabs.orchestrator/unknown-node-group",
            "Unknown node group gone",
        ),
    ],
)
def test_an_orchestrator_4xx_completes_the_run_error_with_its_kind_and_msg(
    pe, relay, tmp_path, body, kind, msg
):
    run = work(relay, backend_for(pe), tmp_path, body)
    assert (run.status, run.outcome) == ("complete", "error")
    assert run.run_results["result"]["kind"] == kind
    assert msg in run.run_results["result"]["msg"]


@pytest.mark.parametrize(
    ("fields", "msg"),
    [
        (
            {"scope": {"nodes": ["web1", "-oX=y"]}},
            "The run names a node that is not a valid certname: '-oX=y'.",
        ),
        ({"scope": {"nodes": ["Web1"]}}, "The run names a node that is not a valid certname: 'Web1'."),
        ({"scope": {"nodes": "web1"}}, "The run names no nodes."),
        (
            {"type": "task-run", "name": "package", "params": {}, "targets": ["a", "@t"]},
            "The run names a node that is not a valid certname: '@t'.",
        ),
        (
            {"scope": {"nodes": ["web1"]}, "environment": "production\nx"},
            "The run's environment is not a valid environment name: 'production\\nx'.",
        ),
    ],
)
def test_node_names_and_environments_the_service_would_refuse_never_reach_pe(
    pe, relay, tmp_path, fields, msg
):
    """Written straight into the database (the API refuses them), as a rogue service lists them."""
    inserted = Run.objects.create(connection=PuppetConnection.objects.get(), **fields)
    run = relay.get_run(str(inserted.id))
    RunWorker(relay, backend_for(pe), run, tmp_path / "state", heartbeat=0.05).work()
    inserted.refresh_from_db()
    assert (inserted.status, inserted.outcome) == ("complete", "error")
    assert (
        "not a valid" in inserted.run_results["result"]["msg"]
        or "names no" in inserted.run_results["result"]["msg"]
    )
    assert [r for r in pe.seen if r["method"] == "POST"] == []


def test_a_wrong_rbac_token_is_an_error_with_rbac_s_kind(pe, relay, tmp_path):
    run = work(relay, backend_for(pe, token="expired-token"), tmp_path)
    assert run.outcome == "error"
    assert run.run_results["result"]["kind"] == "puppetlabs.rbac/user-unauthenticated"
    assert run.run_results["result"]["status"] == 401
    assert "expired-token" not in str(run.run_results)


def test_orchestrator_5xx_is_retried(pe, relay, tmp_path):
    pe.fail_next = [503, 502]  # the deploy, twice
    pe.script = ["running", "running", "finished"]
    run = work(relay, backend_for(pe), tmp_path)
    assert run.outcome == "finished"
    assert len(sent(pe, "POST", "/command/deploy")) == 3


def test_a_failing_poll_is_tried_again_at_the_next_heartbeat(pe, relay, tmp_path):
    pe.script = ["running", "running", "finished"]
    backend = backend_for(pe)
    created = relay.create_run({"scope": {"nodes": ["a"]}, "environment": "production"})
    worker = RunWorker(relay, backend, created, tmp_path / "state", heartbeat=0.05)
    original = backend.call

    def flaky(method, path, *args, **kwargs):
        if method == "GET" and path == "jobs/81" and not flaky.failed:
            flaky.failed = True
            pe.fail_next = [500, 500]  # both tries of this poll
        return original(method, path, *args, **kwargs)

    flaky.failed = False
    backend.call = flaky
    assert worker.work() == "finished"


def test_tls_is_verified_against_the_puppet_ca(pe, relay, tmp_path):
    other_ca, _, _ = make_tls(tmp_path / "other")
    run = work(relay, backend_for(pe, cacert=str(other_ca)), tmp_path)
    assert run.outcome == "error"
    assert "CERTIFICATE_VERIFY_FAILED" in run.run_results["result"]["msg"]
    assert not pe.seen  # nothing was sent to a server the CA did not vouch for


def test_a_cancel_stops_the_job_and_completes_cancelled(pe, relay, tmp_path):
    pe.script = ["running"] * 1000
    backend = backend_for(pe)
    created = relay.create_run({"scope": {"nodes": ["a"]}, "environment": "production"})
    worker = RunWorker(relay, backend, created, tmp_path / "state", heartbeat=0.05)
    original = backend.call

    def cancel_on_third_poll(method, path, *args, **kwargs):
        if method == "GET" and path == "jobs/81" and len(sent(pe, "GET", "/jobs/81")) == 2:
            relay.cancel(created["id"])
        return original(method, path, *args, **kwargs)

    backend.call = cancel_on_third_poll
    assert worker.work() == "cancelled"
    [stop] = sent(pe, "POST", "/command/stop")
    assert stop["body"] == {"job": "81"}
    run = Run.objects.get(pk=created["id"])
    assert run.run_results["job"]["state"] == "stopped"


def test_task_and_plan_runs(pe, relay, tmp_path):
    backend = backend_for(pe)
    task = work(
        relay,
        backend,
        tmp_path,
        {
            "type": "task-run",
            "name": "package",
            "params": {"name": "nginx", "action": "status"},
            "targets": ["a"],
        },
    )
    assert task.outcome == "finished"
    [command] = sent(pe, "POST", "/command/task")
    assert command["body"]["task"] == "package"
    assert command["body"]["params"] == {"name": "nginx", "action": "status"}
    assert command["body"]["scope"] == {"nodes": ["a"]}

    pe.script = ["running", "success"]
    pe.plan_result = {"deployed": ["a", "b"]}
    plan = work(
        relay, backend, tmp_path, {"type": "plan-run", "name": "app::deploy", "params": {"version": "2"}}
    )
    assert (plan.outcome, plan.job_id) == ("success", "82")
    assert plan.run_results == {"plan_job": "82", "state": "success", "result": {"deployed": ["a", "b"]}}
    [command] = sent(pe, "POST", "/command/plan_run")
    assert command["body"]["plan_name"] == "app::deploy"
    pe.script = ["running", "failure"]
    assert work(relay, backend, tmp_path, {"type": "plan-run", "name": "app::deploy"}).outcome == "failure"


def test_pe_is_detected_and_the_orchestrator_url_defaults_to_this_host(pe, tmp_path):
    config = Config("https://relay.example/", "rlyp_x", None, {}, None, tmp_path)
    assert choose(config, which=lambda name: "/usr/bin/bolt", pe=True) == "orchestrator"
    assert choose(config, which=lambda name: None, pe=False) == "ssh"
    with_options = Config(
        "https://relay.example/",
        "rlyp_x",
        None,
        {"orchestrator": {"token": "secret-rbac-token", "cacert": str(pe.ca)}},
        None,
        tmp_path,
    )
    backend = make(with_options, pe=True)
    assert (backend.name, backend.platform) == ("orchestrator", "pe")
    assert backend.api_url.startswith("https://") and backend.api_url.endswith(":8143/orchestrator/v1")
    assert "secret-rbac-token" not in repr(backend)
    with pytest.raises(ConfigError) as error:
        OrchestratorBackend({"token_file": str(tmp_path / "missing"), "cacert": str(pe.ca)})
    assert error.value.key == "backend_orchestrator_token_file"


def test_the_job_id_survives_a_lost_first_heartbeat(pe, relay, live_server, tmp_path):
    from tests.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(live_server.url)
    proxy.fail("PUT", r"/state$", "503", "503", body=r'"status": ?"in-progress"')  # both tries of the first
    pe.script = ["running", "running", "finished"]
    created = relay.create_run({"scope": {"nodes": ["a"]}, "environment": "production"})
    flaky = RelayClient(proxy.url, relay.session.headers["Authorization"].split()[1], attempts=2)
    try:
        assert (
            RunWorker(flaky, backend_for(pe), created, tmp_path / "state", heartbeat=0.05).work()
            == "finished"
        )
    finally:
        flaky.close()
        proxy.stop()
    assert not proxy.rules
    assert Run.objects.get(pk=created["id"]).job_id == "81"
