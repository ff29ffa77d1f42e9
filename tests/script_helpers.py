"""Script steps on real workers: an engine worker (queue `celery`) and a worker of the `steps`
queue that runs real bubblewrap sandboxes, against the live server's step runtime API."""

import contextlib
import os
import signal
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis
from django.conf import settings

from tests.events_helpers import clear_queues
from tests.standins.orchestrator import make_tls
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


@contextmanager
def running_script_workers(
    django_db_blocker, bao, live_server_url: str, tmp: Path, **env: str
) -> Iterator[tuple[EngineWorker, EngineWorker]]:
    """A module's script_workers, on a broker emptied of earlier modules' messages; stopped when
    the module is done."""
    clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))
    with django_db_blocker.unblock():
        engine_worker, steps_worker = script_workers(tmp, bao, live_server_url, **env)
    yield engine_worker, steps_worker
    steps_worker.stop()
    engine_worker.stop()


STANDIN_HOST = "127.0.0.2"  # loopback, but not a name clients send direct (NO_PROXY)


class StandIn:
    """HTTP servers on STANDIN_HOST, one plain and one TLS (a certificate for its address
    from a CA of its own), that answer every GET with what they received."""

    def __init__(self, directory: Path) -> None:
        self.received: list[dict] = []
        self.ca, cert, key = make_tls(directory, names=f"IP:{STANDIN_HOST}")
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                standin.received.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
                )
                body = f"stand-in saw {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.plain = ThreadingHTTPServer((STANDIN_HOST, 0), Handler)
        self.tls = ThreadingHTTPServer((STANDIN_HOST, 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.tls.socket = context.wrap_socket(self.tls.socket, server_side=True)
        for server in (self.plain, self.tls):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.port = self.plain.server_address[1]
        self.tls_port = self.tls.server_address[1]

    def stop(self) -> None:
        for server in (self.plain, self.tls):
            server.shutdown()
            server.server_close()


def kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process under it (its prefork children): a machine's crash,
    as far as the worker goes."""
    for child in children_of(pid):
        kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def freeze(pid: int) -> list[int]:
    """SIGSTOP a process and every process under it, parents first (none can start another
    meanwhile); returns them all."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    tree = [pid]
    for parent in tree:  # grows as it goes: breadth first
        for child in children_of(parent):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)  # before its own children are looked for
            tree.append(child)
    return tree


def crash(pid: int) -> None:
    """A process and every process under it stopped at once, as a machine's crash stops them:
    each is frozen before any is killed, so none sees another die and cleans up after it, as
    kill_tree's children-first order lets a parent do."""
    for each in freeze(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


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
    """Processes running as any of this test session's sandbox uids (a root worker's)."""
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
