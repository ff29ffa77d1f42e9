"""A stand-in for the PE orchestrator API v1 (PE cannot be installed here), following the
integration contract §4: HTTPS with a CA of its own, `X-Authentication`, the command
endpoints with their validation, job states through `stopped`, `finished` and `failed`,
paged node lists, and PE's error bodies `{"kind", "msg", "details"}`.

Tests steer it: `script` is the states the next job goes through, one per GET of it;
`node_states` says how nodes end; `fail_next` makes the next requests answer 5xx;
`on_final(job)` is called as a Puppet job ends (where PE's agents would have sent their
reports, each with its node's `transaction_uuids[node]`, to PuppetDB)."""

import json
import re
import ssl
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.bao import free_port

SCOPES = ("nodes", "query", "node_group", "application")
TASK_KEYS = {
    "environment",
    "scope",
    "task",
    "params",
    "noop",
    "targets",
    "description",
    "timeout",
    "userdata",
}


def make_tls(directory: Path, names: str = "DNS:localhost,IP:127.0.0.1") -> tuple[Path, Path, Path]:
    """A CA (as the Puppet CA would be) and a server certificate for `names` (localhost)
    signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *new_key,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-subj",
        "/CN=Puppet CA: standin",
        "-days",
        "2",
    )
    openssl("req", *new_key, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    ext = directory / "san.ext"
    ext.write_text(f"subjectAltName={names}\n")
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return ca, cert, key


@dataclass
class Job:
    name: str
    command: str
    body: dict[str, Any]
    nodes: list[str]
    script: list[str]
    node_states: dict[str, str]
    state: str = "new"
    stop_requested: bool = False
    plan_result: Any = None
    transaction_uuids: dict[str, str] = field(default_factory=dict)

    def advance(self) -> bool:
        """The next state; True when it is the one the job ends in."""
        if self.stop_requested and self.state not in ("stopped", "finished", "failed", "success", "failure"):
            self.state = "stopped" if self.state == "stopping" else "stopping"
            return self.state == "stopped"
        if self.script:
            self.state = self.script.pop(0)
            return self.state in ("stopped", "finished", "failed")
        return False


class Orchestrator:
    def __init__(self, directory: Path, token: str = "0VZZ4Bd8ue-rbac-token") -> None:
        self.token = token
        self.ca, cert, key = make_tls(directory)
        self.port = free_port()
        self.url = f"https://localhost:{self.port}/orchestrator/v1"
        self.environments = {"production", "staging"}
        self.queries: dict[str, list[str]] = {}
        self.node_groups: dict[str, list[str]] = {}
        self.script = ["running", "finished"]
        self.node_states: dict[str, str] = {}
        self.plan_result: Any = {"status": "done"}
        self.fail_next: list[int] = []
        self.seen: list[dict[str, Any]] = []
        self.on_final: Callable[[Job], None] | None = None
        self.jobs: dict[str, Job] = {}
        self._next_job = 81
        self._lock = threading.Lock()
        orchestrator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with orchestrator._lock:
                    status, document = orchestrator._answer(self.command, self.path, dict(self.headers), raw)
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()

    # The API, as contract §4 describes it.

    def _error(self, status: int, kind: str, msg: str, details: Any = None) -> tuple[int, dict[str, Any]]:
        return status, {"kind": f"puppetlabs.orchestrator/{kind}", "msg": msg, "details": details}

    def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        body = json.loads(raw) if raw else None
        self.seen.append({"method": method, "path": path, "headers": headers, "body": body})
        if self.fail_next:
            status = self.fail_next.pop(0)
            return status, {"kind": "puppetlabs.orchestrator/service-unavailable", "msg": "Try again later"}
        if headers.get("X-Authentication") != self.token:
            return 401, {
                "kind": "puppetlabs.rbac/user-unauthenticated",
                "msg": "The provided token is invalid or has expired.",
                "details": None,
            }
        route = path.split("?")[0].removeprefix("/orchestrator/v1")
        query = dict(p.split("=", 1) for p in path.split("?", 1)[1].split("&")) if "?" in path else {}
        if method == "POST" and route == "/command/deploy":
            return self._deploy(body)
        if method == "POST" and route == "/command/task":
            return self._task(body)
        if method == "POST" and route == "/command/plan_run":
            return self._plan(body)
        if method == "POST" and route in ("/command/stop", "/command/stop_plan"):
            name = str((body or {}).get("job") or (body or {}).get("plan_job") or "")
            job = self.jobs.get(name)
            if not job:
                return self._error(404, "unknown-job", f"No job exists with id {name}")
            job.stop_requested = True
            return 202, {
                "job": {"id": f"{self.url}/jobs/{name}", "name": name},
                "nodes": {"stopped": len(job.nodes)},
            }
        match = re.fullmatch(r"/(jobs|plan_jobs)/([^/]+)(/nodes)?", route)
        if method == "GET" and match:
            job = self.jobs.get(match.group(2))
            if not job or (match.group(1) == "plan_jobs") != (job.command == "plan_run"):
                return self._error(404, "unknown-job", f"No job exists with id {match.group(2)}")
            if match.group(3):
                return self._nodes(job, int(query.get("limit", "50")), int(query.get("offset", "0")))
            if job.advance() and job.command == "deploy" and self.on_final:
                self.on_final(job)
            if job.command == "plan_run":
                return 200, {
                    "id": f"{self.url}/plan_jobs/{job.name}",
                    "name": job.name,
                    "state": job.state,
                    "result": job.plan_result if job.state in ("success", "failure") else None,
                }
            return 200, {
                "id": f"{self.url}/jobs/{job.name}",
                "name": job.name,
                "state": job.state,
                "command": job.command,
                "description": job.body.get("description", ""),
                "environment": {"name": job.body.get("environment")},
                "node_count": len(job.nodes),
                "nodes": {"id": f"{self.url}/jobs/{job.name}/nodes"},
            }
        return self._error(404, "not-found", f"No route for {method} {route}")

    def _new_job(self, command: str, body: dict[str, Any], nodes: list[str]) -> Job:
        name = str(self._next_job)
        self._next_job += 1
        script = list(self.script)
        if command == "plan_run":  # a plan job ends in PE's plan-job states
            script = [{"finished": "success", "failed": "failure"}.get(state, state) for state in script]
        job = Job(name, command, body, nodes, script, dict(self.node_states))
        job.transaction_uuids = {node: str(uuid.uuid4()) for node in nodes}
        self.jobs[name] = job
        return job

    def _check_environment(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        if not isinstance(body.get("environment"), str):
            return self._error(400, "validation-error", "The environment is required.")
        if body["environment"] not in self.environments:
            return self._error(
                404,
                "unknown-environment",
                f"Unknown environment {body['environment']}",
                {"environment": body["environment"]},
            )
        return None

    def _scope_nodes(self, scope: Any) -> list[str] | tuple[int, dict[str, Any]]:
        if (
            not isinstance(scope, dict)
            or len([k for k in SCOPES if k in scope]) != 1
            or set(scope) - set(SCOPES)
        ):
            return self._error(
                400,
                "validation-error",
                "The scope must have exactly one of nodes, query, node_group, application.",
            )
        if "nodes" in scope:
            return list(scope["nodes"])
        if "query" in scope:
            if scope["query"] not in self.queries:
                return self._error(400, "query-error", f"Error parsing query {scope['query']}")
            return self.queries[scope["query"]]
        if "node_group" in scope:
            if scope["node_group"] not in self.node_groups:
                return self._error(404, "unknown-node-group", f"Unknown node group {scope['node_group']}")
            return self.node_groups[scope["node_group"]]
        return self._error(400, "validation-error", "Applications are not supported by this orchestrator.")

    def _deploy(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return self._error(400, "validation-error", "The body must be a JSON object.")
        error = self._check_environment(body)
        if error:
            return error
        if body.get("noop") and body.get("no_noop"):
            return self._error(400, "validation-error", "noop and no_noop cannot both be true.")
        nodes = self._scope_nodes(body.get("scope"))
        if isinstance(nodes, tuple):
            return nodes
        if not nodes:
            return self._error(400, "empty-target", "The scope names no nodes.")
        job = self._new_job("deploy", body, nodes)
        return 202, {"job": {"id": f"{self.url}/jobs/{job.name}", "name": job.name}}

    def _task(self, body: Any) -> tuple[int, Any]:
        """POST /command/task as PE's orchestrator API v1 documents it: `environment`, `scope`
        (exactly one of nodes, query, node_group: no application), `task` and `params` (an
        object, maybe empty) required; `noop` (boolean), `targets` (Bolt-server connection
        objects), `description`, `timeout`, `userdata` optional; nothing else."""
        if not isinstance(body, dict):
            return self._error(400, "validation-error", "The body must be a JSON object.")
        unknown = sorted(set(body) - TASK_KEYS)
        if unknown:
            return self._error(
                400, "validation-error", f"Unknown keys: {', '.join(unknown)}", {"keys": unknown}
            )
        if not isinstance(body.get("task"), str) or not body["task"]:
            return self._error(400, "validation-error", "The task is required.")
        if not isinstance(body.get("params"), dict):
            return self._error(400, "validation-error", "The params are required: a JSON object.")
        if "noop" in body and not isinstance(body["noop"], bool):
            return self._error(400, "validation-error", "noop must be a boolean.")
        targets = body.get("targets", [])
        if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
            return self._error(400, "validation-error", "targets must be an array of objects.")
        error = self._check_environment(body)
        if error:
            return error
        if isinstance(body.get("scope"), dict) and "application" in body["scope"]:
            return self._error(400, "validation-error", "A task's scope is nodes, query or node_group.")
        nodes = self._scope_nodes(body.get("scope"))
        if isinstance(nodes, tuple):
            return nodes
        if not nodes:
            return self._error(400, "empty-target", "The scope names no nodes.")
        job = self._new_job("task", body, nodes)
        return 202, {"job": {"id": f"{self.url}/jobs/{job.name}", "name": job.name}}

    def _plan(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not body.get("plan_name"):
            return self._error(400, "validation-error", "The plan_name is required.")
        job = self._new_job("plan_run", body, [])
        job.plan_result = self.plan_result
        return 202, {"name": job.name}

    def _nodes(self, job: Job, limit: int, offset: int) -> tuple[int, Any]:
        final = job.state in ("finished", "failed", "stopped")
        items = []
        for name in job.nodes[offset : offset + limit]:
            state = (
                job.node_states.get(name, "failed" if job.state == "failed" else "finished")
                if final
                else "running"
            )
            if job.state == "stopped":
                state = "stopped"
            uid = job.transaction_uuids.setdefault(name, str(uuid.uuid4()))
            word = "Success" if state == "finished" else "Failed"
            items.append(
                {
                    "name": name,
                    "state": state,
                    "start_timestamp": "2026-11-21T10:00:00Z",
                    "finish_timestamp": "2026-11-21T10:00:12Z" if final else None,
                    "duration": 12.0 if final else None,
                    "transaction_uuid": uid,
                    "details": {"message": f"Finished puppet run on {name} - {word}!"},
                    "result": {
                        "corrective_changes": 0,
                        "intentional_changes": 1,
                        "failures": int(word != "Success"),
                    },
                }
            )
        return 200, {
            "next-events": {"id": f"{self.url}/jobs/{job.name}/events?start=0", "event": "0"},
            "items": items,
            "pagination": {"limit": limit, "offset": offset, "total": len(job.nodes)},
        }
