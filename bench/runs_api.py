"""Benchmark of the runs API against gunicorn (relay/gunicorn_conf.py) and PostgreSQL.

    .venv/bin/python bench/runs_api.py [--runs 2000] [--accepters 64] [--seconds 10]

(a) 64 concurrent accepters over 2,000 pending runs: accepts per second and duplicates.
(b) heartbeat PUTs per second, p50 and p99, for 200 runs in progress.
(c) new-run-to-accept latency for a bridge waiting in long-poll, p50 and p99.

It makes its own database (relay_bench) and OpenBao dev server, and prints its figures. The
load generator is a small asyncio HTTP/1.1 keep-alive client in this process: it shares the
machine's cores with gunicorn and PostgreSQL, so the figures are for everything on one box.
"""

import argparse
import asyncio
import json
import os
import random
import time
from datetime import UTC, datetime, timedelta

import service  # bench/service.py
from cpu import CpuMeter, load_average, per_request


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        status = int((await self.reader.readline()).split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            self.writer.close()
            self.writer = None
        return status, data


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def due(seconds: int = 45) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def bench_accept(port: int, token: str, run_ids: list[str], accepters: int) -> None:
    accepted: set[str] = set()
    wins: list[str] = []
    counts = {"requests": 0, "errors": 0}

    async def accepter(seed: int) -> None:
        client = Client(port, token)
        order = run_ids[:]
        random.Random(seed).shuffle(order)
        for run_id in order:
            if run_id in accepted:  # what a bridge would learn from its next listing
                continue
            status, _ = await client.request("POST", f"/_puppet/runs/{run_id}/accept")
            counts["requests"] += 1
            if status == 202:
                wins.append(run_id)
                accepted.add(run_id)
            elif status != 409:
                counts["errors"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(accepter(i) for i in range(accepters)))
    elapsed = time.perf_counter() - started
    duplicates = len(wins) - len(set(wins))
    won, sent = len(set(wins)), counts["requests"]
    print(f"(a) {accepters} accepters, {len(run_ids)} pending runs: {won} accepted in {elapsed:.2f} s")
    print(
        f"    accepts/s {won / elapsed:.0f}; requests/s {sent / elapsed:.0f} "
        f"({sent - len(wins)} answered 409); duplicates {duplicates}; other answers {counts['errors']}"
    )


async def bench_heartbeats(
    port: int, token: str, run_ids: list[str], seconds: float, concurrency: int, meter: CpuMeter
) -> None:
    latencies: list[float] = []
    failures = 0
    stop = 0.0
    body = {"status": "in-progress", "next_update_before": due(), "job_id": "81"}

    async def beater(offset: int) -> None:
        nonlocal failures
        client = Client(port, token)
        i = offset
        while time.perf_counter() < stop:
            run_id = run_ids[i % len(run_ids)]
            i += concurrency
            t0 = time.perf_counter()
            status, _ = await client.request("PUT", f"/_puppet/runs/{run_id}/state", body)
            latencies.append(time.perf_counter() - t0)
            failures += status != 202

    stop = time.perf_counter() + 3
    await asyncio.gather(*(beater(i) for i in range(concurrency)))  # warm-up: connections, statements
    latencies.clear()
    failures = 0
    stop = time.perf_counter() + seconds
    started, cpu = time.perf_counter(), meter.sample()
    await asyncio.gather(*(beater(i) for i in range(concurrency)))
    elapsed, spent = time.perf_counter() - started, meter.sample()
    print(f"(b) heartbeats over {len(run_ids)} in-progress runs, {concurrency} connections, {elapsed:.1f} s:")
    print(
        f"    {len(latencies) / elapsed:.0f} PUT/s; p50 {pct(latencies, 50) * 1000:.1f} ms, "
        f"p99 {pct(latencies, 99) * 1000:.1f} ms; non-202 {failures}; load average {load_average()}"
    )
    print(f"    {per_request(cpu, spent, len(latencies))}")


async def bench_longpoll(port: int, token: str, rounds: int) -> None:
    dispatch, to_accept = [], []
    bridge, step = Client(port, token), Client(port, token)
    for _ in range(rounds):
        waiting = asyncio.create_task(bridge.request("GET", "/_puppet/runs?wait=30&status=pending"))
        await asyncio.sleep(0.2)  # the bridge is parked in its long-poll
        created_at = time.perf_counter()
        status, data = await step.request("POST", "/_puppet/runs", {"scope": {"nodes": ["node-a"]}})
        assert status == 201
        run_id = json.loads(data)["id"]
        status, data = await waiting
        woke_at = time.perf_counter()
        assert status == 200 and run_id in [r["id"] for r in json.loads(data)["runs"]], data
        status, _ = await bridge.request("POST", f"/_puppet/runs/{run_id}/accept")
        assert status == 202
        dispatch.append(woke_at - created_at)
        to_accept.append(time.perf_counter() - created_at)
    print(
        f"(c) long-poll, {rounds} rounds: new run to bridge woken p50 {pct(dispatch, 50) * 1000:.1f} ms, "
        f"p99 {pct(dispatch, 99) * 1000:.1f} ms; to accepted p50 {pct(to_accept, 50) * 1000:.1f} ms, "
        f"p99 {pct(to_accept, 99) * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--accepters", type=int, default=64)
    parser.add_argument("--in-progress", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--heartbeat-connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run")
    parser.add_argument("--database", default="relay_bench", help="made for the run, dropped after")
    parser.add_argument("--access-log", action="store_true", help="as production's default: a line a request")
    args = parser.parse_args()

    # Production's default writes an access log line per request (ACCESS_LOG, "-"); the
    # benchmarks leave it off unless asked (--access-log: its lines go to /dev/null).
    with service.prepared(args.database, ACCESS_LOG="-" if args.access_log else "") as env:
        from django.contrib.auth.models import User

        from puppet_connection.models import PuppetConnection
        from runs.models import Run, Status

        owner = User.objects.create_user("bench")
        conn, token = PuppetConnection.create_with_token(owner=owner, name="bench")
        pending = Run.objects.bulk_create(
            Run(connection=conn, scope={"nodes": ["node-a"]}) for _ in range(args.runs)
        )
        in_progress = Run.objects.bulk_create(
            Run(
                connection=conn,
                scope={"nodes": ["node-a"]},
                status=Status.IN_PROGRESS,
                next_update_before=datetime.now(UTC) + timedelta(minutes=5),
            )
            for _ in range(args.in_progress)
        )
        with service.gunicorn(env) as (port, master):
            workers, threads = env.get("WEB_CONCURRENCY", "2"), env.get("WEB_THREADS", "16")
            print(
                f"gunicorn: {workers} workers x {threads} threads; PostgreSQL 127.0.0.1; "
                f"{os.cpu_count()} cores shared with the load generator"
            )
            if "a" in args.parts:
                asyncio.run(bench_accept(port, str(token), [str(r.id) for r in pending], args.accepters))
            if "b" in args.parts:
                meter = CpuMeter(master, args.database)
                ids = [str(r.id) for r in in_progress]
                asyncio.run(
                    bench_heartbeats(port, str(token), ids, args.seconds, args.heartbeat_connections, meter)
                )
                meter.close()
            Run.objects.filter(status=Status.PENDING).delete()
            if "c" in args.parts:
                asyncio.run(bench_longpoll(port, str(token), args.rounds))


if __name__ == "__main__":
    main()
