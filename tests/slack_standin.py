"""A local stand-in for Slack: an incoming webhook, and the Web API's chat.postMessage.
It records every POST and answers as Slack does.

- A webhook (any other path): 200 `ok`; or, when told to, 404 `no_service`, 429 with
  Retry-After, 500, or any status with any body, e.g. a redirect.
- `POST /api/chat.postMessage`, following Slack's documented contract: the token as
  `Authorization: Bearer`, a JSON body with `channel` and `text` or `blocks` (and optional
  `username`). It answers 200 `{"ok": true, "channel", "ts", "message"}`, or 200
  `{"ok": false, "error": …}`: `not_authed` (no token), `invalid_auth` (a token not in
  `tokens`), `invalid_arguments` (not JSON), `channel_not_found` (not in `channels`, by id,
  name or `#name`), `no_text` (neither text nor blocks); when told to, 429 `ratelimited`
  with Retry-After, 500, or anything else.

It speaks HTTPS, as the service requires of webhooks, with a certificate for `localhost`
from a CA of its own (`ca`), on 127.0.0.1: the tests let the service reach it with the
test-only settings SLACK_WEBHOOK_ALLOW_LOOPBACK and SLACK_CA_BUNDLE (see `allow`)."""

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.standins.orchestrator import make_tls

API_PATH = "/api/chat.postMessage"
SLACK_BODIES = {200: b"ok", 404: b"no_service", 429: b"rate_limited", 500: b"internal_error"}


class SlackStandIn:
    def __init__(self, directory: Path) -> None:
        self.received: list[dict] = []
        # What to answer next, then 200s: a status (with Slack's body), or (status, body, headers).
        self.answers: list[int | tuple[int, bytes, dict[str, str]]] = []
        self.tokens: set[str] = set()  # the bot tokens chat.postMessage takes
        self.channels = {"C0123456789": "general"}  # id -> name
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                kind = self.headers["Content-Type"] or ""
                try:
                    document = json.loads(body)
                except ValueError:
                    document = None
                record = {
                    "path": self.path,
                    "host": self.headers["Host"],
                    "type": kind,
                    "authorization": self.headers["Authorization"],
                    "json": document,
                }
                standin.received.append(record)
                answer = standin.answers.pop(0) if standin.answers else 200
                if isinstance(answer, tuple):
                    status, text, headers = answer
                elif self.path == API_PATH:
                    status, text, headers = standin.api_answer(answer, self.headers, kind, document)
                    record["answer"] = json.loads(text)
                else:
                    status, text, headers = answer, SLACK_BODIES[answer], {}
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                for name, value in {"Content-Type": "text/html", **headers}.items():
                    self.send_header(name, value)
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

    def api_answer(
        self, status: int, headers: object, kind: str, document: object
    ) -> tuple[int, bytes, dict[str, str]]:
        """What chat.postMessage answers (see the module's docstring)."""
        if status != 200:
            error = {429: "ratelimited", 500: "internal_error"}[status]
            body = {"ok": False, "error": error}
            return status, json.dumps(body).encode(), {"Content-Type": "application/json"}
        auth = headers["Authorization"] or ""  # type: ignore[index]
        names = {}  # how a channel may be named -> its id
        for id, name in self.channels.items():
            names.update({id: id, name: id, f"#{name}": id})
        if not auth.startswith("Bearer ") or not auth[7:]:
            reply = {"ok": False, "error": "not_authed"}
        elif auth[7:] not in self.tokens:
            reply = {"ok": False, "error": "invalid_auth"}
        elif not kind.startswith("application/json") or not isinstance(document, dict):
            reply = {"ok": False, "error": "invalid_arguments"}
        elif document.get("channel") not in names:
            reply = {"ok": False, "error": "channel_not_found"}
        elif not document.get("text") and not document.get("blocks"):
            reply = {"ok": False, "error": "no_text"}
        else:
            ts = f"{time.time():.6f}"
            message = {"type": "message", "ts": ts, "bot_id": "B0123456789", "text": document.get("text", "")}
            reply = {"ok": True, "channel": names[document["channel"]], "ts": ts, "message": message}
        return 200, json.dumps(reply).encode(), {"Content-Type": "application/json; charset=utf-8"}

    def posted(self) -> list[dict]:
        """The messages chat.postMessage took (answered ok), as sent."""
        return [r["json"] for r in self.received if r.get("answer", {}).get("ok")]

    def allow(self, settings: object) -> None:
        """Let the service post here: `localhost` as a webhook host, loopback reachable, and
        this stand-in's CA (pytest-django's `settings` fixture undoes all three)."""
        settings.SLACK_WEBHOOK_HOSTS = [*settings.SLACK_WEBHOOK_HOSTS, "localhost"]
        settings.SLACK_WEBHOOK_ALLOW_LOOPBACK = True
        settings.SLACK_CA_BUNDLE = str(self.ca)

    def allow_api(self, settings: object, token: str) -> None:
        """Let the service call this stand-in's chat.postMessage as Slack's Web API, with
        `token` a bot token it knows (the settings fixture undoes it)."""
        self.tokens.add(token)
        settings.SLACK_API_URL = f"https://localhost:{self.port}/api"
        settings.SLACK_API_ALLOW_LOOPBACK = True
        settings.SLACK_CA_BUNDLE = str(self.ca)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
