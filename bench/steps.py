"""Benchmark of script steps and the step runtime API: real bubblewrap sandboxes on a worker of
the `steps` queue, the engine on its own worker, gunicorn (relay/gunicorn_conf.py) serving
the runtime API, OpenBao, Redis and PostgreSQL, everything on this machine.

    .venv/bin/python bench/steps.py [--requests 500] [--runs 30] [--parallel 20] [--only spec]

One function per figure, each printing its own lines:
- `spec_latency`: the step runtime API's `GET /spec` as a running step calls it (a spec with a
  parameter, a secret read from Vault, an output of an earlier step and a function), p50 and
  p99, sequential requests on one keep-alive connection; `GET /spec?q=…` (relay_sdk's
  `Interface().get(D.x)`, a value that needs no secret); a new connection per request, as
  relay_sdk and ni make them; and `GET /healthz`, the server's floor; the CPU milliseconds
  per whole-spec request of gunicorn's processes and of PostgreSQL's backends (bench/cpu.py).
  (Before any worker starts: nothing else runs.)
- `sandbox_start`: a script step's start, from the sandbox's launch (bubblewrap spawned) to
  the first line of its output, p50 and p99 over `--runs` steps run one after another;
- `parallel_scripts`: `--parallel` script steps of one run side by side (each reads its spec
  with `ni get | jq` and sets an output), on a `steps` worker with as many processes: the
  run's wall time and each step's own time (its script taken by a worker to its exit), and
  the same step run alone.

`--only spec` prints the first figure alone (no worker starts), `--only sandbox` the others.
It makes its own database (relay_bench_steps, or `--database`) and OpenBao dev server, uses Redis db 13
(CELERY_BROKER_URL to change it) under its own key prefix.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import service  # bench/service.py
from cpu import CpuMeter, load_average, per_request  # bench/cpu.py

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """
apiVersion: v1
parameters:
  environment: {default: production}
steps:
- name: before
  image: relaysh/core
- name: step
  image: relaysh/core
  spec:
    environment: !Parameter environment
    connectionToken: !Secret apiToken
    changes: !Output [before, changes]
    summary: !Fn.concat ["run in ", !Parameter environment]
    nodes: [web1, web2, db1]
  dependsOn: before
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def timed(call: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return times


def a_running_step() -> tuple[str, str]:
    """A step in progress, its earlier step done with an output; (token, run id)."""
    from django.contrib.auth.models import User

    from stepruntime.credentials import grant
    from workflows import engine
    from workflows.models import Workflow, WorkflowSecret

    owner = User.objects.create_user("bench")
    workflow = Workflow.objects.create(owner=owner, name="spec-bench")
    workflow.add_revision(SOURCE, owner)
    WorkflowSecret.put(workflow, "apiToken", "bench-secret-value", owner)
    run = engine.create_run(workflow, {}, created_by=owner)
    run.begin()
    before = run.steps.get(name="before")
    lease = before.claim(300, [])
    before.put_output("changes", [{"resource": "File[/etc/motd]", "corrective": True}])
    before.record_done(lease, True, {}, "")
    step = run.steps.get(name="step")
    step.claim(3600, [])
    url = grant(step.pk)
    return url.split("//", 1)[1].split(":", 1)[0], str(run.pk)


def spec_latency(port: int, token: str, count: int, meter: CpuMeter | None = None) -> dict[str, float]:
    base = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.auth = (token, "")
    response = session.get(f"{base}/spec")
    assert response.ok and response.json()["complete"], response.text
    for _ in range(50):  # warm up every gunicorn worker
        session.get(f"{base}/spec")
    cpu = meter.sample() if meter else None
    whole = timed(lambda: session.get(f"{base}/spec").raise_for_status(), count)
    spent = meter.sample() if meter else None
    query = timed(
        lambda: session.get(f"{base}/spec", params={"q": 'changes[0]["resource"]'}).raise_for_status(), count
    )
    floor = timed(lambda: session.get(f"{base}/healthz").raise_for_status(), count)
    fresh = timed(
        lambda: requests.get(
            f"{base}/spec", auth=(token, ""), headers={"Connection": "close"}
        ).raise_for_status(),
        count,
    )
    figures = {
        "spec_p50_ms": pct(whole, 50),
        "spec_p99_ms": pct(whole, 99),
        "spec_query_p50_ms": pct(query, 50),
        "spec_new_connection_p50_ms": pct(fresh, 50),
        "healthz_p50_ms": pct(floor, 50),
    }
    print(
        f"GET /spec ({count} sequential, keep-alive): "
        f"p50 {pct(whole, 50):.2f} ms, p99 {pct(whole, 99):.2f} ms (load {load_average()})"
    )
    if cpu and spent:
        print(f"    {per_request(cpu, spent, count)}")
    print(f"GET /spec?q=… (relay_sdk's get(D.x)): p50 {pct(query, 50):.2f} ms, p99 {pct(query, 99):.2f} ms")
    print(f"GET /spec, a new connection each (relay_sdk, ni): p50 {pct(fresh, 50):.2f} ms")
    print(f"GET /healthz (the server's floor: no database): p50 {pct(floor, 50):.2f} ms")
    return figures


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500, help="requests per /spec figure")
    parser.add_argument("--runs", type=int, default=30, help="steps for the start figure")
    parser.add_argument("--parallel", type=int, default=20, help="steps side by side")
    parser.add_argument("--only", choices=("spec", "sandbox"), help="those figures alone")
    parser.add_argument("--database", default="relay_bench_steps", help="made and dropped")
    args = parser.parse_args()
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    deployment = "bench-steps"
    port = service.free_port()
    with service.prepared(
        args.database,
        ACCESS_LOG="",
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
        token, _ = a_running_step()
        owner = User.objects.get(username="bench")
        connections.close_all()
        with service.gunicorn(env) as (_, master):
            if args.only != "sandbox":
                meter = CpuMeter(master, args.database)
                try:
                    spec_latency(port, token, args.requests, meter)
                finally:
                    meter.close()
            if args.only == "spec":
                return
            workers = [worker(env, "celery", 2), worker(env, "steps", args.parallel)]
            try:
                sandbox_start(owner, args)
                parallel_scripts(owner, args)
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
