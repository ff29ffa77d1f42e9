"""The bridge's counters, and an optional Prometheus text endpoint on localhost
(`relay-bridge serve --metrics-port N`): runs held now, runs completed by outcome, and
calls to the service that failed. In `poll --once` each run's daemon is a process of its
own, so there only the logs and `relay-bridge status` tell."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_lock = threading.Lock()
_held = 0
_completed: Counter[str] = Counter()
_api_errors: Counter[str] = Counter()


def held(delta: int) -> None:
    global _held
    with _lock:
        _held += delta


def completed(outcome: str) -> None:
    with _lock:
        _completed[outcome] += 1


def api_error(kind: str) -> None:
    with _lock:
        _api_errors[kind] += 1


def render() -> str:
    with _lock:
        lines = [
            "# HELP relay_bridge_runs_held Runs this bridge holds now.",
            "# TYPE relay_bridge_runs_held gauge",
            f"relay_bridge_runs_held {_held}",
            "# HELP relay_bridge_runs_completed_total Runs this bridge completed, by outcome.",
            "# TYPE relay_bridge_runs_completed_total counter",
            *(
                f'relay_bridge_runs_completed_total{{outcome="{o}"}} {n}'
                for o, n in sorted(_completed.items())
            ),
            "# HELP relay_bridge_api_errors_total Calls to the Relay service that failed, by kind.",
            "# TYPE relay_bridge_api_errors_total counter",
            *(f'relay_bridge_api_errors_total{{kind="{k}"}} {n}' for k, n in sorted(_api_errors.items())),
        ]
    return "\n".join(lines) + "\n"


def serve(port: int) -> ThreadingHTTPServer:
    """GET /metrics on 127.0.0.1:`port` (loopback only: it is for the local scraper)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            data = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
