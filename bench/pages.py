"""Benchmark of the workflow and run pages (pages/): server time, in this process (Django's
test client: the view, its queries and its template, no network), on PostgreSQL.

    .venv/bin/python bench/pages.py [--requests 50]

(a) a run's page with 50 steps, one of them with a 1 MB log; that step's part (its spec
    evaluated), the first page of its log, and the live part as Django answers it: p50, p99,
    and the queries each Django ask makes;
(b) a workflow's page with 200 runs, and with 10,000 (50 shown, each numbered from the first),
    and the admin's list of runs with 10,000;
(c) 100 open pages watching a run live, against gunicorn as production runs it (relay.asgi:
    their asks wait on the loop, pages.live): the queries they cost the database per page and
    second, idle and while steps change every 2 s, and how long a change takes to show on all
    of them (from the change's commit to each page's new part).

It makes its own database (relay_bench_pages) and OpenBao dev server, and prints its figures.
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta

import psycopg
import requests
import service  # bench/service.py

NOOP = "relay-internal/noop"


def timed(client, path: str, count: int, **headers: str) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        response = client.get(path, headers=headers)
        times.append(time.perf_counter() - start)
        assert response.status_code in (200, 204), (path, response.status_code)
    return times


def line(what: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{what:<44} p50 {statistics.median(times) * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--watchers", type=int, default=100)
    args = parser.parse_args()
    static = tempfile.mkdtemp(prefix="relay-bench-static-")
    with service.prepared(
        "relay_bench_pages",
        STATIC_ROOT=static,
        ALLOWED_HOSTS="testserver,127.0.0.1",
        WORKFLOW_NOOP_STEPS="true",
    ) as env:
        import subprocess

        subprocess.run(
            [sys.executable, str(service.ROOT / "manage.py"), "collectstatic", "--noinput", "-v0"],
            env=env,
            check=True,
        )
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from scriptsteps.models import LogChunk, ScriptRun
        from workflows import engine
        from workflows.models import StepRun, Workflow, WorkflowRun

        owner = User.objects.create_user("ops")
        client = Client()
        client.force_login(owner)

        # (a) 50 steps: 10 chains of 5, a third of them done.
        steps = "".join(
            f"- name: step-{i:02d}\n  image: {NOOP}\n"
            + (f"  dependsOn: step-{i - 10:02d}\n" if i >= 10 else "")
            for i in range(50)
        )
        big = Workflow.objects.create(owner=owner, name="fifty")
        big.add_revision(f"apiVersion: v1\nsteps:\n{steps}", owner)
        run = engine.create_run(big, {}, created_by=owner)
        now = timezone.now()
        StepRun.objects.filter(run=run, index__lt=17).update(status="success", started_at=now, ended_at=now)
        page = f"/app/runs/{run.pk}/"
        timed(client, page, 3)  # dot's drawing is cached after the first
        print(line("(a) run page, 50 steps", timed(client, page, args.requests)))
        live = f"{page}live/"
        print(line("(a) its live part, changed", timed(client, live, args.requests)))
        version = re.search(r'"X-Live-Version": "(\w+)"', client.get(live).content.decode())[1]
        print(
            line(
                "(a) its live part, unchanged (204)",
                timed(client, live, args.requests, X_Live_Version=version),
            )
        )
        with CaptureQueriesContext(connection) as queries:
            client.get(live, headers={"X-Live-Version": version})
        print(f"(a) queries per Django live ask, unchanged: {len(queries.captured_queries)}")
        with CaptureQueriesContext(connection) as queries:
            client.get(live)
        print(f"(a) queries per Django live ask, changed: {len(queries.captured_queries)}")

        # (a) one step with a 1 MB log (64 KB chunks, as a script's writer stores it).
        logged = StepRun.objects.get(run=run, name="step-03")
        script = ScriptRun.objects.create(step_run=logged, status="succeeded", log_length=MB)
        chunk = ("x" * 99 + "\n") * 655 + "y" * 36  # 65,536 characters
        LogChunk.objects.bulk_create(
            LogChunk(script=script, start=start, text=chunk) for start in range(0, MB, len(chunk))
        )
        print(line("(a) run page, 50 steps, a 1 MB log", timed(client, page, args.requests)))
        print(line("(a) the logged step's part", timed(client, f"{page}steps/step-03/", args.requests)))
        log_url = f"/api/workflow-runs/{run.pk}/steps/step-03/log"
        print(line("(a) its log's first page (256 KB)", timed(client, log_url, args.requests)))

        # (b) a workflow's page with 200 runs, then 10,000.
        small = Workflow.objects.create(owner=owner, name="three")
        small.add_revision(f"apiVersion: v1\nsteps:\n- name: a\n  image: {NOOP}\n", owner)
        revision = small.latest_revision()
        for total in (200, 10_000):
            have = WorkflowRun.objects.filter(workflow=small).count()
            start = timezone.now() - timedelta(days=30)
            WorkflowRun.objects.bulk_create(
                WorkflowRun(
                    workflow=small,
                    revision=revision,
                    created_by=owner,
                    status="complete",
                    outcome="success" if i % 7 else "failure",
                    created_at=start + timedelta(seconds=i * 60),
                    started_at=start + timedelta(seconds=i * 60),
                    ended_at=start + timedelta(seconds=i * 60 + 42),
                )
                for i in range(have, total)
            )
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE workflows_workflowrun")
            path = f"/app/workflows/{small.pk}/"
            print(line(f"(b) workflow page, {total:,} runs", timed(client, path, args.requests)))
            print(line("(b) the same, failures only", timed(client, path + "?status=failure", args.requests)))
        owner.is_staff = owner.is_superuser = True
        owner.save()
        print(line("(b) admin's runs list, 10,000+ runs", timed(client, "/admin/workflows/workflowrun/", 20)))

        # (c) 100 pages watching `run`, served by gunicorn.
        watchers(env, client, run, args.watchers)


MB = 1024 * 1024


class Watcher(threading.Thread):
    """One open run page: asks for the live part with the version it has, again and again,
    as pages/static/pages/run.js does; notes when each new part came."""

    def __init__(
        self, url: str, cookies: dict[str, str], headers: dict[str, str], stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.stop = url, headers, stop
        self.session = requests.Session()
        self.session.cookies.update(cookies)
        self.changes: list[tuple[float, str]] = []  # (when, status words shown)
        self.asks = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                answer = self.session.get(self.url, headers=self.headers, timeout=60)
            except requests.RequestException:
                time.sleep(1)
                continue
            self.asks += 1
            if answer.status_code == 200:
                self.headers = json.loads(re.search(r"hx-headers='([^']*)'", answer.text)[1])
                self.changes.append((time.monotonic(), answer.text))
            elif answer.status_code != 204:
                time.sleep(1)


def transactions(database: str) -> int:
    """The database's transactions so far (each query of an autocommit connection is one)."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [database]
        ).fetchone()
        return int(row[0])


def watchers(env: dict[str, str], client, run, count: int) -> None:
    from workflows.models import StepRun

    page = client.get(f"/app/runs/{run.pk}/").content.decode()
    headers = json.loads(re.search(r"hx-headers='([^']*)'", page)[1])
    cookies = {"sessionid": client.cookies["sessionid"].value}
    database = "relay_bench_pages"
    with service.gunicorn(env) as (port, _):
        stop = threading.Event()
        url = f"http://127.0.0.1:{port}/app/runs/{run.pk}/live/"
        pages = [Watcher(url, cookies, headers, stop) for _ in range(count)]
        for watcher in pages:
            watcher.start()
        time.sleep(5)  # all asking
        idle = 30
        before = transactions(database)
        time.sleep(idle)
        spent = transactions(database) - before - 2  # the two reads of the counter
        time.sleep(11)  # before the next count: what idle backends still had to report
        print(
            f"(c) {count} pages watching, idle {idle} s: {spent} queries, "
            f"{spent / count / idle:.3f} per page per second"
        )
        latencies = []
        steps = list(StepRun.objects.filter(run=run, status="pending").order_by("index")[:10])
        before = transactions(database)
        started = time.monotonic()
        for step in steps:
            seen = [len(watcher.changes) for watcher in pages]
            changed = time.monotonic()
            step.skip("skipped by the bench")  # a transition: committed, notified
            deadline = changed + 10
            while time.monotonic() < deadline and any(
                len(w.changes) == n for w, n in zip(pages, seen, strict=True)
            ):
                time.sleep(0.01)
            for watcher, n in zip(pages, seen, strict=True):
                if len(watcher.changes) > n:
                    latencies.append(watcher.changes[n][0] - changed)
            time.sleep(max(0.0, changed + 2 - time.monotonic()))
        took = time.monotonic() - started
        time.sleep(11)  # idle backends report their counts within 10 s (PostgreSQL 15)
        spent = transactions(database) - before - 2 - len(steps) * 2  # less the bench's own
        stop.set()
        print(
            f"(c) {count} pages, a step changing every 2 s ({len(steps)} changes, {took:.0f} s): "
            f"{spent} queries, {spent / count / took:.3f} per page per second, "
            f"{spent / count / len(steps):.1f} per page per change"
        )
        ordered = sorted(latencies)
        print(
            f"(c) a change shown on {len(latencies)}/{count * len(steps)} pages: "
            f"p50 {statistics.median(ordered) * 1000:.0f} ms, p99 "
            f"{ordered[int(len(ordered) * 0.99) - 1] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
