"""Fleet scale: 10,000 idle long-polling bridges on one box while 32 clients send heartbeats.

    .venv/bin/python bench/longpoll_scale.py [--waiters 10000] [--seconds 10] [--rounds 20] [--rate 1000]

Against gunicorn as production runs it (relay/gunicorn_conf.py: uvicorn workers, relay.asgi)
and PostgreSQL, with this load generator (one asyncio process) on the same 2 cores. Each
waiter is a bridge of its own connection (its own token) holding `GET /_puppet/runs?wait=60`
and asking again when answered, as `relay-bridge serve` does. It prints:

- heartbeat PUTs (32 connections over 200 runs in progress, each sending as soon as it is
  answered; then together at --rate a second, 1,000 by default) and /healthz (one client,
  every 20 ms): rate, p50 and p99, without and then with the waiters, the load average, and the
  CPU milliseconds per request of the web processes and of PostgreSQL (bench/cpu.py), which
  the machine's other load changes far less than rate and latency;
- the service's memory per waiter: the RSS of gunicorn's processes with all waiters
  waiting, less before any, over their number;
- wake-up latency: a run created for one waiter's connection (POST /_puppet/runs with its
  token) until that waiter has its answer, `--rounds` times.

File descriptors: 10,000 waiters are 10,000 sockets in this process and as many in the
service's workers. This script raises its own soft RLIMIT_NOFILE to the hard limit and
needs the hard limit above the waiters plus a few hundred (`ulimit -Hn`; here 20,000); the
workers raise theirs (relay.server.raise_fd_limit). The listen backlog is 4,096
(relay/gunicorn_conf.py, and net.core.somaxconn caps it), so waiters connect in batches.
"""

import argparse
import asyncio
import json
import os
import resource
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import service  # bench/service.py
from cpu import CpuMeter, load_average, per_request
from runs_api import Client, due, pct


def raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < needed:
        raise SystemExit(f"RLIMIT_NOFILE hard limit {hard} < {needed}: raise it (ulimit -Hn, limits.conf)")
    return hard


def rss_kb(master: int) -> int:
    """Resident memory of gunicorn's master and its workers, in KB."""
    pids = [master] + [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


async def load(
    port: int,
    token: str,
    run_ids: list[str],
    seconds: float,
    concurrency: int,
    meter: CpuMeter,
    rate: float = 0,
) -> dict:
    """Heartbeats from `concurrency` connections and a /healthz prober, for `seconds`: each
    connection as fast as it is answered (rate 0), or all together `rate` a second, evenly
    spaced. Paced, a heartbeat's time counts from when it was due, so one that waits for
    its connection's previous answer counts that wait too."""
    beats: list[float] = []
    health: list[float] = []
    failures = 0
    start = time.perf_counter()
    stop = start + seconds
    body = {"status": "in-progress", "next_update_before": due(), "job_id": "81"}

    async def beater(offset: int) -> None:
        nonlocal failures
        client, i = Client(port, token), offset
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            if rate:
                t0 = start + i / rate
                if t0 > time.perf_counter():
                    await asyncio.sleep(t0 - time.perf_counter())
            status, _ = await client.request("PUT", f"/_puppet/runs/{run_ids[i % len(run_ids)]}/state", body)
            beats.append(time.perf_counter() - t0)
            failures += status != 202
            i += concurrency

    async def prober() -> None:
        nonlocal failures
        client = Client(port, token)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, _ = await client.request("GET", "/healthz")
            health.append(time.perf_counter() - t0)
            failures += status != 200
            await asyncio.sleep(0.02)

    started, cpu = time.perf_counter(), meter.sample()
    await asyncio.gather(prober(), *(beater(i) for i in range(concurrency)))
    elapsed, spent = time.perf_counter() - started, meter.sample()
    cpu_text = per_request(cpu, spent, len(beats) + len(health))
    return {"beats": beats, "health": health, "elapsed": elapsed, "failures": failures, "cpu": cpu_text}


def report(label: str, figures: dict) -> None:
    beats, health, rate = figures["beats"], figures["health"], len(figures["beats"]) / figures["elapsed"]
    print(
        f"{label}: heartbeats {rate:.0f} PUT/s, p50 {pct(beats, 50) * 1000:.1f} ms, "
        f"p99 {pct(beats, 99) * 1000:.1f} ms; /healthz p50 {pct(health, 50) * 1000:.1f} ms, "
        f"p99 {pct(health, 99) * 1000:.1f} ms ({len(health)} probes); failures {figures['failures']}; "
        f"load average {load_average()}",
        flush=True,
    )
    print(f"    {figures['cpu']}", flush=True)


class Waiter:
    """One bridge: a long-poll, asked again whenever answered, until stopped."""

    def __init__(self, port: int, token: str) -> None:
        self.client = Client(port, token)
        self.answered = asyncio.Event()
        self.polls = 0
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            self.polls += 1
            status, data = await self.client.request("GET", "/_puppet/runs?wait=60")
            if status != 200:
                raise RuntimeError(f"long-poll answered {status}: {data[:200]!r}")
            if json.loads(data)["runs"]:
                self.answered.set()
                return  # woken with its run: this bridge is done


async def scale(
    args: argparse.Namespace, port: int, master: int, bench_token: str, run_ids: list[str], tokens: list[str]
) -> None:
    meter = CpuMeter(master, args.database)
    await load(port, bench_token, run_ids, 3, 32, meter)  # warm-up: connections, statements, caches
    report("without waiters", await load(port, bench_token, run_ids, args.seconds, 32, meter))
    if args.rate:
        paced = await load(port, bench_token, run_ids, args.seconds, 32, meter, args.rate)
        report(f"without waiters, {args.rate:.0f} a second", paced)
    before = rss_kb(master)

    waiters = [Waiter(port, token) for token in tokens]
    tasks = []
    opening = time.perf_counter()
    for start in range(0, len(waiters), 500):
        tasks += [asyncio.create_task(w.run()) for w in waiters[start : start + 500]]
        await asyncio.sleep(0.25)
    await asyncio.sleep(5)  # the last ones authenticated and waiting
    opened = time.perf_counter() - opening
    broken = [t for t in tasks if t.done()]
    if broken:
        raise SystemExit(f"{len(broken)} waiters ended early: {broken[0].exception()!r}")
    after = rss_kb(master)
    print(
        f"{len(waiters)} waiters connected and waiting in {opened:.1f} s; "
        f"service RSS {before / 1024:.1f} MB -> "
        f"{after / 1024:.1f} MB: {(after - before) / len(waiters):.1f} KB per waiter",
        flush=True,
    )

    report(f"with {len(waiters)} waiters", await load(port, bench_token, run_ids, args.seconds, 32, meter))
    if args.rate:
        paced = await load(port, bench_token, run_ids, args.seconds, 32, meter, args.rate)
        report(f"with {len(waiters)} waiters, {args.rate:.0f} a second", paced)

    wakes = []
    for k in range(args.rounds):
        waiter = waiters[k * (len(waiters) // args.rounds)]
        step = Client(port, waiter.client.token)
        t0 = time.perf_counter()
        status, _ = await step.request("POST", "/_puppet/runs", {"scope": {"nodes": ["node-a"]}})
        assert status == 201
        await asyncio.wait_for(waiter.answered.wait(), 10)
        wakes.append(time.perf_counter() - t0)
        await asyncio.sleep(0.1)
    print(
        f"wake-up, {args.rounds} rounds with {len(waiters)} waiting: new run to its bridge woken p50 "
        f"{pct(wakes, 50) * 1000:.1f} ms, p99 {pct(wakes, 99) * 1000:.1f} ms, max {max(wakes) * 1000:.1f} ms",
        flush=True,
    )
    polls = sum(w.polls for w in waiters)
    print(f"long-polls sent in all: {polls} (a waiter answered by its wait's end asks again)")
    for w in waiters:
        w.stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    meter.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--in-progress", type=int, default=200)
    parser.add_argument("--database", default="relay_bench_scale", help="made for the run, dropped after")
    parser.add_argument(
        "--rate", type=float, default=1000, help="also heartbeats paced at this rate (0: not)"
    )
    args = parser.parse_args()
    limit = raise_fd_limit(args.waiters + 500)
    print(f"RLIMIT_NOFILE {limit}", flush=True)

    with service.prepared(args.database, ACCESS_LOG="", LOG_LEVEL="WARNING") as env:
        from django.contrib.auth.models import User

        from puppet_connection.models import PuppetConnection
        from relay import tokens as tokenlib
        from runs.models import Run, Status

        owner = User.objects.create_user("bench")
        conn, token = PuppetConnection.create_with_token(owner=owner, name="bench")
        in_progress = Run.objects.bulk_create(
            Run(
                connection=conn,
                scope={"nodes": ["node-a"]},
                status=Status.IN_PROGRESS,
                next_update_before=datetime.now(UTC) + timedelta(minutes=5),
            )
            for _ in range(args.in_progress)
        )
        # The waiters' connections, made directly (their tokens need no Vault copy here).
        plain, rows = [], []
        for i in range(args.waiters):
            row = PuppetConnection(owner=owner, name=f"bridge-{i}")
            secret = tokenlib.generate(PuppetConnection.TOKEN_PREFIX)
            row.set_token(secret)
            plain.append(str(secret))
            rows.append(row)
        PuppetConnection.objects.bulk_create(rows, batch_size=1000)
        with service.gunicorn(env) as (port, master):
            print(
                f"gunicorn {env.get('WEB_CONCURRENCY', '2')} uvicorn workers (relay.server); PostgreSQL "
                f"127.0.0.1; {os.cpu_count()} cores shared with the load generator",
                flush=True,
            )
            import uvloop

            uvloop.run(scale(args, port, master, str(token), [str(r.id) for r in in_progress], plain))


if __name__ == "__main__":
    main()
