"""Benchmark of the workflow and run pages (pages/): server time, in this process (Django's
test client: the view, its queries and its template, no network), on PostgreSQL.

    .venv/bin/python bench/pages.py [--requests 50]

(a) a run's page with 50 steps, and its live part (what an open page asks each second): p50,
    p99, and the queries each live poll makes;
(b) a workflow's page with 200 runs, and with 10,000 (50 shown, each numbered from the first).

It makes its own database (relay_bench_pages) and OpenBao dev server, and prints its figures.
"""

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta

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
    args = parser.parse_args()
    static = tempfile.mkdtemp(prefix="relay-bench-static-")
    with service.prepared(
        "relay_bench_pages", STATIC_ROOT=static, ALLOWED_HOSTS="testserver", WORKFLOW_NOOP_STEPS="true"
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
        version = client.get(live).content.decode().split('"X-Live-Version": "')[1].split('"')[0]
        print(
            line(
                "(a) its live part, unchanged (204)",
                timed(client, live, args.requests, X_Live_Version=version),
            )
        )
        with CaptureQueriesContext(connection) as queries:
            client.get(live, headers={"X-Live-Version": version})
        print(f"(a) queries per live poll: {len(queries.captured_queries)}")

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


if __name__ == "__main__":
    main()
