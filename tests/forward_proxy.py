"""A forward HTTP proxy of the tests' own, as an office's outbound proxy is: it takes
absolute-form requests (`GET http://host/path HTTP/1.1`), answers 407 without the right
Basic credentials, and records what it carried."""

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

HOP_BY_HOP = ("host", "content-length", "connection", "proxy-connection", "proxy-authorization", "keep-alive")


class ForwardProxy:
    def __init__(self, user: str, password: str) -> None:
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.carried: list[tuple[str, str]] = []  # (method, absolute URL)
        self.refused = 0
        self.upstream = requests.Session()
        self.upstream.trust_env = False  # straight to the service: this is the proxy
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.headers.get("Proxy-Authorization") != proxy.expected:
                    proxy.refused += 1
                    return self._send(407, b"", {"Proxy-Authenticate": 'Basic realm="office"'})
                if not self.path.startswith("http://"):
                    return self._send(400, b"this is a proxy: give an absolute URL", {})
                proxy.carried.append((self.command, self.path))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                answer = proxy.upstream.request(
                    self.command, self.path, data=body, headers=headers, timeout=90
                )
                self._send(
                    answer.status_code,
                    answer.content,
                    {"Content-Type": answer.headers.get("Content-Type", "")},
                )

            def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.upstream.close()
