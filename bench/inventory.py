"""The fleet inventory at scale (issue 21 §3): a real PuppetDB with 10,000 synthetic nodes
(the default facts and some that must not leave), the service under gunicorn, and
`relay-bridge inventory` between them.

    .venv/bin/python bench/inventory.py [--nodes 10000] [--changes 100] [--requests 200] [--api-only]

Prints: the first (full) sync, end to end (the `relay-bridge inventory` command, its Python
start included) against the target of 30 s; an incremental sync after `--changes` nodes
changed (new facts for half, a report for the other half) against 2 s; the bridge's peak
memory (max RSS) in each, which stays flat as the fleet grows (pages of 500 nodes); and the
nodes API's p50 and p99 for a filtered page (fact and status, 100 nodes) against 50 ms.

Its own databases (relay_bench_inventory, and PuppetDB's relay_bench_inventory_puppetdb),
OpenBao dev server and PuppetDB (--api-only: no PuppetDB, the same nodes sent as the
bridge's pages, then the API figures) (TLS with a throwaway self-signed certificate; the bridge
uses PuppetDB's cleartext port). Feeding PuppetDB 10,000 nodes takes a few minutes (its
command queue, one thread here): that is not measured. The incremental sync starts more
than OVERLAP (30 s) after the feeding, as a real fleet's does after the busy first sync."""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import service  # bench/service.py
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.puppetdb import PuppetDB, now  # noqa: E402

DATABASE = "relay_bench_inventory"
RELAY_BRIDGE = str(Path(sys.executable).parent / "relay-bridge")


def facts(n: int, release: str = "12.4") -> dict:
    family = ("Debian", "RedHat", "Debian", "Suse")[n % 4]
    return {
        "os": {
            "family": family,
            "name": family,
            "release": {"full": release, "major": release.split(".")[0]},
        },
        "kernel": "Linux",
        "kernelrelease": "6.1.0-13-amd64",
        "networking": {
            "fqdn": f"node-{n:05}.example.com",
            "hostname": f"node-{n:05}",
            "ip": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
            "interfaces": {"eth0": {"ip": "10.0.0.1", "mac": "52:54:00:12:34:56", "mtu": 1500}},
        },
        "puppetversion": "7.23.0",
        "memory": {"system": {"total": "7.76 GiB", "used": "1.2 GiB"}},
        "processors": {"count": 2, "models": ["Intel Xeon"] * 2},
        "ssh": {"rsa": {"key": "AAAAB3Nza" + "x" * 360}},  # never leaves the site
    }


def feed(puppetdb: PuppetDB, certnames: list[str], make, wait: bool = False) -> None:
    """Commands through a pool of sessions; without `wait`, queued, then waited for as a whole."""
    session = requests.Session()

    def one(item: tuple[int, str]) -> None:
        n, certname = item
        params = {"command": "replace facts", "version": 5, "certname": certname}
        if wait:
            params["secondsToWaitForCompletion"] = 30
        body = {
            "certname": certname,
            "environment": "production",
            "values": make(n),
            "producer_timestamp": now(),
            "producer": "localhost",
        }
        session.post(f"{puppetdb.url}/pdb/cmd/v1", params=params, json=body, timeout=60).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, enumerate(certnames)))


def node_count(puppetdb: PuppetDB) -> int:
    answer = requests.post(
        f"{puppetdb.url}/pdb/query/v4",
        json={"query": "nodes[count()] {}"},
        timeout=60,
    )
    return answer.json()[0]["count"]


def bridge(config: Path) -> tuple[float, int, str]:
    """(seconds, the bridge's max RSS in MiB, its output) of one `relay-bridge inventory`."""
    out = config.parent / "bridge.out"
    began = time.monotonic()
    with out.open("w") as sink:
        process = subprocess.Popen(
            [RELAY_BRIDGE, "--config", str(config), "--log-level", "warning", "inventory"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak, not all children's
    seconds = time.monotonic() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, out.read_text()[-2000:]
    return seconds, usage.ru_maxrss // 1024, out.read_text().strip()


def api_figures(port: int, connection_id: str, api_token: str, count: int, nodes: int) -> None:
    """The nodes API's p50 and p99 for one filtered page of 100 nodes."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {api_token}"
    url = f"http://127.0.0.1:{port}/api/connections/puppet/{connection_id}/nodes/"
    params = {"fact.os.family": "Debian", "status": "none", "state": "stale", "limit": "100"}
    times = []
    for _ in range(count):
        began = time.perf_counter()
        answer = session.get(url, params=params)
        times.append((time.perf_counter() - began) * 1000)
        assert answer.status_code == 200 and len(answer.json()["nodes"]) == 100, answer.text[:300]
    times.sort()
    print(
        f"nodes API, filtered page of 100 (fact.os.family, status, state) over {nodes} nodes:"
        f" p50 {statistics.median(times):.1f} ms (target <= 50 ms),"
        f" p99 {times[int(len(times) * 0.99) - 1]:.1f} ms"
    )


def api_only(args: argparse.Namespace) -> None:
    """Without PuppetDB: the nodes the bridge would send, sent as its pages, then the API."""
    from relay_bridge.api import RelayClient
    from relay_bridge.inventory import DEFAULT_FACTS, dig

    with service.prepared(DATABASE, WEB_CONCURRENCY="2") as env, service.gunicorn(env) as (port, _):
        from django.contrib.auth.models import User

        from puppet_connection.models import PuppetConnection
        from relay.models import UserToken

        owner = User.objects.create_user("bench")
        connection, token = PuppetConnection.create_with_token(owner=owner, name="bench")
        _, api_token = UserToken.create_for(owner)
        client = RelayClient(f"http://127.0.0.1:{port}", str(token))
        began = time.monotonic()
        sync = client.inventory_start(list(DEFAULT_FACTS))
        for start in range(0, args.nodes, 500):
            page = []
            for n in range(start, min(args.nodes, start + 500)):
                values = facts(n)
                chosen = {p: dig(values[p.split(".")[0]], p.partition(".")[2])[1] for p in DEFAULT_FACTS}
                page.append(
                    {"certname": f"node-{n:05}.example.com", "environment": "production", "facts": chosen}
                )
            client.inventory_page(sync["id"], page)
        client.inventory_end(sync["id"], since="2026-01-01T00:00:00+00:00")
        print(f"the service's side of a full sync of {args.nodes} nodes: {time.monotonic() - began:.1f} s")
        api_figures(port, str(connection.pk), str(api_token), args.requests, args.nodes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--api-only", action="store_true", help="no PuppetDB: pages as the bridge sends them")
    args = parser.parse_args()
    if args.api_only:
        api_only(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-inventory-"))
    ssl = work / "ssl"
    (ssl / "certs").mkdir(parents=True)
    (ssl / "private_keys").mkdir()
    key, cert = ssl / "private_keys" / "localhost.pem", ssl / "certs" / "localhost.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    (ssl / "certs" / "ca.pem").write_bytes((ssl / "certs" / "localhost.pem").read_bytes())

    with service.prepared(DATABASE, WEB_CONCURRENCY="2") as env, service.gunicorn(env) as (port, _):
        from django.contrib.auth.models import User

        from inventory.models import Node
        from puppet_connection.models import PuppetConnection
        from relay.models import UserToken

        owner = User.objects.create_user("bench")
        connection, token = PuppetConnection.create_with_token(owner=owner, name="bench")
        _, api_token = UserToken.create_for(owner)
        puppetdb = PuppetDB(
            work / "puppetdb", ssl, "localhost", f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
        )
        (work / "puppetdb").mkdir()
        puppetdb.start()
        try:
            print(
                f"PuppetDB started in {puppetdb.start_seconds:.0f} s (compiled classes cached:"
                f" {puppetdb.cached})"
            )
            certnames = [f"node-{n:05}.example.com" for n in range(args.nodes)]
            began = time.monotonic()
            feed(puppetdb, certnames, facts)
            while node_count(puppetdb) < args.nodes:
                time.sleep(2)
            fed = time.monotonic()
            print(f"fed {args.nodes} nodes to PuppetDB in {fed - began:.0f} s (not measured)")
            config = work / "bridge.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "relay_api_url": f"http://127.0.0.1:{port}",
                        "relay_connection_token": str(token),
                        "backend": "ssh",
                        "state_dir": str(work / "state"),
                        "puppetdb_url": puppetdb.url,
                    }
                )
            )
            seconds, rss, output = bridge(config)
            count = Node.objects.filter(connection=connection).count()
            print(
                f"first sync: {seconds:.1f} s end to end (target <= 30 s), bridge max RSS {rss} MiB; {output}"
            )
            assert count == args.nodes, count

            time.sleep(max(0.0, 31 - (time.monotonic() - fed)))
            changed = certnames[:: max(1, args.nodes // args.changes)][: args.changes]
            half = len(changed) // 2
            feed(puppetdb, changed[:half], lambda n: facts(n, "12.5"), wait=True)
            for certname in changed[half:]:
                puppetdb.store_report(certname, status="changed")
            seconds, rss_small, output = bridge(config)
            print(
                f"incremental sync, {len(changed)} changes: {seconds:.2f} s end to end (target <= 2 s),"
                f" bridge max RSS <= {rss_small} MiB; {output}"
            )
            assert Node.objects.filter(facts__contains={"os.release.full": "12.5"}).count() == half

            api_figures(port, str(connection.pk), str(api_token), args.requests, args.nodes)
        finally:
            puppetdb.stop()


if __name__ == "__main__":
    main()
