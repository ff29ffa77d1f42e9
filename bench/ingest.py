"""Benchmark of report ingestion, on a report a real `puppet apply` makes.

    .venv/bin/python bench/ingest.py [--resources 3200] [--uploads 30] [--concurrent 20]
                                     [--sizes 0.5,5,20,60] [--memory-only] [--database NAME]

Prints: the report's size; reference parse speed (PyYAML CSafeLoader with tag stripping) and
rapidyaml's (parse, JSON emit, json.loads) in MB/s in the same run; 202 latency p50/p99 for
the report against gunicorn; the web workers' peak RSS while `--concurrent` such reports
arrive at once, beside the same for a report a tenth the size; reports per second through
one worker; and the worker's memory against body size: for reports of `--sizes` MB (made by
repeating resources), through the fast path and through the reference reader, the worker
process's peak RSS and its reader child's (triggers/reader.py), with the limits as configured
(EVENTS_READ_MEMORY_BYTES). It makes its own database (relay_bench_ingest), storage and
OpenBao dev server.
"""

import argparse
import gc
import hashlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import service  # bench/service.py

from tests.events_helpers import big_report, puppet_apply, stored_report


def make_report(resources: int, workdir: Path) -> bytes:
    """`puppet apply` of `resources` files in a profile class; its stored YAML report."""
    www = workdir / "www"
    body = "\n".join(f"  file {{ '{www}/{i}.html': content => \"page {i}\\n\" }}" for i in range(resources))
    manifest = (
        f"class profile::web {{\n{body}\n}}\nfile {{ '{www}': ensure => directory }}\ninclude profile::web\n"
    )
    puppet_apply(workdir, manifest, "--reports=store", f"--reportdir={workdir}/reports")
    return stored_report(workdir)


def best_of(runs: int, work) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def parse_speeds(report: bytes) -> None:
    from triggers import parsing

    size = len(report) / 1e6
    reference = best_of(3, lambda: parsing.plain(parsing.load_yaml(report), 10**9))
    print(
        f"reference reader (CSafeLoader, tags stripped, plain): {size / reference:.2f} MB/s "
        f"({reference:.2f} s)"
    )
    if parsing.load_yaml_fast(report) is None:
        print("fast path: declined this report (the reference reads it)")
        return
    fast = best_of(5, lambda: parsing.read_yaml(report, 10**9))
    print(
        f"fast path (rapidyaml with its YAML 1.1 guards): {size / fast:.1f} MB/s ({fast * 1000:.0f} ms), "
        f"{reference / fast:.1f}x the reference"
    )
    import json

    import ryml

    def bare() -> object:
        tree = ryml.parse_in_arena(report)
        root = tree.root_id()
        return json.loads(
            ryml.emit_json_malloc(tree, tree.first_child(root) if tree.is_stream(root) else root)
        )

    seconds = best_of(5, bare)
    print(f"  of which rapidyaml parse + JSON emit + json.loads alone: {size / seconds:.1f} MB/s")


def rss_kb(pid: int, field: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker_pids(master: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(master)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resources", type=int, default=3200)
    parser.add_argument("--uploads", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--sizes", default="0.5,5,20,60", help="report sizes in MB for the memory figures")
    parser.add_argument("--memory-only", action="store_true", help="only the memory figures (no Puppet)")
    parser.add_argument("--database", default="relay_bench_ingest", help="made, and dropped at the end")
    args = parser.parse_args()
    sizes = [float(size) for size in args.sizes.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    if args.memory_only:
        with service.prepared(args.database, EVENTS_STORAGE_LOCATION=str(workdir / "events")):
            worker_memory(sizes)
        shutil.rmtree(workdir, ignore_errors=True)
        return
    if shutil.which("puppet") is None:
        sys.exit("needs puppet (apt-get install puppet-agent)")
    started = time.perf_counter()
    report = make_report(args.resources, workdir)
    print(
        f"report: {len(report) / 1e6:.2f} MB from puppet apply of {args.resources} files "
        f"({time.perf_counter() - started:.0f} s to make)"
    )

    with (
        service.prepared(
            args.database,
            EVENTS_STORAGE_LOCATION=str(workdir / "events"),
            CELERY_BROKER_URL="redis://127.0.0.1:6379/14",  # its own db; nobody consumes it
            STATIC_ROOT=str(workdir / "static"),
        ) as env,
        service.gunicorn(env) as (port, master),
    ):
        run(args, report, port, master)
        worker_memory(sizes)
    shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, report: bytes, port: int, master: int) -> None:
    from django.contrib.auth.models import User

    from triggers import services
    from triggers.models import Event, Trigger

    parse_speeds(report)
    owner = User.objects.create_user("bench")
    _, token = Trigger.create_with_token(owner=owner, name="bench")
    url = f"http://127.0.0.1:{port}/api/events"
    headers = {"Content-Type": "application/x-yaml"}
    auth = ("puppet", str(token))
    session = requests.Session()
    latencies = []
    for i in range(args.uploads):
        body = report + f"# upload {i}\n".encode()  # distinct bodies: no dedupe shortcut
        t0 = time.perf_counter()
        answer = session.post(url, data=body, headers=headers, auth=auth, timeout=60)
        latencies.append(time.perf_counter() - t0)
        assert answer.status_code == 202, answer.text
    latencies.sort()
    print(
        f"202 latency for the {len(report) / 1e6:.1f} MB report over {args.uploads} uploads: "
        f"p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.0f} ms"
    )

    def burst(payload: bytes, label: str) -> None:
        before = {pid: rss_kb(pid, "VmRSS") for pid in worker_pids(master)}
        threads = [
            threading.Thread(
                target=lambda i=i: requests.post(
                    url,
                    data=payload + f"# {label} {i}\n".encode(),
                    headers=headers,
                    auth=auth,
                    timeout=120,
                )
            )
            for i in range(args.concurrent)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = {pid: rss_kb(pid) for pid in before}
        print(
            f"  {label}: {args.concurrent} x {len(payload) / 1e6:.2f} MB at once: web workers' RSS "
            f"before {max(before.values()) / 1024:.0f} MB, "
            f"peak {max(peak.values()) / 1024:.0f} MB (largest worker)"
        )

    print("web process memory while reports arrive at once:")
    burst(report[: len(report) // 10], "small")
    burst(report, "large")

    # One worker: read, summarise, offload and filter, one event after another.
    ids = list(Event.objects.filter(state="received").values_list("pk", flat=True)[:10])
    t0 = time.perf_counter()
    for event_id in ids:
        services.process(str(event_id))
    elapsed = time.perf_counter() - t0
    print(
        f"one worker: {len(ids) / elapsed:.2f} reports/s "
        f"({len(report) / 1e6 * len(ids) / elapsed:.2f} MB/s), "
        f"{elapsed / len(ids):.2f} s a report"
    )


class ReaderPeak(logging.Handler):
    """What triggers.services logs of each read: the reader child's peak RSS."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.peak = getattr(record, "reader_peak_rss", self.peak)


def worker_memory(sizes: list[float]) -> None:
    """This process plays the worker (services.process, as the Celery task calls it); its peak
    RSS is reset before each report (/proc/self/clear_refs), the child's comes from wait4."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.files.base import ContentFile
    from django.core.files.storage import storages

    from triggers import services
    from triggers.ingest import body_name
    from triggers.models import Event, Trigger
    from triggers.parsing import PSYCH_REPORT

    handler = ReaderPeak()
    logger = logging.getLogger("triggers.services")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    trigger = Trigger.create_with_token(owner=User.objects.create_user("memory"), name="memory")[0]
    per_resource = len(big_report(100)) / 100
    print(
        "worker memory against body size (EVENTS_READ_MEMORY_BYTES "
        f"{settings.EVENTS_READ_MEMORY_BYTES // 2**20} MB; the door takes at most "
        f"{settings.EVENTS_MAX_DECOMPRESSED_BYTES / 1e6:.1f} MB):"
    )
    for size in sizes:
        for reader in ("fast path", "reference"):
            body = big_report(int(size * 1e6 / per_resource), host=f"m{size}-{reader[0]}.example.com")
            if reader == "reference":
                body = body.removeprefix(PSYCH_REPORT)  # no Puppet header: the reference reader's
            sha256 = hashlib.sha256(body).hexdigest()
            storages["events"].save(body_name(sha256), ContentFile(body))
            event = Event.objects.create(
                trigger=trigger, body_format="yaml", body_sha256=sha256, body_size=len(body)
            )
            megabytes = len(body) / 1e6
            del body
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            before = rss_kb(os.getpid(), "VmRSS")
            handler.peak = 0
            started = time.perf_counter()
            services.process(str(event.pk))
            seconds = time.perf_counter() - started
            worker_peak = rss_kb(os.getpid())
            event.refresh_from_db()
            outcome = event.state if event.state != "failed" else f"failed: {event.failure_reason}"
            print(
                f"  {megabytes:5.1f} MB, {reader:9}: worker {before / 1024:.0f} MB before, peak "
                f"{worker_peak / 1024:.0f} MB; reader child peak {handler.peak / 2**20:.0f} MB "
                f"({(handler.peak / 1024 - before) / 1024:+.0f} MB over the worker); "
                f"{seconds:.1f} s; {outcome}"
            )


if __name__ == "__main__":
    main()
