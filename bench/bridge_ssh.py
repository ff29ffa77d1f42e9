"""The SSH backend's parallelism: 50 loopback "nodes" (ssh config aliases of one local
sshd) whose stand-in `puppet` sleeps 1 s and exits 2. Wall time at parallelism 1, 5 and 20
against the ideal ceil(50 / p) x 1 s. Target: within 10 % of ideal at parallelism 20.

    .venv/bin/python bench/bridge_ssh.py [--nodes 50] [--sleep 1] [--kex curve25519-sha256]

Each node costs one ssh connection on top of its Puppet run: key exchange and login on
both ends, which on 2 shared cores is the whole overhead. --kex picks the key exchange
(OpenSSH 9's default, sntrup761x25519, costs ~0.17 s of client CPU here). --client local
swaps ssh for a stand-in that runs the node's command here without SSH, which leaves the
bridge's own scheduling overhead alone in the figures."""

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from relay_bridge.backends.ssh import SshBackend  # noqa: E402

from tests.sshd import Sshd  # noqa: E402

# `ssh [options] -- node command` without SSH: the command runs here.
LOCAL_SSH = """#!/bin/sh
while [ "$1" != "--" ]; do shift; done
exec sh -c "$3"
"""


def one(
    sshd: Sshd, nodes: dict[str, dict[str, str]], parallelism: int, kex: str | None, local: bool, work: Path
) -> float:
    options = sshd.options(
        sshd.write_config(nodes), node_puppet_path=str(sshd.fake_puppet()), parallelism=parallelism
    )
    if kex:
        options["ssh_options"] = [f"KexAlgorithms={kex}"]
    if local:
        client = sshd.dir / "local-ssh"
        client.write_text(LOCAL_SSH)
        client.chmod(0o755)
        options["openssh_client_path"] = str(client)
    backend = SshBackend(options)
    started = time.monotonic()
    job = backend.start({"id": "bench", "type": "run", "scope": {"nodes": list(nodes)}}, work)
    assert job.wait(3600)
    elapsed = time.monotonic() - started
    outcome, results = job.result()
    codes = {n["exit_code"] for n in results["nodes"]}
    assert outcome == "finished" and codes == {2}, (outcome, results["nodes"][:2])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--kex", help="ssh KexAlgorithms for the bridge's connections")
    parser.add_argument("--parallelism", default="1,5,20")
    parser.add_argument("--client", choices=["ssh", "local"], default="ssh")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp:
        sshd = Sshd(Path(tmp) / "sshd").start()
        try:
            nodes = {
                f"node{i:02d}.example.com": {"FAKE_PUPPET_SLEEP": str(args.sleep), "FAKE_PUPPET_EXIT": "2"}
                for i in range(args.nodes)
            }
            if args.client == "local":  # no ssh config to pass the nodes' environment: inherit it
                os.environ.update(FAKE_PUPPET_SLEEP=str(args.sleep), FAKE_PUPPET_EXIT="2")
            client = (
                "no SSH (local stand-in)"
                if args.client == "local"
                else f"kex {args.kex or 'OpenSSH default'}"
            )
            print(f"{args.nodes} nodes, puppet sleeps {args.sleep} s, {client}")
            print(f"{'parallelism':>11} {'wall s':>8} {'ideal s':>8} {'over ideal':>10} {'per node s':>11}")
            for p in (int(x) for x in args.parallelism.split(",")):
                wall = one(sshd, nodes, p, args.kex, args.client == "local", Path(tmp) / f"work-{p}")
                ideal = math.ceil(args.nodes / p) * args.sleep
                # What each node cost beyond its Puppet run, seen from one of the p lanes.
                per_node = (wall - ideal) / math.ceil(args.nodes / p)
                print(
                    f"{p:>11} {wall:>8.2f} {ideal:>8.2f} {100 * (wall / ideal - 1):>9.1f}% {per_node:>11.3f}"
                )
        finally:
            sshd.stop()


if __name__ == "__main__":
    main()
