"""Benchmark of script steps and the step runtime API, against gunicorn (relay/gunicorn_conf.py)
and PostgreSQL, everything on this machine.

    .venv/bin/python bench/steps.py [--requests 500]

One function per figure; each prints its lines and returns its numbers:

- spec_latency: the step runtime API's `GET /spec` as a running step calls it (a spec with a
  parameter, a secret read from Vault, an output of an earlier step and a function), p50 and
  p99, sequential requests on one keep-alive connection; `GET /spec?q=…` (relay_sdk's
  `Interface().get(D.x)`, a value that needs no secret); a new connection per request, as
  relay_sdk and ni make them; and `GET /healthz`, the server's floor.

It makes its own database (relay_bench_steps) and OpenBao dev server.
"""

import argparse
import time
from typing import Any

import requests
import service  # bench/service.py

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


def spec_latency(port: int, token: str, count: int) -> dict[str, float]:
    base = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.auth = (token, "")
    response = session.get(f"{base}/spec")
    assert response.ok and response.json()["complete"], response.text
    for _ in range(50):  # warm up every gunicorn worker
        session.get(f"{base}/spec")
    whole = timed(lambda: session.get(f"{base}/spec").raise_for_status(), count)
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
        f"p50 {pct(whole, 50):.2f} ms, p99 {pct(whole, 99):.2f} ms"
    )
    print(f"GET /spec?q=… (relay_sdk's get(D.x)): p50 {pct(query, 50):.2f} ms, p99 {pct(query, 99):.2f} ms")
    print(f"GET /spec, a new connection each (relay_sdk, ni): p50 {pct(fresh, 50):.2f} ms")
    print(f"GET /healthz (the server's floor: no database): p50 {pct(floor, 50):.2f} ms")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500, help="requests per figure")
    args = parser.parse_args()
    with service.prepared("relay_bench_steps", ACCESS_LOG="") as env:
        token, _ = a_running_step()
        with service.gunicorn(env) as (port, _):
            spec_latency(port, token, args.requests)


if __name__ == "__main__":
    main()
