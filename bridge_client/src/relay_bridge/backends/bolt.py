"""The Bolt backend: one `bolt command run '<puppet> agent -t …' --targets a,b --format json`
per run, and `bolt task run NAME --targets a,b --params @file --format json` per task run
(on the scope's nodes; a query or node group needs PuppetDB, which only PE's orchestrator
asks here). Each target is judged by its own exit code (integration contract §5-6): Bolt calls
exit code 2 a failure, while for Puppet it means "changes applied". A target Bolt could not
reach is a failed node with Bolt's message.

As over SSH, the command prints the node's last run report after Puppet (reports.py), on
every transport with a POSIX shell: not WinRM, whose nodes run PowerShell."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from relay_bridge import reports, trust
from relay_bridge.backends import (
    GOOD_EXITS,
    NodeResult,
    RunError,
    check_certnames,
    meaning_of,
    nodes_of,
    outcome_of,
    process_alive,
    puppet_flags,
)
from relay_bridge.backends.options import Options
from relay_bridge.state import make_dir, private_file

OPTIONS = {
    "bolt_path": "bolt",
    # The module's `backend_bolt_command`: Bolt as a list of words, e.g. ["/opt/bolt/bin/bolt"].
    "command": None,
    # What the module's README option `bolt_command` renders to (its own agent ignores it).
    "bolt_command": None,
    "node_puppet_path": "puppet",
    "transport": None,  # ssh, winrm, …: Bolt's own default when unset
    "user": None,
    "ssh_user": None,  # the module's name for `user`
    "password_file": None,  # the password goes to Bolt in a 0600 inventory file, never on its command line
    "ssh_password": None,  # the module's: the password itself (to the inventory too, never to argv)
    "private_key": None,
    "host_key_check": None,  # true/false; Bolt's default (true) when unset
    "ssh_host_key_check": None,  # the module's name for `host_key_check`
    "run_as": None,
    "concurrency": None,
    "connect_timeout": None,
    "report_max_bytes": reports.DEFAULT_MAX_BYTES,  # the last run report read after Puppet; 0: none
    "modulepath": None,  # where Bolt finds tasks (its --modulepath); unset: its project's modules
}
TAIL_CHARS = 4000


class BoltBackend:
    name = "bolt"
    platform = "oss"

    def __init__(self, options: dict[str, Any]) -> None:
        o = Options("bolt", OPTIONS, options)
        o.exclusive("bolt_path", "command", "bolt_command")
        for ours, module in (
            ("user", "ssh_user"),
            ("password_file", "ssh_password"),
            ("host_key_check", "ssh_host_key_check"),
        ):
            o.exclusive(ours, module)
        self.bolt = o.argv("command") or o.argv("bolt_command") or [str(o.string("bolt_path"))]
        self.puppet = o.string("node_puppet_path")
        self.transport = o.string("transport")
        self.user = o.string("user") or o.string("ssh_user")
        self.password_file = o.string("password_file")
        self.password = o.string("ssh_password")
        self.private_key = o.string("private_key")
        self.host_key_check = o.boolean("host_key_check")
        if self.host_key_check is None:
            self.host_key_check = o.boolean("ssh_host_key_check")
        self.run_as = o.string("run_as")
        self.concurrency = o.integer("concurrency", 1)
        self.connect_timeout = o.integer("connect_timeout", 1)
        self.report_max_bytes = o.integer("report_max_bytes", 0) if self.transport != "winrm" else 0
        self.modulepath = o.string("modulepath")

    def command(self, run: dict[str, Any]) -> str:
        puppet = [str(self.puppet), "agent", "-t", *puppet_flags(run)]
        if not self.report_max_bytes:
            return shlex.join(puppet)
        # Bolt's run-as wraps the whole command in sudo: the report is read as Puppet ran.
        fetch = reports.fetch_script(str(self.puppet), self.report_max_bytes)
        return shlex.join(["sh", "-c", f"{shlex.join(puppet)} 2>&1; rc=$?; {fetch}; exit $rc"])

    def inventory(self) -> dict[str, Any]:
        """Bolt's transport configuration for every target (they join the `all` group)."""
        transport = self.transport or "ssh"
        settings: dict[str, Any] = {}
        if self.user:
            settings["user"] = self.user
        if self.password:
            settings["password"] = self.password
        if self.password_file:
            try:
                settings["password"] = Path(self.password_file).read_text().strip()
            except OSError as exc:
                raise RunError(f"backend_bolt_password_file cannot be read: {exc.strerror}") from None
        if self.private_key:
            settings["private-key"] = self.private_key
        if self.host_key_check is not None:
            settings["host-key-check"] = self.host_key_check
        if self.run_as:
            settings["run-as"] = self.run_as
        if self.connect_timeout:
            settings["connect-timeout"] = self.connect_timeout
        config: dict[str, Any] = {transport: settings} if settings else {}
        if self.transport:
            config["transport"] = self.transport
        return {"version": 2, "config": config} if config else {"version": 2}

    def argv(self, nodes: list[str], command: str, inventory: Path) -> list[str]:
        argv = [*self.bolt, "command", "run", command, "--targets", ",".join(nodes)]
        return argv + self.common(inventory)

    def common(self, inventory: Path) -> list[str]:
        argv = ["--format", "json", "--no-tty", "--no-save-rerun", "--inventoryfile", str(inventory)]
        if self.concurrency:
            argv += ["--concurrency", str(self.concurrency)]
        return argv

    def task_argv(self, run: dict[str, Any], nodes: list[str], workdir: Path) -> list[str]:
        """`bolt task run`; its parameters in a 0600 file (`--params @file`), never on the
        command line, where any local user could read them."""
        with private_file(workdir / "params.json") as sink:
            sink.write(json.dumps(run.get("params") or {}))
        argv = [*self.bolt, "task", "run", str(run["name"]), "--targets", ",".join(nodes)]
        argv += ["--params", f"@{workdir / 'params.json'}"]
        if run.get("noop"):
            argv.append("--noop")
        if self.modulepath:
            argv += ["--modulepath", str(self.modulepath)]
        return argv + self.common(workdir / "inventory.yaml")

    def start(self, run: dict[str, Any], workdir: Path) -> BoltJob:
        # Certnames only: never `@file`, `local://…`, a glob or an option, which --targets reads.
        # A task run's Bolt target objects are not used: their `uri` or `config` could point
        # Bolt anywhere (`local://` runs here, as root); Bolt's inventory is the bridge's.
        nodes = nodes_of(run, "bolt", kinds=("run", "task-run"))
        if run.get("type") == "task-run":
            if not trust.task_name_ok(run.get("name")):
                raise RunError(
                    f"The task run's name is not a valid task name: {trust.shown(run.get('name'))}."
                )
            if not isinstance(run.get("params") or {}, dict):
                raise RunError("The task run's params are not a JSON object.")
            make_dir(workdir)
            argv = self.task_argv(run, nodes, workdir)
            with private_file(workdir / "inventory.yaml") as sink:
                sink.write(json.dumps(self.inventory()))
            return BoltJob(argv, nodes, workdir, task=True)
        command = self.command(run)
        make_dir(workdir)
        inventory = workdir / "inventory.yaml"
        with private_file(inventory) as sink:
            sink.write(json.dumps(self.inventory()))  # JSON is YAML
        job_id = str(run["id"]) if self.report_max_bytes and "--job-id" in puppet_flags(run) else ""
        reading = reports.job_reading(job_id, self.report_max_bytes)
        return BoltJob(self.argv(nodes, command, inventory), nodes, workdir, reading=reading)

    def attach(self, handle: dict[str, Any], workdir: Path) -> BoltJob:
        """The Bolt of a run this bridge held before it restarted: watched if it still runs,
        its results read if it ended meanwhile."""
        if handle.get("kind") != "bolt" or not isinstance(handle.get("nodes"), list):
            raise RunError("The bridge's record of this run's Bolt work is unreadable.")
        check_certnames(handle["nodes"])
        if not process_alive(handle.get("pid"), b"bolt") and _items(workdir / "bolt.json") is None:
            raise RunError("Bolt ended while the bridge was down and left no results.")
        if handle.get("task"):
            return BoltJob(None, handle["nodes"], workdir, pid=handle.get("pid"), task=True)
        reading = reports.job_reading(*reports.reading_of(handle))
        return BoltJob(None, handle["nodes"], workdir, pid=handle.get("pid"), reading=reading)


class BoltJob:
    job_id = ""

    def __init__(
        self,
        argv: list[str] | None,
        nodes: list[str],
        workdir: Path,
        pid: int | None = None,
        reading: dict[str, Any] | None = None,
        task: bool = False,
    ) -> None:
        """Start Bolt with `argv`, or (after a bridge restart) watch the Bolt running as `pid`.
        `reading`: the job id of this run's reports and how much of one the command prints
        (reports.job_reading; none: reports are not read). `task`: a task run's Bolt."""
        self.nodes = nodes
        self.task = task
        self.reading = reading or reports.job_reading("", 0)
        self.output = workdir / "bolt.json"
        self.errors = workdir / "bolt.err"
        self.started = time.monotonic()
        self.stopped = False
        self.proc: subprocess.Popen[bytes] | None = None
        if argv is not None:
            try:
                with private_file(self.output, "wb") as out, private_file(self.errors, "wb") as err:
                    self.proc = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
                    )
            except OSError as exc:
                raise RunError(f"Bolt could not be started ({argv[0]}): {exc.strerror}") from None
            pid = self.proc.pid
        self.pid = pid
        self._done = threading.Event()
        threading.Thread(target=self._reap, daemon=True).start()

    def handle(self) -> dict[str, Any]:
        if self.task:
            return {"kind": "bolt", "pid": self.pid, "nodes": self.nodes, "task": True}
        return {"kind": "bolt", "pid": self.pid, "nodes": self.nodes, **self.reading}

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
        else:
            while process_alive(self.pid, b"bolt"):
                time.sleep(0.2)
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def stop(self) -> None:
        self.stopped = True
        if self.pid and not self._done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)  # Bolt closes its connections; Puppet sees them go

    def result(self) -> tuple[str, Any]:
        items = _items(self.output)
        if items is None:
            error = self.errors.read_text(errors="replace")[-TAIL_CHARS:] if self.errors.exists() else ""
            code = self.proc.returncode if self.proc is not None else "while the bridge was down"
            why = "it was stopped" if self.stopped else f"it exited {code}"
            said = _bolt_error(self.output)  # with --format json, Bolt's own error is on stdout
            msg = f"Bolt gave no results ({why}): {said or error.strip() or 'no output'}"
            return "error", {"result": {"msg": msg}}
        by_target = {item.get("target"): item for item in items if isinstance(item, dict)}
        if self.task:
            task_nodes = [_task_node(name, by_target.get(name)) for name in self.nodes]
            ok = task_nodes and all(node["state"] == "finished" for node in task_nodes)
            return ("finished" if ok else "failed"), {"nodes": task_nodes}
        duration = time.monotonic() - self.started
        job_id, max_bytes = reports.reading_of(self.reading)
        nodes = [_node(name, by_target.get(name), duration, job_id, max_bytes) for name in self.nodes]
        return outcome_of(nodes), {"nodes": [n.as_json() for n in nodes]}


def _bolt_error(output: Path) -> str:
    """Bolt's error document (`{"kind", "msg", "details"}`) as a line, or ""."""
    try:
        document = json.loads(output.read_text(errors="replace")[:100_000])
    except (OSError, ValueError):
        return ""
    if not isinstance(document, dict) or not isinstance(document.get("msg"), str):
        return ""
    kind = document.get("kind")
    return (
        f"{kind}: {document['msg']}"[:TAIL_CHARS] if isinstance(kind, str) else document["msg"][:TAIL_CHARS]
    )


def _items(output: Path) -> list[Any] | None:
    try:
        document = json.loads(output.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    items = document.get("items") if isinstance(document, dict) else None
    return items if isinstance(items, list) else None


def _node(
    name: str, item: dict[str, Any] | None, duration: float, job_id: str = "", report_max_bytes: int = 0
) -> NodeResult:
    if item is None:
        return NodeResult(name, "failed", meaning="Bolt reported nothing for this target", duration=duration)
    value = item.get("value") if isinstance(item.get("value"), dict) else {}
    printed = str(value.get("merged_output") or value.get("stdout") or "")
    report = None
    if report_max_bytes:
        # The report went to stdout after all of Puppet's output (its stderr included).
        before, report = reports.split_output(str(value.get("stdout") or "").encode())
        printed = before.decode("utf-8", "replace") + str(value.get("stderr") or "")
    output = printed[-TAIL_CHARS:]
    code = value.get("exit_code")
    if isinstance(code, int):
        # Bolt's own `status` says failure for 2; Puppet's code says what happened.
        state = "finished" if code in GOOD_EXITS else "failed"
        changes = reports.node_changes(report, job_id, report_max_bytes) if report_max_bytes else {}
        return NodeResult(name, state, code, meaning_of(code), duration, output, changes=changes)
    error = value.get("_error") if isinstance(value.get("_error"), dict) else {}
    message = str(error.get("msg") or "Bolt could not run the command on this target")
    details = {"kind": error["kind"]} if error.get("kind") else {}
    return NodeResult(name, "failed", None, message, duration, output, details)


def _task_node(name: str, item: dict[str, Any] | None) -> dict[str, Any]:
    """A target's task result, as the orchestrator's node items have it: `state`, and the
    task's own `result` (its JSON output, or Bolt's `_output`, `_error`)."""
    if item is None:
        return {
            "name": name,
            "state": "failed",
            "result": {"_error": {"msg": "Bolt reported nothing for this target"}},
        }
    value = item.get("value") if isinstance(item.get("value"), dict) else {}
    state = "finished" if item.get("status") == "success" else "failed"
    return {"name": name, "state": state, "result": value}
