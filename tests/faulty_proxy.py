"""An HTTP proxy of the tests' own between the bridge and the service, which fails chosen
requests in chosen ways: a 5xx, a 200 with garbage, or a dropped connection before or
after the service has seen the request. It can also play a service that is not to be
trusted: `extra_runs` are added to every list of runs it passes on."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

FAULTS = ("500", "503", "garbage", "drop-before", "drop-after")


class FaultyProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        # (method, path, body, fault), each used once, first match first
        self.rules: list[tuple[str, re.Pattern[str], re.Pattern[str], str]] = []
        self.log: list[tuple[str, str, str]] = []  # (method, path, what happened)
        self.extra_runs: list[dict] = []  # listed with the service's own runs
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._fault_for(self.command, self.path, (body or b"").decode("utf-8", "replace"))
                proxy.log.append((self.command, self.path, fault or "passed"))
                if fault == "drop-before":
                    return self._drop()
                if fault in ("500", "503"):
                    return self._send(int(fault), b"<html>Bad gateway</html>", "text/html")
                if fault == "garbage":
                    return self._send(200, b"<html>Welcome to nginx!</html>", "text/html")
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                path = self.path
                extra = proxy.extra_runs and self.command == "GET" and re.search(r"/_puppet/runs(\?|$)", path)
                if extra:  # a service with runs pending answers a long-poll at once
                    path = re.sub(r"([?&])wait=\d+&?", r"\1", path)
                answer = requests.request(
                    self.command, proxy.upstream + path, data=body, headers=headers, timeout=90
                )
                if fault == "drop-after":  # the service acted; its answer is lost
                    return self._drop()
                content = answer.content
                if extra:
                    listing = answer.json()
                    content = json.dumps({**listing, "runs": proxy.extra_runs + listing["runs"]}).encode()
                self._send(answer.status_code, content, answer.headers.get("Content-Type", ""))

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _drop(self) -> None:
                self.close_connection = True
                self.connection.shutdown(2)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(self, method: str, path: str, *faults: str, body: str = "") -> None:
        """The next requests matching `method` and the `path` (and `body`) regexes fail with
        `faults`, in order."""
        assert all(f in FAULTS for f in faults)
        with self.lock:
            self.rules += [(method, re.compile(path), re.compile(body), fault) for fault in faults]

    def _fault_for(self, method: str, path: str, body: str) -> str | None:
        with self.lock:
            for index, (m, pattern, body_pattern, fault) in enumerate(self.rules):
                if m == method and pattern.search(path) and body_pattern.search(body):
                    del self.rules[index]
                    return fault
        return None

    def stop(self) -> None:
        self.server.shutdown()
