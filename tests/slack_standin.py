"""A local stand-in for a Slack incoming webhook: records every POST and answers as Slack
does (200 `ok`; or, when told to, 404 `no_service`, 429 with Retry-After, 500)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SlackStandIn:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.answers: list[int] = []  # status codes to give next, then 200s
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                standin.received.append(
                    {"path": self.path, "type": self.headers["Content-Type"], "json": json.loads(body)}
                )
                status = standin.answers.pop(0) if standin.answers else 200
                text = {200: b"ok", 404: b"no_service", 429: b"rate_limited", 500: b"internal_error"}[status]
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/XXXX"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
