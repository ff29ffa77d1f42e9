"""Benchmark of the workflow engine: Celery workers on Redis and PostgreSQL, steps that do
nothing (the internal `relay-internal/noop` image).

    .venv/bin/python bench/workflows.py [--runs 10] [--concurrency 2]

(a) a chain of 20 steps: step-to-step latency (a step's end recorded → the next one's start
    claimed), p50 and p99, and the chain's wall time;
(b) a fan-out of 50 independent steps: wall time from the run's creation to its last step's
    end, and to the run's completion.

It makes its own database (relay_bench_workflows) and OpenBao dev server, uses Redis db 13
(CELERY_BROKER_URL to change it), and starts one worker with `--concurrency` processes
(prefork), as `make run` does with CELERY_CONCURRENCY.
"""

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import service  # bench/service.py

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def document(steps: int, chained: bool) -> str:
    lines = ["apiVersion: v1", "steps:"]
    for i in range(steps):
        lines += [f"- name: s{i}", "  image: relay-internal/noop"]
        if chained and i:
            lines.append(f"  dependsOn: s{i - 1}")
    return "\n".join(lines) + "\n"


def wait_complete(run_id: str, timeout: float = 120) -> None:
    from workflows.models import WorkflowRun

    deadline = time.monotonic() + timeout
    while WorkflowRun.objects.filter(pk=run_id).values_list("status", flat=True).get() != "complete":
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} did not complete in {timeout} s")
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10, help="runs of each shape")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    # The bench's own key prefix in the broker's Redis db (RELAY_DEPLOYMENT_ID), cleared first.
    deployment = "bench-workflows"
    with service.prepared(
        "relay_bench_workflows",
        WORKFLOW_NOOP_STEPS="true",
        CELERY_BROKER_URL=broker,
        RELAY_DEPLOYMENT_ID=deployment,
    ) as env:
        import redis
        from django.contrib.auth.models import User
        from django.db import connections

        from workflows import engine
        from workflows.models import StepRun, Workflow

        client = redis.Redis.from_url(broker)
        for key in client.scan_iter(match=f"{deployment}:*"):
            client.delete(key)
        owner = User.objects.create_user("bench")
        chain = Workflow.objects.create(owner=owner, name="chain")
        chain.add_revision(document(20, chained=True), owner)
        fan = Workflow.objects.create(owner=owner, name="fan-out")
        fan.add_revision(document(50, chained=False), owner)
        connections.close_all()
        worker = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                *("-A", "relay", "worker", "--pool", "prefork", "--concurrency", str(args.concurrency)),
                *("--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"),
            ],
            cwd=ROOT,
            env=env,
        )
        try:
            # One run of each to warm the workers up (imports, connections, parsed documents).
            for workflow in (chain, fan):
                wait_complete(str(engine.create_run(workflow, {}).pk))

            gaps: list[float] = []
            walls: list[float] = []
            for _ in range(args.runs):
                run = engine.create_run(chain, {})
                wait_complete(str(run.pk))
                steps = list(StepRun.objects.filter(run=run).order_by("index"))
                assert all(step.status == "success" for step in steps)
                gaps += [(b.started_at - a.ended_at).total_seconds() for a, b in itertools.pairwise(steps)]
                walls.append((steps[-1].ended_at - run.created_at).total_seconds())
            print(f"(a) 20-step chain, {args.runs} runs, {args.concurrency} worker processes:")
            print(
                f"    step-to-step p50 {pct(gaps, 50) * 1000:.1f} ms, p99 {pct(gaps, 99) * 1000:.1f} ms "
                f"({len(gaps)} gaps); chain wall time p50 {pct(walls, 50):.2f} s"
            )

            to_steps: list[float] = []
            to_run: list[float] = []
            for _ in range(args.runs):
                run = engine.create_run(fan, {})
                wait_complete(str(run.pk))
                run.refresh_from_db()
                steps = list(StepRun.objects.filter(run=run))
                assert all(step.status == "success" for step in steps) and run.outcome == "success"
                to_steps.append((max(s.ended_at for s in steps) - run.created_at).total_seconds())
                to_run.append((run.ended_at - run.created_at).total_seconds())
            print(f"(b) 50-wide fan-out, {args.runs} runs:")
            print(
                f"    created → last step ended p50 {pct(to_steps, 50):.2f} s, max {max(to_steps):.2f} s; "
                f"→ run complete p50 {pct(to_run, 50):.2f} s, max {max(to_run):.2f} s"
            )
        finally:
            worker.terminate()
            worker.wait()
            connections.close_all()
            for key in client.scan_iter(match=f"{deployment}:*"):
                client.delete(key)


if __name__ == "__main__":
    main()
