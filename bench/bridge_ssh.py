"""The SSH backend's parallelism: 50 loopback "nodes" (ssh config aliases of one local
sshd) whose stand-in `puppet` sleeps 1 s and exits 2. Wall time at parallelism 1, 5 and 20
against the ideal ceil(50 / p) x 1 s. Target: within 10 % of ideal at parallelism 20.

    .venv/bin/python bench/bridge_ssh.py [--nodes 50] [--sleep 1] [--kex curve25519-sha256]

Each node costs one ssh connection on top of its Puppet run: key exchange and login on
both ends, which on 2 shared cores is the whole overhead. --kex picks the key exchange
(OpenSSH 9's default, sntrup761x25519, costs ~0.17 s of client CPU here). --client local
swaps ssh for a stand-in that runs the node's command here without SSH, which leaves the
bridge's own scheduling overhead alone in the figures.

--reports says where each node's report of the run comes from (one table row per mode and
parallelism): `none` (not read), `node` (the node prints its last run report after Puppet,
over the same connection, as without PuppetDB: `puppet config print lastrunreport` first,
which costs a real node Ruby's start, --config-cost seconds, measured here with Debian's
puppet unless given; the report is a real Puppet 7 noop report) and `puppetdb` (a real
PuppetDB, started here on the test PostgreSQL ($DATABASE_URL), holds each node's report
under the run's job id, as the agents' terminus would have stored it during their runs; the
bridge reads them there once Puppet is done everywhere).

    .venv/bin/python bench/bridge_ssh.py --reports node,puppetdb --parallelism 20"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from relay_bridge.backends.evidence import Evidence  # noqa: E402
from relay_bridge.backends.ssh import SshBackend  # noqa: E402
from relay_bridge.puppetdb import PuppetDB as Client  # noqa: E402

from tests.sshd import Sshd  # noqa: E402

NOOP_REPORT = ROOT / "bridge_client" / "tests" / "fixtures" / "reports" / "puppet-7.23-noop.yaml"
# What that report's run would change, as PuppetDB's `store report` takes it.
STAMP = "2026-11-26T10:00:00.000Z"
NOOP_RESOURCES = [
    {
        "skipped": False,
        "timestamp": STAMP,
        "resource_type": kind,
        "resource_title": title,
        "file": "/etc/puppetlabs/code/environments/production/manifests/site.pp",
        "line": 1,
        "containment_path": ["Stage[main]", "Main", f"{kind}[{title}]"],
        "corrective_change": False,
        "events": [
            {"status": "noop", "timestamp": STAMP, "property": prop, "old_value": old, "new_value": new}
            | {"message": f"current_value {old}, should be {new} (noop)", "corrective_change": False}
            for prop, old, new in events
        ],
    }
    for kind, title, events in (
        (
            "File",
            "/srv/relay-e2e/target",
            [("content", "{sha256}" + "a" * 64, "{sha256}" + "b" * 64), ("mode", "0644", "0640")],
        ),
        ("File", "/srv/relay-e2e/newfile", [("ensure", "absent", "file")]),
        ("Notify", "hello", [("message", "absent", "hello")]),
    )
]

# `ssh [options] -- node command` without SSH: the command runs here.
LOCAL_SSH = """#!/bin/sh
while [ "$1" != "--" ]; do shift; done
exec sh -c "$3"
"""


def one(
    sshd: Sshd,
    nodes: dict[str, dict[str, str]],
    parallelism: int,
    kex: str | None,
    local: bool,
    work: Path,
    reports: str = "none",
    puppetdb: Any = None,
) -> float:
    run_id = str(uuid.uuid4())
    if reports == "node":
        report = work.parent / f"report-{run_id}.yaml"
        report.write_text(NOOP_REPORT.read_text().replace("job_id: relay-abc123", f"job_id: {run_id}"))
        nodes = {name: {**env, "FAKE_PUPPET_REPORT": str(report)} for name, env in nodes.items()}
    options = sshd.options(
        sshd.write_config(nodes), node_puppet_path=str(sshd.fake_puppet()), parallelism=parallelism
    )
    if reports != "node":
        options["report_max_bytes"] = 0
    if kex:
        options["ssh_options"] = [f"KexAlgorithms={kex}"]
    if local:
        client = sshd.dir / "local-ssh"
        client.write_text(LOCAL_SSH)
        client.chmod(0o755)
        options["openssh_client_path"] = str(client)
    backend: Any = SshBackend(options)
    if reports == "puppetdb":
        for name in nodes:  # as the agents' terminus stores them during their runs: not timed
            puppetdb.store_report(name, noop=True, job_id=run_id, resources=NOOP_RESOURCES)
        backend = Evidence(backend, Client(puppetdb.url), 60, by="job_id")
    started = time.monotonic()
    job = backend.start({"id": run_id, "type": "run", "noop": True, "scope": {"nodes": list(nodes)}}, work)
    if reports == "puppetdb":
        while not job.job.wait(1):  # Puppet, everywhere
            pass
        READING.append(time.monotonic())
    while not job.wait(1):  # the run worker's heartbeat loop
        pass
    elapsed = time.monotonic() - started
    if reports == "puppetdb":
        READING[-1] = time.monotonic() - READING[-1]
    outcome, results = job.result()
    codes = {n["exit_code"] for n in results["nodes"]}
    assert outcome == "finished" and codes == {2}, (outcome, results["nodes"][:2])
    if reports != "none":
        pending = [n.get("changes_pending") for n in results["nodes"]]
        assert pending == [True] * len(nodes), results["nodes"][:2]
    return elapsed


READING: list[float] = []  # seconds from Puppet done everywhere to the reports read from PuppetDB


def config_cost() -> float:
    """What `puppet config print lastrunreport` costs on this host (Debian's puppet)."""
    if not shutil.which("puppet"):
        return 0.0
    began = time.monotonic()
    for _ in range(3):
        subprocess.run(
            ["puppet", "config", "print", "lastrunreport", "--section", "agent"], capture_output=True
        )
    return (time.monotonic() - began) / 3


def ssl_dir(directory: Path) -> Path:
    """certs/ca.pem, certs/localhost.pem and private_keys/localhost.pem for PuppetDB's TLS
    port (which the bench does not use: it reads the cleartext one)."""
    (directory / "certs").mkdir(parents=True)
    (directory / "private_keys").mkdir()
    key, cert = directory / "private_keys" / "localhost.pem", directory / "certs" / "localhost.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost"),
            *("-days", "2", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copy(cert, directory / "certs" / "ca.pem")
    return directory


def start_puppetdb(tmp: Path) -> Any:
    from tests.puppetdb import PuppetDB

    database = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/relay_bench")
    puppetdb = PuppetDB(tmp / "puppetdb", ssl_dir(tmp / "ssl"), "localhost", database).start()
    print(f"PuppetDB answered after {puppetdb.start_seconds:.1f} s (cached classes: {puppetdb.cached})")
    return puppetdb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--kex", help="ssh KexAlgorithms for the bridge's connections")
    parser.add_argument("--parallelism", default="1,5,20")
    parser.add_argument("--client", choices=["ssh", "local"], default="ssh")
    parser.add_argument("--reports", default="none", help="none, node, puppetdb: comma-separated")
    parser.add_argument("--config-cost", type=float, help="seconds a node's `puppet config print` takes")
    args = parser.parse_args()
    modes = args.reports.split(",")
    cost = 0.0
    if "node" in modes:
        cost = config_cost() if args.config_cost is None else args.config_cost
        print(f"a node's `puppet config print lastrunreport` costs {cost:.2f} s")
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp:
        sshd = Sshd(Path(tmp) / "sshd").start()
        puppetdb = start_puppetdb(Path(tmp)) if "puppetdb" in modes else None
        try:
            env = {"FAKE_PUPPET_SLEEP": str(args.sleep), "FAKE_PUPPET_EXIT": "2"}
            env["FAKE_PUPPET_CONFIG_SLEEP"] = f"{cost:.3f}"
            nodes = {f"node{i:02d}.example.com": env for i in range(args.nodes)}
            if args.client == "local":  # no ssh config to pass the nodes' environment: inherit it
                os.environ.update(FAKE_PUPPET_SLEEP=str(args.sleep), FAKE_PUPPET_EXIT="2")
            client = (
                "no SSH (local stand-in)"
                if args.client == "local"
                else f"kex {args.kex or 'OpenSSH default'}"
            )
            print(f"{args.nodes} nodes, puppet sleeps {args.sleep} s, {client}")
            print(
                f"{'reports':>8} {'parallelism':>11} {'wall s':>8} {'ideal s':>8} {'over ideal':>10} "
                f"{'per node s':>11} {'pdb read s':>10}"
            )
            for mode in modes:
                for p in (int(x) for x in args.parallelism.split(",")):
                    work = Path(tmp) / f"work-{mode}-{p}"
                    wall = one(sshd, nodes, p, args.kex, args.client == "local", work, mode, puppetdb)
                    ideal = math.ceil(args.nodes / p) * args.sleep
                    # What each node cost beyond its Puppet run, seen from one of the p lanes.
                    per_node = (wall - ideal) / math.ceil(args.nodes / p)
                    reading = f"{READING[-1]:>10.2f}" if mode == "puppetdb" else f"{'':>10}"
                    print(
                        f"{mode:>8} {p:>11} {wall:>8.2f} {ideal:>8.2f} {100 * (wall / ideal - 1):>9.1f}% "
                        f"{per_node:>11.3f} {reading}"
                    )
        finally:
            sshd.stop()
            if puppetdb:
                puppetdb.stop()


if __name__ == "__main__":
    main()
