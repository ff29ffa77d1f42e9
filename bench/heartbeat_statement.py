"""PostgreSQL's own cost of one heartbeat (runs.models.heartbeat_sql), without the web
processes and without concurrency: the statement sent serially on one connection, the
backend's CPU read from /proc (bench/cpu.py), for each of the choices this service made:

    .venv/bin/python bench/heartbeat_statement.py [--heartbeats 10000]

- "before": the indexes this table had before (status, next_update_before) and (status,
  updated_at), so no update is HOT, fillfactor 100, and a synchronous commit;
- asynchronous commit (relay.adb: the async pool's connections);
- HOT updates (migration runs 0003: no index on a column a heartbeat writes, fillfactor 80);
- both, by TCP and by the Unix socket.

It prints CPU and wall-clock microseconds per heartbeat and how many updates were HOT.
Each variant is run twice, the table rewritten (VACUUM FULL) before each.
"""

import argparse
import time
from datetime import UTC, datetime, timedelta

import psycopg
import service  # bench/service.py
from cpu import cpu_seconds

DATABASE = "relay_bench_statement"
TCP = f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
SOCKET = f"postgresql://postgres@/{DATABASE}?host=/var/run/postgresql"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heartbeats", type=int, default=10_000)
    args = parser.parse_args()
    with service.prepared(DATABASE):
        from django.contrib.auth.models import User
        from django.db import connection

        from puppet_connection.models import PuppetConnection
        from runs.models import Run, Status, heartbeat_sql

        owner = User.objects.create_user("bench")
        conn, _ = PuppetConnection.create_with_token(owner=owner, name="bench")
        PuppetConnection.objects.filter(pk=conn.pk).update(last_used=datetime.now(UTC) + timedelta(hours=1))
        conn.refresh_from_db()
        Run.objects.bulk_create(Run(connection=conn, scope={"nodes": ["a"]}) for _ in range(2000))
        due = datetime.now(UTC) + timedelta(minutes=5)
        runs = Run.objects.bulk_create(
            Run(connection=conn, scope={"nodes": ["a"]}, status=Status.IN_PROGRESS, next_update_before=due)
            for _ in range(200)
        )
        connection.close()
        sql = heartbeat_sql()

        def params(i: int) -> dict:
            now = datetime.now(UTC)
            return {
                "run": runs[i % len(runs)].id,
                "connection": conn.id,
                "held_0": Status.IN_PROGRESS.value,
                "held_1": Status.IN_PROGRESS.value,
                "lease": None,
                "digest": conn.token_digest,
                "pepper": conn.token_pepper_id,
                "used_since": now - timedelta(seconds=60),
                "platform": "",
                "backend": "",
                "now": now,
                "next_update_before": now + timedelta(seconds=45),
                "job_id": "81",
            }

        def variant(name: str, before: bool, synchronous: bool, url: str = TCP) -> None:
            with psycopg.connect(TCP, autocommit=True) as admin:
                admin.execute("DROP INDEX IF EXISTS bench_before_a")
                admin.execute("DROP INDEX IF EXISTS bench_before_b")
                if before:
                    admin.execute("CREATE INDEX bench_before_a ON runs_run (status, next_update_before)")
                    admin.execute("CREATE INDEX bench_before_b ON runs_run (status, updated_at)")
                admin.execute(f"ALTER TABLE runs_run SET (fillfactor = {100 if before else 80})")
                admin.execute("VACUUM FULL runs_run")
            with psycopg.connect(url, autocommit=True, prepare_threshold=0) as db:
                if not synchronous:
                    db.execute("SET synchronous_commit = off")
                pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
                for i in range(500):  # prepared, caches warm
                    db.execute(sql, params(i)).fetchone()
                updates = db.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs_run'"
                )
                updated, hot = updates.fetchone()
                cpu, wall = cpu_seconds(pid), time.perf_counter()
                for i in range(args.heartbeats):
                    assert db.execute(sql, params(i)).fetchone() is not None
                cpu, wall = cpu_seconds(pid) - cpu, time.perf_counter() - wall
                db.execute("SELECT pg_stat_force_next_flush()")
            with psycopg.connect(TCP, autocommit=True) as admin:
                time.sleep(0.5)
                after = admin.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs_run'"
                )
                updated_after, hot_after = after.fetchone()
            each = 1e6 / args.heartbeats
            print(
                f"{name:46s} PostgreSQL CPU {cpu * each:4.0f} us, wall {wall * each:4.0f} us"
                f" per heartbeat; HOT {hot_after - hot} of {updated_after - updated} updates",
                flush=True,
            )

        for _ in range(2):
            variant("before: indexed columns, synchronous commit", True, True)
            variant("asynchronous commit", True, False)
            variant("HOT updates", False, True)
            variant("HOT updates, asynchronous commit", False, False)
            variant("HOT updates, asynchronous commit, Unix socket", False, False, SOCKET)


if __name__ == "__main__":
    main()
