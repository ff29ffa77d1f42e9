"""Benchmark of script steps and the step runtime API: real bubblewrap sandboxes on a worker of
the `steps` queue, the engine on its own worker, gunicorn serving the runtime API, Redis and
PostgreSQL.

    .venv/bin/python bench/steps.py [--runs 30] [--parallel 20]

One function per figure, each printing its own lines:
- `sandbox_start`: a script step's start, from the sandbox's launch (bubblewrap spawned) to
  the first line of its output, p50 and p99 over `--runs` steps run one after another;
- `parallel_scripts`: `--parallel` script steps of one run side by side (each reads its spec
  with `ni get | jq` and sets an output), on a `steps` worker with as many processes: the
  run's wall time and each step's own time (its script taken by a worker to its exit), and
  the same step run alone.

It makes its own database (relay_bench_steps) and OpenBao dev server, uses Redis db 13
(CELERY_BROKER_URL to change it) under its own key prefix.
"""

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import service  # bench/service.py

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def wait_complete(run_id: str, timeout: float = 300) -> None:
    from workflows.models import WorkflowRun

    deadline = time.monotonic() + timeout
    while WorkflowRun.objects.filter(pk=run_id).values_list("status", flat=True).get() != "complete":
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} did not complete in {timeout} s")
        time.sleep(0.01)


def worker(env: dict[str, str], queues: str, concurrency: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"),
            *("-A", "relay", "worker", "--pool", "prefork", "--concurrency", str(concurrency)),
            *("--queues", queues, "--hostname", f"{queues}@%h"),
            *("--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,  # the banner; warnings and errors still show (stderr)
    )


def run_workflow(owner, name: str, source: str) -> str:
    from workflows import engine
    from workflows.models import Workflow

    workflow = Workflow.objects.create(owner=owner, name=name)
    workflow.add_revision(source, owner)
    run = engine.create_run(workflow, {})
    wait_complete(str(run.pk))
    return str(run.pk)


def sandbox_start(owner, args: argparse.Namespace) -> None:
    from scriptsteps.models import ScriptRun
    from workflows.models import WorkflowRun

    source = "apiVersion: v1\nsteps:\n- {name: hello, image: relaysh/core, input: ['echo first line']}\n"
    run_workflow(owner, "warm-up", source)  # imports and connections of the workers
    starts: list[float] = []
    for i in range(args.runs):
        run_id = run_workflow(owner, f"start-{i}", source)
        assert WorkflowRun.objects.get(pk=run_id).outcome == "success"
        starts.append(ScriptRun.objects.get(step_run__run_id=run_id).first_output_ms)
    print(f"(a) a script step's start (sandbox launched → first line of output), {args.runs} steps:")
    print(f"    p50 {pct(starts, 50):.1f} ms, p99 {pct(starts, 99):.1f} ms, max {max(starts):.1f} ms")


def parallel_scripts(owner, args: argparse.Namespace) -> None:
    from scriptsteps.models import ScriptRun
    from workflows.models import StepRun, WorkflowRun

    lines = ["apiVersion: v1", "steps:"]
    for i in range(args.parallel):
        lines += [
            f"- name: s{i}",
            "  image: relaysh/core",
            f"  spec: {{n: {i}}}",
            "  input:",
            "  - N=$(ni get | jq .n)",
            '  - echo "step $N"',
            '  - ni output set -k n -v "$N"',
        ]
    source = "\n".join(lines) + "\n"
    run_workflow(owner, "parallel-warm-up", source)
    # The same script alone, for comparison: what one step costs with the cores to itself.
    alone: list[float] = []
    for i in range(5):
        run_id = run_workflow(owner, f"alone-{i}", "\n".join(lines[:9]) + "\n")
        script = ScriptRun.objects.get(step_run__run_id=run_id)
        alone.append((script.ended_at - script.started_at).total_seconds())
    walls: list[float] = []
    per_step: list[float] = []
    for i in range(3):
        run_id = run_workflow(owner, f"parallel-{i}", source)
        run = WorkflowRun.objects.get(pk=run_id)
        steps = list(StepRun.objects.filter(run=run))
        assert run.outcome == "success" and all(s.outputs == {"n": str(s.index)} for s in steps), run.message
        walls.append((max(s.ended_at for s in steps) - run.created_at).total_seconds())
        per_step += [
            (script.ended_at - script.started_at).total_seconds()
            for script in ScriptRun.objects.filter(step_run__run=run)
        ]
    cores = os.cpu_count()
    print(
        f"(b) {args.parallel} script steps side by side "
        f"({args.parallel} `steps` processes, {cores} cores), 3 runs:"
    )
    print(f"    run created → last step ended: p50 {pct(walls, 50):.2f} s, max {max(walls):.2f} s")
    print(
        f"    each step's script (taken by a worker → exited; `ni get | jq`, `ni output set`): "
        f"p50 {pct(per_step, 50) * 1000:.0f} ms, p99 {pct(per_step, 99) * 1000:.0f} ms; "
        f"the same step alone: p50 {pct(alone, 50) * 1000:.0f} ms"
    )


FIGURES: list[Callable] = [sandbox_start, parallel_scripts]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30, help="steps for the start figure")
    parser.add_argument("--parallel", type=int, default=20, help="steps side by side")
    args = parser.parse_args()
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    deployment = "bench-steps"
    port = service.free_port()
    with service.prepared(
        "relay_bench_steps",
        CELERY_BROKER_URL=broker,
        RELAY_DEPLOYMENT_ID=deployment,
        PORT=str(port),
        STEP_RUNTIME_URL=f"http://127.0.0.1:{port}",
    ) as env:
        import redis
        from django.contrib.auth.models import User
        from django.db import connections

        client = redis.Redis.from_url(broker)
        for key in client.scan_iter(match=f"{deployment}:*"):
            client.delete(key)
        owner = User.objects.create_user("bench")
        connections.close_all()
        with service.gunicorn(env):
            workers = [worker(env, "celery", 2), worker(env, "steps", args.parallel)]
            try:
                for figure in FIGURES:
                    figure(owner, args)
            finally:
                for process in workers:
                    process.terminate()
                for process in workers:
                    process.wait()
                connections.close_all()
                for key in client.scan_iter(match=f"{deployment}:*"):
                    client.delete(key)


if __name__ == "__main__":
    main()
