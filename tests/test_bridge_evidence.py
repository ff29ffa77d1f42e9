"""Dry-run evidence from PuppetDB (issue 21 §4): the bridge reads each node's report of the
run from the session's real PuppetDB (tests/puppetdb.py) and puts what it changed, or in
noop would change, into the node's results, as the SSH backend did from the nodes.

PE: the orchestrator stand-in (tests/standins/orchestrator.py) names each node's
transaction uuid, and the reports with those transactions are stored in PuppetDB through
its command API (`store report`), as PE's agents would send them. Open source: the SSH
backend against the tests' sshd, with the stand-in `puppet` (the reports fed to PuppetDB
under the run's job id) and with a real `puppet agent` through the session's puppetserver
and its PuppetDB terminus. PuppetDB down, silent or without the report: the run completes
with its outcome and the evidence says why it is not available."""

import json
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from relay_bridge.api import RelayClient
from relay_bridge.backends import evidence, make
from relay_bridge.backends.evidence import Evidence
from relay_bridge.backends.orchestrator import OrchestratorBackend
from relay_bridge.config import load
from relay_bridge.puppetdb import PuppetDB as Client
from relay_bridge.worker import RunWorker

from runs.models import Run
from tests.bao import free_port
from tests.bridge_helpers import bridge_config, completed, relay_bridge
from tests.puppetdb import PuppetDB, now
from tests.sshd import write_fake_puppet
from tests.standins.orchestrator import Job, Orchestrator

pytestmark = pytest.mark.django_db(transaction=True)

MOTD_OLD, MOTD_NEW = "{sha256}" + "a" * 64, "{sha256}" + "b" * 64


def resource(kind: str, title: str, *events: dict) -> dict:
    stamp = now()
    return {
        "skipped": False,
        "timestamp": stamp,
        "resource_type": kind,
        "resource_title": title,
        "file": "/etc/puppetlabs/code/environments/production/manifests/site.pp",
        "line": 3,
        "containment_path": ["Stage[main]", "Main", f"{kind}[{title}]"],
        "corrective_change": False,
        "events": [{"timestamp": stamp, "corrective_change": False, "name": None, **e} for e in events],
    }


def event(status: str, prop: str, old, new, message: str | None = None) -> dict:
    return {"status": status, "property": prop, "old_value": old, "new_value": new, "message": message}


# What the nodes' Puppet runs did (or would do), by node.
CHANGES = {
    "web": [
        resource("File", "/etc/motd", event("noop", "content", MOTD_OLD, MOTD_NEW, "would have changed")),
        resource("Service", "nginx", event("noop", "ensure", "stopped", "running")),
    ],
    "db": [],
    "many": [resource("File", f"/etc/many-{i}", event("noop", "ensure", "absent", "file")) for i in range(4)],
    "broken": [
        resource("Exec", "migrate", event("failure", "returns", "notrun", ["0"], "returned 1 instead of 0")),
        resource("Package", "jq", event("skipped", None, None, None, "Skipped: dependency failed")),
    ],
}


def pe_backend(pe: Orchestrator, puppetdb_url: str, limit: float = 30) -> Evidence:
    settings = {"api_url": pe.url, "token": pe.token, "cacert": str(pe.ca)}
    backend = OrchestratorBackend(settings, backoff=0.01)
    return Evidence(backend, Client(puppetdb_url, timeout=10), limit, by="transaction_uuid")


def work(relay: RelayClient, backend, tmp_path, nodes: list[str], noop: bool = True) -> Run:
    created = relay.create_run({"environment": "production", "scope": {"nodes": nodes}, "noop": noop})
    RunWorker(relay, backend, created, tmp_path / "state", heartbeat=0.2).work()
    return Run.objects.get(pk=created["id"])


def agents_report(puppetdb: PuppetDB, prefix: str, later: float = 0.0):
    """What PE's agents do as the job ends: each sends its report, with its transaction
    uuid and the job's id, to PuppetDB; `later` seconds after the job ended, if asked."""

    def send(job: Job) -> None:
        for node in job.nodes:
            kind = node.removeprefix(prefix)
            status = "failed" if kind == "broken" else "unchanged"
            puppetdb.store_report(
                node,
                status=status,
                noop=bool(job.body.get("noop")),
                transaction_uuid=job.transaction_uuids[node],
                job_id=job.name,
                resources=CHANGES[kind],
            )

    if not later:
        return send
    return lambda job: threading.Timer(later, send, [job]).start()


def test_a_pe_noop_run_shows_what_each_node_would_change(pe, relay, puppetdb, tmp_path):
    nodes = ["pe-noop-web", "pe-noop-db"]
    # The web node's earlier run (another transaction): not this run's.
    puppetdb.store_report(
        nodes[0],
        status="changed",
        resources=[resource("File", "/old", event("success", "ensure", "absent", "file"))],
    )
    pe.on_final = agents_report(puppetdb, "pe-noop-")

    run = work(relay, pe_backend(pe, puppetdb.url), tmp_path, nodes)

    assert (run.status, run.outcome) == ("complete", "finished"), run.run_results
    web, db = run.run_results["nodes"]
    job = pe.jobs["81"]
    assert web["transaction_uuid"] == job.transaction_uuids[nodes[0]]  # PE's own fields stay
    assert web["changes_pending"] is True
    assert web["resources_total"] == 2
    assert web["resources"] == [
        {
            "type": "File",
            "title": "/etc/motd",
            "changes": [{"property": "content", "from": MOTD_OLD, "to": MOTD_NEW, "status": "noop"}],
        },
        {
            "type": "Service",
            "title": "nginx",
            "changes": [{"property": "ensure", "from": "stopped", "to": "running", "status": "noop"}],
        },
    ]
    assert web["report"] == {
        "status": "unchanged",
        "noop": True,
        "transaction_uuid": job.transaction_uuids[nodes[0]],
        "configuration_version": "1",
        "environment": "production",
    }
    assert (db["changes_pending"], db["resources_total"], db["resources"]) == (False, 0, [])
    assert "report_error" not in web and "report_error" not in db


def test_events_are_read_page_by_page_and_a_node_with_too_many_says_so(
    pe, relay, puppetdb, tmp_path, monkeypatch
):
    """PuppetDB's answers stay small (EVENT_PAGE rows), and a node's events read stop at
    EVENTS_PER_NODE: its evidence then says why it is not there; the others' are whole."""
    monkeypatch.setattr(evidence, "EVENT_PAGE", 1)
    monkeypatch.setattr(evidence, "EVENTS_PER_NODE", 3)
    asked: list[dict] = []
    query = Client.query

    def counted(self, *args, **kwargs):
        asked.append(kwargs)
        return query(self, *args, **kwargs)

    monkeypatch.setattr(Client, "query", counted)
    nodes = ["pe-paged-web", "pe-paged-many"]
    pe.on_final = agents_report(puppetdb, "pe-paged-")

    run = work(relay, pe_backend(pe, puppetdb.url), tmp_path, nodes)

    web, many = run.run_results["nodes"]
    assert (web["changes_pending"], web["resources_total"]) == (True, 2)
    assert [r["title"] for r in web["resources"]] == ["/etc/motd", "nginx"]
    assert many["changes_pending"] is None
    assert many["report_error"] == (
        "not available: the report has more than 3 changed or failed events; not read"
    )
    pages = [kw for kw in asked if kw.get("limit") == 1]
    assert len(pages) >= 6 and all(kw["offset"] == i for i, kw in enumerate(pages))


def test_each_batch_of_reports_is_summarized_before_the_next_is_read(
    pe, relay, puppetdb, tmp_path, monkeypatch
):
    """What is held is one batch's events (EVENT_BATCH reports), not every node's: a large
    first run's raw events would otherwise all wait in memory for the last batch."""
    monkeypatch.setattr(evidence, "EVENT_BATCH", 1)
    summarized_before: list[int] = []
    read = evidence.Reading._events

    def counted(self, match):
        summarized_before.append(len(self.found))
        return read(self, match)

    monkeypatch.setattr(evidence.Reading, "_events", counted)
    nodes = ["pe-batch-web", "pe-batch-many", "pe-batch-db"]
    pe.on_final = agents_report(puppetdb, "pe-batch-")

    run = work(relay, pe_backend(pe, puppetdb.url), tmp_path, nodes)

    assert summarized_before == [0, 1, 2]
    web, many, db = run.run_results["nodes"]
    assert (web["resources_total"], many["resources_total"], db["resources_total"]) == (2, 4, 0)


def test_failures_and_the_reports_status_are_in_the_evidence(pe, relay, puppetdb, tmp_path):
    pe.script = ["running", "failed"]
    pe.node_states = {"pe-fail-broken": "failed"}
    pe.on_final = agents_report(puppetdb, "pe-fail-")

    run = work(relay, pe_backend(pe, puppetdb.url), tmp_path, ["pe-fail-broken"], noop=False)

    assert run.outcome == "failed"
    [node] = run.run_results["nodes"]
    assert node["state"] == "failed"
    assert node["report"]["status"] == "failed"
    assert node["changes_pending"] is False
    # The skipped package is no change and no failure: only the failed exec is listed.
    assert node["resources"] == [
        {
            "type": "Exec",
            "title": "migrate",
            "failed": True,
            "changes": [
                {
                    "property": "returns",
                    "from": "notrun",
                    "to": ["0"],
                    "status": "failure",
                    "message": "returned 1 instead of 0",
                }
            ],
        }
    ]


def test_reports_that_reach_puppetdb_after_the_job_ended_are_waited_for(pe, relay, puppetdb, tmp_path):
    """PuppetDB stores reports asynchronously: the bridge asks again until they are there,
    heartbeating meanwhile."""
    pe.on_final = agents_report(puppetdb, "pe-late-", later=1.5)

    run = work(relay, pe_backend(pe, puppetdb.url), tmp_path, ["pe-late-web"])

    [node] = run.run_results["nodes"]
    assert node["changes_pending"] is True, node
    assert [r["title"] for r in node["resources"]] == ["/etc/motd", "nginx"]
    assert run.transitions.filter(to_status="in-progress").exists()


def test_a_node_without_a_report_in_puppetdb_says_it_is_not_available(pe, relay, puppetdb, tmp_path):
    run = work(relay, pe_backend(pe, puppetdb.url, limit=1), tmp_path, ["pe-none-web"])

    assert run.outcome == "finished"
    [node] = run.run_results["nodes"]
    assert node["changes_pending"] is None
    assert node["report_error"] == "not available: PuppetDB had no report of this run for the node after 1 s"


def test_puppetdb_down_the_run_completes_with_its_outcome(pe, relay, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()

    run = work(relay, pe_backend(pe, down, limit=2), tmp_path, ["pe-down-web", "pe-down-db"])

    print(f"\ncompleted {time.monotonic() - started:.1f} s after it started (limit 2 s)")
    assert (run.status, run.outcome) == ("complete", "finished")
    for node in run.run_results["nodes"]:
        assert node["state"] == "finished"
        assert node["changes_pending"] is None
        assert node["report_error"].startswith(f"not available: PuppetDB at {down} could not be reached")


def test_a_puppetdb_that_never_answers_holds_the_run_no_longer_than_the_limit(pe, relay, tmp_path):
    """A PuppetDB that takes the connection and says nothing: the reading is given up at the
    limit (the question still hangs in its thread); the run completes."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog; nothing ever answers them
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    backend = pe_backend(pe, url, limit=1)
    backend.puppetdb.timeout = 600
    try:
        run = work(relay, backend, tmp_path, ["pe-silent-web"])
    finally:
        silent.close()
    assert run.outcome == "finished"
    [node] = run.run_results["nodes"]
    assert node["report_error"] == "not available: PuppetDB had no report of this run for the node after 1 s"


def test_make_reads_pe_reports_from_the_configured_puppetdb(pe, puppetdb, tmp_path):
    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "relay_api_url": "http://127.0.0.1:1/",
                "relay_connection_token": "rlyp_x",
                "backend": "orchestrator",
                "backend_orchestrator_api_url": pe.url,
                "backend_orchestrator_token": pe.token,
                "backend_orchestrator_cacert": str(pe.ca),
                "puppetdb_url": puppetdb.url,
                "puppetdb_report_wait": 7,
            }
        )
    )
    backend = make(load(config, environ={}))
    assert isinstance(backend, Evidence) and (backend.by, backend.limit) == ("transaction_uuid", 7)
    assert (backend.name, backend.platform) == ("orchestrator", "pe")
    values = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**values, "puppetdb_report_wait": 0}))
    assert isinstance(make(load(config, environ={})), OrchestratorBackend)  # 0: not read


# Open source: the SSH backend.


def with_puppetdb(config, **keys):
    values = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**values, **keys}))
    return config


def test_ssh_takes_the_runs_reports_from_puppetdb_not_from_the_nodes(oss, sshd, puppetdb, tmp_path):
    """With PuppetDB the nodes print no report after Puppet (one command less per node): a
    report the node would print is not read; the run's own, by its job id, is PuppetDB's."""
    node_report = tmp_path / "last_run_report.yaml"
    node_report.write_text("--- {job_id: 'x', resource_statuses: {}}\n")
    env = {"FAKE_PUPPET_EXIT": "0", "FAKE_PUPPET_REPORT": str(node_report)}
    config = bridge_config(tmp_path, oss, sshd, {"ssh-pdb-web": env, "ssh-pdb-db": env})
    with_puppetdb(config, puppetdb_url=puppetdb.url, puppetdb_report_wait=10)
    run_id = oss.client.create_run({"scope": {"nodes": ["ssh-pdb-web", "ssh-pdb-db"]}, "noop": True})["id"]
    # What the agents send with `--job-id <run id>` (and an earlier run's report, another job's).
    puppetdb.store_report(
        "ssh-pdb-web", status="changed", job_id=str(uuid.uuid4()), resources=CHANGES["broken"]
    )
    for node, kind in (("ssh-pdb-web", "web"), ("ssh-pdb-db", "db")):
        puppetdb.store_report(node, noop=True, job_id=run_id, resources=CHANGES[kind])
    assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(60) == 0

    run = completed(run_id)
    assert run.outcome == "finished", run.run_results
    web, db = run.run_results["nodes"]
    assert web["exit_code"] == 0 and web["changes_pending"] is True
    assert [(r["type"], r["title"]) for r in web["resources"]] == [
        ("File", "/etc/motd"),
        ("Service", "nginx"),
    ]
    assert (db["changes_pending"], db["resources"]) == (False, [])
    assert "relay-bridge: last run report" not in web["output"]


def test_ssh_nodes_whose_report_never_reaches_puppetdb(oss, sshd, puppetdb, tmp_path):
    nodes = {"ssh-lost-1": {"FAKE_PUPPET_EXIT": "2"}, "ssh-lost-2": {}}
    config = bridge_config(tmp_path, oss, sshd, nodes, unreachable=("ssh-lost-2",))
    with_puppetdb(config, puppetdb_url=puppetdb.url, puppetdb_report_wait=1)
    run_id = oss.client.create_run({"scope": {"nodes": list(nodes)}})["id"]
    assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(60) == 0

    run = completed(run_id)
    ran, unreachable = run.run_results["nodes"]
    assert ran["state"] == "finished"
    assert ran["report_error"] == "not available: PuppetDB had no report of this run for the node after 1 s"
    # Puppet never ran where SSH could not log in: no report is waited for.
    assert unreachable["exit_code"] == 255 and "report_error" not in unreachable


def test_a_real_agent_through_puppetserver_and_its_puppetdb_terminus(
    oss, sshd, puppetserver, puppetdb, tmp_path
):
    """All real: `puppet agent -t --noop --job-id <run>` over SSH, through puppetserver, whose
    terminus stores the report in PuppetDB; the bridge reads it there."""
    puppetserver.use_puppetdb(puppetdb.ssl_url)
    target = tmp_path / "created-by-puppet"
    puppetserver.manifest(f"node default {{ file {{ '{target}': content => 'from puppet' }} }}")
    certname = puppetserver.certname()
    config = bridge_config(
        tmp_path, oss, sshd, {certname: {}}, heartbeat=2, node_puppet_path=str(puppetserver.node_puppet())
    )
    with_puppetdb(config, puppetdb_url=puppetdb.url, puppetdb_report_wait=60)
    run_id = oss.client.create_run({"scope": {"nodes": [certname]}, "noop": True})["id"]
    try:
        assert relay_bridge(config, "poll", "--once", log=tmp_path / "bridge.log").wait(60) == 0
        run = completed(run_id, timeout=300)  # the forked worker: Puppet, then PuppetDB
    finally:
        puppetserver.manifest("node default { }")

    assert run.outcome == "finished", run.run_results
    [node] = run.run_results["nodes"]
    assert not target.exists()  # noop
    assert node["changes_pending"] is True, node
    [change] = node["resources"]
    assert (change["type"], change["title"]) == ("File", str(target))
    assert change["changes"] == [{"property": "ensure", "from": "absent", "to": "file", "status": "noop"}]
    [report] = Client(puppetdb.url).query(["=", "job_id", run_id], "reports")
    assert node["report"]["transaction_uuid"] == report["transaction_uuid"]
    assert node["report"]["noop"] is True


# Open source: the Bolt backend (tests/standins/bolt), and a bridge that restarted.

BOLT = str(Path(__file__).parent / "standins" / "bolt")


def finish(job, timeout: float = 60) -> tuple[str, dict]:
    deadline = time.monotonic() + timeout
    while not job.wait(0.2):  # the run worker's heartbeat loop
        assert time.monotonic() < deadline
    outcome, results = job.result()
    return outcome, {node["name"]: node for node in results["nodes"]}


def test_bolt_takes_the_runs_reports_from_puppetdb_and_so_does_a_restarted_bridge(
    puppetdb, tmp_path, monkeypatch
):
    run = {
        "id": str(uuid.uuid4()),
        "type": "run",
        "noop": True,
        "scope": {"nodes": ["bolt-ev-web", "bolt-ev-gone"]},
    }
    monkeypatch.setenv("BOLT_STANDIN_ENV", json.dumps({"bolt-ev-web": {"FAKE_PUPPET_EXIT": "0"}}))
    monkeypatch.setenv("BOLT_STANDIN_UNREACHABLE", "bolt-ev-gone")
    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "relay_api_url": "http://127.0.0.1:1/",
                "relay_connection_token": "rlyp_x",
                "backend": "bolt",
                "backend_bolt_bolt_path": BOLT,
                "backend_bolt_node_puppet_path": str(write_fake_puppet(tmp_path)),
                "puppetdb_url": puppetdb.url,
                "puppetdb_report_wait": 30,
            }
        )
    )
    backend = make(load(config, environ={}))
    puppetdb.store_report("bolt-ev-web", noop=True, job_id=run["id"], resources=CHANGES["web"])

    job = backend.start(run, tmp_path / "work")
    outcome, nodes = finish(job)

    assert outcome == "failed"  # the unreachable target
    web, gone = nodes["bolt-ev-web"], nodes["bolt-ev-gone"]
    assert web["changes_pending"] is True and web["resources_total"] == 2
    assert "relay-bridge: last run report" not in web["output"]  # Bolt's nodes print no report
    assert "changes_pending" not in gone and "report_error" not in gone  # Puppet never ran there

    # A bridge that restarts re-attaches to Bolt's results and reads the reports again.
    handle = json.loads(json.dumps(job.handle()))  # as the run's record keeps it
    assert handle["evidence"] == {"job_id": run["id"]}
    _, again = finish(backend.attach(handle, tmp_path / "work"))
    assert again["bolt-ev-web"]["resources"] == web["resources"]
