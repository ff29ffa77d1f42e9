"""Benchmark of the workflow engine: Celery workers on Redis and PostgreSQL, steps that do
nothing (the internal `relay-internal/noop` image).

    .venv/bin/python bench/workflows.py [--runs 10] [--concurrency 2]

(a) a chain of 20 steps: step-to-step latency (a step's end recorded → the next one's start
    claimed), p50 and p99, and the chain's wall time;
(b) a fan-out of 50 independent steps: wall time from the run's creation to its last step's
    end, and to the run's completion;
(c) `--burst` runs (1,000) of a 3-step chain created at once: every one completes (no
    sweeper runs here, so a lost message would show as a run that never does), and the
    time per run.

In the same minutes it runs the floor (../shared/bench-floor, BENCH_FLOOR to point elsewhere:
a Celery task doing one durable PostgreSQL transaction and publishing the next, on a kept
connection) before (a) and after (b), and ends with the ratios to it: step-to-step p50 and
p99 to the floor's hop-to-hop, the fan-out to 50 floor hops on `--concurrency` processes.

It makes its own database (relay_bench_workflows) and OpenBao dev server, uses Redis db 13
(CELERY_BROKER_URL to change it), and starts one worker with `--concurrency` processes
(prefork), as `make run` does with CELERY_CONCURRENCY.
"""

import argparse
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import service  # bench/service.py

ROOT = Path(__file__).resolve().parent.parent
# The floor runs in the environment this bench was started with, not the service's
# (service.prepared sets DJANGO_SETTINGS_MODULE, which would give its worker Django's fixup).
STARTED_ENV = dict(os.environ)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def floor_dir() -> Path | None:
    for candidate in (
        os.environ.get("BENCH_FLOOR"),
        ROOT.parent / "shared/bench-floor",
        ROOT.parent.parent / "shared/bench-floor",
    ):
        if candidate and (Path(candidate) / "bench_floor.py").exists():
            return Path(candidate)
    return None


def floor(concurrency: int) -> tuple[float, float, float] | None:
    """The floor's hop-to-hop p50, p99 and mean, in seconds (None when it is not there)."""
    where = floor_dir()
    if where is None:
        print("floor: ../shared/bench-floor not found (BENCH_FLOOR)")
        return None
    out = subprocess.run(
        [sys.executable, str(where / "bench_floor.py"), "--chains", "10", "--concurrency", str(concurrency)],
        cwd=ROOT,
        env=STARTED_ENV,
        capture_output=True,
        text=True,
    )
    found = re.search(r"hop-to-hop p50 ([\d.]+) ms, p99 ([\d.]+) ms, mean ([\d.]+) ms", out.stdout)
    assert found, out.stdout + out.stderr[-3000:]
    print("    " + found.group(0))
    return tuple(float(value) / 1000 for value in found.groups())  # type: ignore[return-value]


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
    parser.add_argument(
        "--burst", type=int, default=1000, help="runs of a 3-step chain created at once (0: none)"
    )
    args = parser.parse_args()
    print(f"floor, before, {args.concurrency} processes:")
    floors = [floor(args.concurrency)]
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    # The bench's own key prefix in the broker's Redis db (RELAY_DEPLOYMENT_ID), cleared first.
    deployment = "bench-workflows"
    with service.prepared(
        "relay_bench_workflows",
        WORKFLOW_NOOP_STEPS="true",
        CELERY_BROKER_URL=broker,
        RELAY_DEPLOYMENT_ID=deployment,
        RUN_MAX_IN_PROGRESS=str(max(args.burst, 100)),
    ) as env:
        import redis
        from django.contrib.auth.models import User
        from django.db import connections

        from workflows import engine
        from workflows.models import StepRun, Workflow, WorkflowRun

        client = redis.Redis.from_url(broker)
        for key in client.scan_iter(match=f"{deployment}:*"):
            client.delete(key)
        owner = User.objects.create_user("bench")
        chain = Workflow.objects.create(owner=owner, name="chain")
        chain.add_revision(document(20, chained=True), owner)
        fan = Workflow.objects.create(owner=owner, name="fan-out")
        fan.add_revision(document(50, chained=False), owner)
        three = Workflow.objects.create(owner=owner, name="three")
        three.add_revision(document(3, chained=True), owner)
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
            for workflow in (chain, fan, three):
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

            if args.burst:
                began = time.monotonic()
                ids = [engine.create_run(three, {}).pk for _ in range(args.burst)]
                created = time.monotonic() - began
                deadline = time.monotonic() + 600
                done = 0
                while time.monotonic() < deadline:
                    done = WorkflowRun.objects.filter(pk__in=ids, status="complete").count()
                    if done == len(ids):
                        break
                    time.sleep(0.05)
                wall = time.monotonic() - began
                succeeded = WorkflowRun.objects.filter(pk__in=ids, outcome="success").count()
                print(f"(c) {args.burst} runs of a 3-step chain created at once (in {created:.1f} s):")
                print(
                    f"    {done} complete, {succeeded} succeeded, {len(ids) - done} not complete; "
                    f"{wall:.1f} s from the first created to the last complete, "
                    f"{wall / len(ids) * 1000:.1f} ms a run"
                )
        finally:
            worker.terminate()
            worker.wait()
            connections.close_all()
            for key in client.scan_iter(match=f"{deployment}:*"):
                client.delete(key)
    print(f"floor, after, {args.concurrency} processes:")
    floors.append(floor(args.concurrency))
    measured = [f for f in floors if f is not None]
    if measured:
        f50 = sum(f[0] for f in measured) / len(measured)
        f99 = sum(f[1] for f in measured) / len(measured)
        hops = 50 * f50 / args.concurrency  # 50 floor hops on `concurrency` processes
        p50, p99, fan = pct(gaps, 50), pct(gaps, 99), pct(to_steps, 50)
        print(
            f"fan-out p50 {fan:.3f} s, 50 floor hops on {args.concurrency} processes {hops:.3f} s, "
            f"ratio {fan / hops:.1f}"
        )
        print(f"step-to-step p99 {p99 * 1000:.1f} ms, floor p99 {f99 * 1000:.1f} ms, ratio {p99 / f99:.2f}")
        print(f"step-to-step p50 {p50 * 1000:.1f} ms, floor p50 {f50 * 1000:.1f} ms, ratio {p50 / f50:.2f}")


if __name__ == "__main__":
    main()
