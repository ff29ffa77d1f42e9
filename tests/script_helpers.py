"""Script steps on real workers: an engine worker (queue `celery`) and a worker of the `steps`
queue that runs real bubblewrap sandboxes, against the live server's step runtime API."""

import os
import signal
from pathlib import Path

from django.conf import settings

from tests.workflow_helpers import EngineWorker

# Small limits, so that the tests that meet them end quickly.
LIMITS = {
    "STEP_WALL_TIME": "8",
    "STEP_CPU_SECONDS": "3",
    "STEP_MEMORY_BYTES": str(96 * 1024 * 1024),
    "STEP_MAX_PROCESSES": "48",
    "STEP_OUTPUT_BYTES": str(64 * 1024),
    "STEP_HEARTBEAT": "0.5",
}


def script_workers(tmp: Path, bao, live_server_url: str, **env: str) -> tuple[EngineWorker, EngineWorker]:
    common = {
        "VAULT_ADDR": bao.addr,
        "VAULT_TOKEN": bao.root().token,
        "STEP_RUNTIME_URL": live_server_url,
        **LIMITS,
        **env,
    }
    engine = EngineWorker(tmp / "engine.log", concurrency=2, **common)
    steps = EngineWorker(tmp / "steps.log", concurrency=4, queues="steps", **common)
    return engine, steps


def kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process under it (its prefork children): a machine's crash,
    as far as the worker goes."""
    for child in children_of(pid):
        kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def sandbox_processes() -> list[int]:
    """Processes running as any of the sandboxes' uids (a root worker's)."""
    uids = range(settings.STEP_SANDBOX_UID, settings.STEP_SANDBOX_UID + settings.STEP_SANDBOX_UIDS)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found
