"""Query scopes on open-source backends (issue 21 §2): the bridge (`relay-bridge poll --once`
with `puppetdb_url`, and its run worker) resolves a run's PuppetDB query to certnames through
the session's real PuppetDB (tests/puppetdb.py), then runs them over SSH (the tests' sshd,
a stand-in `puppet` on the nodes) or Bolt (the Bolt stand-in) like a node list. The nodes
are synthetic, fed through PuppetDB's command API; each test names its own by a prefix."""

import json
import stat
from pathlib import Path

import pytest
import yaml
from relay_bridge.api import RelayClient
from relay_bridge.backends import make
from relay_bridge.config import load
from relay_bridge.worker import RunWorker

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.bao import free_port
from tests.bridge_helpers import bridge_config, completed, relay_bridge
from tests.puppetdb import PuppetDB

pytestmark = pytest.mark.django_db(transaction=True)

DEBIAN = 'inventory[certname] { facts.os.family = "Debian" and facts.fleet = "%s" }'


def fleet(puppetdb: PuppetDB, name: str, families: list[str]) -> list[str]:
    """Nodes `<name>-<n>` with these OS families and fact `fleet` = name."""
    nodes = [f"{name}-{n}" for n in range(len(families))]
    for node, family in zip(nodes, families, strict=True):
        puppetdb.replace_facts(node, {"os": {"family": family}, "kernel": "Linux", "fleet": name})
    return nodes


def with_puppetdb(config: Path, **keys: str) -> Path:
    """PuppetDB for the query scopes; the stand-in puppet sends no reports, so none are
    waited for (tests/test_bridge_evidence.py reads them)."""
    values = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**values, "puppetdb_report_wait": 0, **keys}))
    return config


def ran_on(calls: Path) -> list[str]:
    """The nodes the stand-in puppet ran on (its log's start lines)."""
    return sorted(line.split()[3] for line in calls.read_text().splitlines() if line.startswith("start"))


def test_a_pql_query_is_resolved_by_the_bridge_and_run_over_ssh(oss, sshd, puppetdb, tmp_path):
    nodes = fleet(puppetdb, "pql", ["Debian", "RedHat", "Debian"])
    calls = tmp_path / "calls"
    config = bridge_config(tmp_path, oss, sshd, {n: {"FAKE_PUPPET_LOG": str(calls)} for n in nodes})
    with_puppetdb(config, puppetdb_url=puppetdb.url)
    query = DEBIAN % "pql"
    run_id = oss.client.create_run({"scope": {"query": query}})["id"]
    assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10) == 0

    run = completed(run_id)
    assert run.outcome == "finished", run.run_results
    assert ran_on(calls) == ["pql-0", "pql-2"]
    assert [n["name"] for n in run.run_results["nodes"]] == ["pql-0", "pql-2"]
    resolved = run.run_results["query"]
    assert (resolved["query"], resolved["nodes"]) == (query, ["pql-0", "pql-2"])
    assert resolved["resolved_at"] <= run.updated_at.isoformat()
    assert run.scope == {"query": query}  # the run keeps what was asked


def test_an_ast_query_over_tls_with_the_given_certificates(oss, sshd, puppetdb, tmp_path):
    nodes = fleet(puppetdb, "ast", ["RedHat", "Debian"])
    calls = tmp_path / "calls"
    config = bridge_config(tmp_path, oss, sshd, {n: {"FAKE_PUPPET_LOG": str(calls)} for n in nodes})
    ssl = puppetdb.ssl_dir
    with_puppetdb(
        config,
        puppetdb_url=puppetdb.ssl_url,
        puppetdb_cert=str(ssl / "certs" / "localhost.pem"),
        puppetdb_key=str(ssl / "private_keys" / "localhost.pem"),
        puppetdb_cacert=str(puppetdb.ca()),
    )
    query = ["and", ["=", ["fact", "fleet"], "ast"], ["~", "certname", "-0$"]]
    run_id = oss.client.create_run({"scope": {"query": query}})["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)

    run = completed(run_id)
    assert run.outcome == "finished", run.run_results
    assert ran_on(calls) == ["ast-0"]
    assert run.run_results["query"]["nodes"] == ["ast-0"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (DEBIAN % "nobody", "The query matched no nodes."),
        ("inventory[certname] { facts.os.family = }", "PuppetDB refused the query (400): PQL parse error"),
        (["=", ["fact", "kernel"]], "PuppetDB refused the query (400): "),
        ('facts[value] { name = "kernel" }', "The query's results have no certname"),
    ],
)
def test_a_query_that_matches_nothing_or_is_invalid_ends_in_error_with_puppetdbs_message(
    oss, sshd, puppetdb, tmp_path, query, message
):
    calls = tmp_path / "calls"
    config = bridge_config(tmp_path, oss, sshd, {})
    with_puppetdb(config, puppetdb_url=puppetdb.url)
    run_id = oss.client.create_run({"scope": {"query": query}})["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)

    run = completed(run_id)
    assert (run.status, run.outcome) == ("complete", "error")
    result = run.run_results["result"]
    assert result["msg"].startswith(message), result
    assert result["query"] == query
    assert not calls.exists()  # Puppet ran nowhere


def test_puppetdb_down_ends_the_run_in_error(oss, sshd, tmp_path):
    config = bridge_config(tmp_path, oss, sshd, {})
    with_puppetdb(config, puppetdb_url=f"http://127.0.0.1:{free_port()}")
    run_id = oss.client.create_run({"scope": {"query": DEBIAN % "down"}})["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)
    run = completed(run_id)
    assert run.outcome == "error"
    assert "could not be reached" in run.run_results["result"]["msg"]


def test_a_node_list_is_run_as_before_with_puppetdb_configured(oss, sshd, puppetdb, tmp_path):
    calls = tmp_path / "calls"
    config = bridge_config(tmp_path, oss, sshd, {"plain-1": {"FAKE_PUPPET_LOG": str(calls)}})
    with_puppetdb(config, puppetdb_url=puppetdb.url)
    run_id = oss.client.create_run({"scope": {"nodes": ["plain-1"]}})["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)
    run = completed(run_id)
    assert run.outcome == "finished" and "query" not in run.run_results
    assert ran_on(calls) == ["plain-1"]


BOLT = str(Path(__file__).parent / "standins" / "bolt")
TASK = """#!/bin/sh
read -r input
printf '{"node": "%s"}\\n' "$FAKE_PUPPET_NODE"
"""


def test_bolt_runs_a_task_on_the_nodes_a_query_names(oss, puppetdb, tmp_path, monkeypatch):
    fleet(puppetdb, "bolt", ["Debian", "Debian", "RedHat"])
    PuppetConnection.objects.update(backend="bolt")
    script = tmp_path / "modules" / "package" / "tasks" / "init.sh"
    script.parent.mkdir(parents=True)
    script.write_text(TASK)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "bolt-calls"
    monkeypatch.setenv("BOLT_STANDIN_LOG", str(log))
    monkeypatch.setenv("BOLT_STANDIN_ENV", "{}")
    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "relay_api_url": oss.url,
                "relay_connection_token": oss.token,
                "backend": "bolt",
                "state_dir": str(tmp_path / "state"),
                "backend_bolt_bolt_path": BOLT,
                "backend_bolt_modulepath": str(tmp_path / "modules"),
                "puppetdb_url": puppetdb.url,
            }
        )
    )
    backend = make(load(config, environ={}))
    relay = RelayClient(oss.url, oss.token, platform="oss", backend="bolt", attempts=2)
    query = DEBIAN % "bolt"
    run_id = relay.create_run({"type": "task-run", "name": "package", "scope": {"query": query}})["id"]
    [run] = [r for r in relay.list_runs(status="pending") if r["id"] == run_id]
    RunWorker(relay, backend, run, tmp_path / "state", heartbeat=0.05).work()

    done = Run.objects.get(pk=run_id)
    assert done.outcome == "finished", done.run_results
    assert [n["result"]["node"] for n in done.run_results["nodes"]] == ["bolt-0", "bolt-1"]
    assert done.run_results["query"]["nodes"] == ["bolt-0", "bolt-1"]
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["argv"][:5] == ["task", "run", "package", "--targets", "bolt-0,bolt-1"]


def test_a_certname_from_puppetdb_that_is_no_certname_runs_nothing(oss, sshd, puppetdb, tmp_path):
    """PuppetDB stores what its submitters name; the bridge passes nothing to ssh or Bolt
    that is not a certname by the service's rule (never an option, path or URI)."""
    fleet(puppetdb, "odd", ["Debian"])
    puppetdb.replace_facts("-oProxyCommand=touch odd", {"os": {"family": "Debian"}, "fleet": "odd"})
    calls = tmp_path / "calls"
    config = bridge_config(tmp_path, oss, sshd, {"odd-0": {"FAKE_PUPPET_LOG": str(calls)}})
    with_puppetdb(config, puppetdb_url=puppetdb.url)
    run_id = oss.client.create_run({"scope": {"query": DEBIAN % "odd"}})["id"]
    relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(10)
    run = completed(run_id)
    assert run.outcome == "error"
    assert (
        "a node, from PuppetDB, that is not a valid certname: '-oProxyCommand"
        in run.run_results["result"]["msg"]
    )
    assert not calls.exists()


def test_a_killed_bridge_resumes_a_query_run_on_the_nodes_it_resolved(oss, sshd, puppetdb, tmp_path):
    """The resolution is kept with the run's work on disk: a restarted bridge re-attaches to
    the nodes the query named then (not a new answer from PuppetDB), and says so."""
    import signal

    from tests.bridge_helpers import in_progress, serve, wait_for

    nodes = fleet(puppetdb, "resume", ["Debian"])
    calls = tmp_path / "calls"
    slow = {"FAKE_PUPPET_SLEEP": "3", "FAKE_PUPPET_LOG": str(calls)}
    config = bridge_config(tmp_path, oss, sshd, {nodes[0]: slow, "resume-late": slow}, heartbeat=0.3)
    with_puppetdb(config, puppetdb_url=puppetdb.url)
    log = tmp_path / "bridge.log"
    server = serve(config, log)
    query = DEBIAN % "resume"
    run_id = oss.client.create_run({"scope": {"query": query}})["id"]
    in_progress(run_id)
    wait_for(lambda: calls.exists() and "start" in calls.read_text())
    server.send_signal(signal.SIGKILL)
    server.wait(10)
    # A node that PuppetDB learns of meanwhile is not this run's.
    puppetdb.replace_facts("resume-late", {"os": {"family": "Debian"}, "fleet": "resume"})

    server = serve(config, log)
    try:
        run = completed(run_id)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert run.outcome == "finished", run.run_results
    assert run.run_results["query"]["nodes"] == ["resume-0"]
    assert ran_on(calls) == ["resume-0"]
