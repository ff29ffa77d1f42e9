"""A local stand-in for a Slack incoming webhook: records every POST and answers as Slack
does (200 `ok`; or, when told to, 404 `no_service`, 429 with Retry-After, 500, or any
status with any body, e.g. a redirect).

It speaks HTTPS, as the service requires of webhooks, with a certificate for `localhost`
from a CA of its own (`ca`), on 127.0.0.1: the tests let the service reach it with the
test-only settings SLACK_WEBHOOK_ALLOW_LOOPBACK and SLACK_CA_BUNDLE (see `allow`)."""

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.standins.orchestrator import make_tls

SLACK_BODIES = {200: b"ok", 404: b"no_service", 429: b"rate_limited", 500: b"internal_error"}


class SlackStandIn:
    def __init__(self, directory: Path) -> None:
        self.received: list[dict] = []
        # What to answer next, then 200s: a status (with Slack's body), or (status, body, headers).
        self.answers: list[int | tuple[int, bytes, dict[str, str]]] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                standin.received.append(
                    {
                        "path": self.path,
                        "host": self.headers["Host"],
                        "type": self.headers["Content-Type"],
                        "json": json.loads(body),
                    }
                )
                answer = standin.answers.pop(0) if standin.answers else 200
                status, text, headers = (
                    answer if isinstance(answer, tuple) else (answer, SLACK_BODIES[answer], {})
                )
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        self.ca, cert, key = make_tls(directory)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_port
        self.url = f"https://localhost:{self.port}/services/T000/B000/XXXX"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def allow(self, settings: object) -> None:
        """Let the service post here: `localhost` as a webhook host, loopback reachable, and
        this stand-in's CA (pytest-django's `settings` fixture undoes all three)."""
        settings.SLACK_WEBHOOK_HOSTS = [*settings.SLACK_WEBHOOK_HOSTS, "localhost"]
        settings.SLACK_WEBHOOK_ALLOW_LOOPBACK = True
        settings.SLACK_CA_BUNDLE = str(self.ca)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
