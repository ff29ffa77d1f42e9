"""What a rollout costs the service, in process on PostgreSQL (no HTTP, no bridge): the work
of its own that it adds to each batch.

    .venv/bin/python bench/rollouts.py [--nodes 10000] [--batch 10%] [--runs 1000]

(a) making a rollout of N nodes through the runs API's validation (RunCreateSerializer and
    Run.create_for: the rollout's run, the rollout, the first batch's run);
(b) moving it on after each batch (runs.rollouts.advance: the batch's node outcomes read from
    its results, the end recorded, the next batch's run made), each batch's run completed with
    a node item per node; the last one builds the report of every node;
(c) what every other run's end pays for rollouts: the lookup of its batch (runs.apps), per run.

It makes its own database (relay_bench_rollouts) and prints its figures."""

import argparse
import json
import statistics
import time

import service  # bench/service.py


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--batch", default="10%")
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    batch: int | str = args.batch if args.batch.endswith("%") else int(args.batch)

    with service.prepared("relay_bench_rollouts", CELERY_BROKER_URL="memory://"):
        from django.contrib.auth.models import User

        from puppet_connection.models import PuppetConnection
        from runs import rollouts
        from runs.api.serializers import RunCreateSerializer
        from runs.models import Rollout, Run, RunType

        owner = User.objects.create_user("bench")
        connection, _ = PuppetConnection.create_with_token(owner=owner, name="fleet")
        nodes = [f"node-{i:05}.example.com" for i in range(args.nodes)]
        body = {"scope": {"nodes": nodes}, "rollout": {"canary": 1, "batch": batch, "max_failures": "5%"}}

        started = time.perf_counter()
        request = RunCreateSerializer(data=body, context={"connection": connection})
        request.is_valid(raise_exception=True)
        run = Run.create_for(connection, request.validated_data)
        made = time.perf_counter() - started
        rollout = Rollout.objects.get(pk=run.pk)
        print(
            f"(a) a rollout of {args.nodes} nodes in {rollout.batch_count} batches:"
            f" made in {made * 1000:.0f} ms"
        )

        steps = []
        while True:
            batch_run = Run.objects.get(rollout_batch__rollout=rollout, status="pending")
            items = [{"name": n, "state": "finished", "exit_code": 0} for n in batch_run.scope["nodes"]]
            Run.objects.filter(pk=batch_run.pk).update(
                status="complete", outcome="finished", run_results={"nodes": items}
            )
            started = time.perf_counter()
            state = rollouts.advance(rollout.pk)
            steps.append(time.perf_counter() - started)
            if state == "complete":
                break
        run.refresh_from_db()
        size = run.results_size or len(json.dumps(run.run_results))
        print(
            f"(b) advance after each batch: median {statistics.median(steps) * 1000:.1f} ms,"
            f" max {max(steps) * 1000:.1f} ms (the last, with the report of {args.nodes} nodes:"
            f" {steps[-1] * 1000:.1f} ms; the report {size} bytes)"
        )

        others = [
            Run.objects.create(
                connection=connection, type=RunType.RUN, scope={"nodes": ["x"]}, status="complete"
            )
            for _ in range(args.runs)
        ]
        started = time.perf_counter()
        for other in others:
            rollouts.batch_ended(other)
        each = (time.perf_counter() - started) / len(others)
        print(f"(c) an ordinary run's end, the rollout lookup: {each * 1e6:.0f} µs per run")


if __name__ == "__main__":
    main()
