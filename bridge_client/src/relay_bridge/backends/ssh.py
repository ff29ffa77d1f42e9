"""The SSH backend the RFC designed: `puppet agent -t` on each node over the OpenSSH client,
`parallelism` nodes at a time.

Each node's command first prints its shell's pid and then execs Puppet, so a cancel can
stop Puppet on the node itself (`kill -TERM <pid>` over a second connection), not only
the local ssh client. Output goes to a file per node under the run's work directory.

After Puppet, over the same connection, the node prints its last run report (reports.py):
each node's result then says what Puppet changed, or in noop would change."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from relay_bridge import reports
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
    "openssh_client_path": "ssh",
    "command": None,  # the module's `ssh_command`: ssh as a list of words, e.g. ["ssh", "-F", "cfg"]
    "user": None,
    "identity_file": None,
    "port": None,
    "parallelism": 5,
    "node_puppet_path": "puppet",
    "connect_timeout": 10,
    "known_hosts_file": None,
    "strict_host_key_checking": None,  # None: whatever the ssh configuration says
    "ssh_config_file": None,
    "ssh_options": [],  # more `-o Key=value` options, e.g. ["KexAlgorithms=curve25519-sha256"]
    "sudo": False,  # run Puppet through `sudo -n` when `user` is not root
    "report_max_bytes": reports.DEFAULT_MAX_BYTES,  # the last run report read after Puppet; 0: none
}
PID_MARK = "relay-bridge: pid "
TAIL_CHARS, TAIL_LINES = 4000, 40
UNREACHABLE = 255  # what the OpenSSH client exits with when it could not connect or log in
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class SshBackend:
    name = "ssh"
    platform = "oss"

    def __init__(self, options: dict[str, Any]) -> None:
        o = Options("ssh", OPTIONS, options)
        o.exclusive("openssh_client_path", "command")
        self.ssh_command = o.argv("command") or [str(o.string("openssh_client_path"))]
        self.client = self.ssh_command[0]
        self.user = o.string("user")
        self.identity_file = o.string("identity_file")
        self.port = o.integer("port", 1)
        self.parallelism = o.integer("parallelism", 1) or 5
        self.puppet = o.string("node_puppet_path")
        self.connect_timeout = o.integer("connect_timeout", 1) or 10
        self.known_hosts_file = o.string("known_hosts_file")
        self.strict = o.string("strict_host_key_checking")
        self.config_file = o.string("ssh_config_file")
        self.extra = o.key_values("ssh_options")
        self.sudo = o.boolean("sudo")
        self.report_max_bytes = o.integer("report_max_bytes", 0)

    def ssh_argv(self, node: str, command: str) -> list[str]:
        argv = [
            *self.ssh_command,
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
        ]
        if self.config_file:
            argv += ["-F", self.config_file]
        if self.user:
            argv += ["-l", self.user]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.known_hosts_file:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts_file}"]
        if self.strict:
            argv += ["-o", f"StrictHostKeyChecking={self.strict}"]
        for extra in self.extra:
            argv += ["-o", extra]
        return [*argv, "--", node, command]

    def puppet_command(self, run: dict[str, Any]) -> str:
        """What the node's shell runs: its pid (for a cancel), then Puppet in its place; with
        reports read, that as a shell of its own, then the report. The whole is one `sh -c`,
        whatever the login shell of the node's user is."""
        sudo = ["sudo", "-n"] if self.sudo else []
        puppet = [*sudo, str(self.puppet), "agent", "-t", *puppet_flags(run)]
        if not self.report_max_bytes:
            return f'echo "{PID_MARK}$$"; exec {shlex.join(puppet)}'
        # Puppet's stderr into its stdout, so that all it prints comes before the report.
        agent = f'echo "{PID_MARK}$$"; exec {shlex.join(puppet)} 2>&1'
        fetch = reports.fetch_script(str(self.puppet), self.report_max_bytes, sudo)
        return shlex.join(["sh", "-c", f"sh -c {shlex.quote(agent)}; rc=$?; {fetch}; exit $rc"])

    def start(self, run: dict[str, Any], workdir: Path) -> SshJob:
        nodes = nodes_of(run, "ssh")  # certnames only: never an option ssh would read
        command = self.puppet_command(run)
        make_dir(workdir)
        job_id = str(run["id"]) if self.report_max_bytes and "--job-id" in puppet_flags(run) else ""
        return SshJob(
            self, nodes, command, workdir, reading=reports.job_reading(job_id, self.report_max_bytes)
        )

    def attach(self, handle: dict[str, Any], workdir: Path) -> SshJob:
        """The nodes of a run this bridge held before it restarted: finished ones from their
        exit code files, running ones watched until their ssh ends, the rest started now."""
        if handle.get("kind") != "ssh" or not isinstance(handle.get("nodes"), list):
            raise RunError("The bridge's record of this run's SSH work is unreadable.")
        check_certnames(handle["nodes"])
        job_id, max_bytes = reports.reading_of(handle)
        reading = reports.job_reading(job_id, max_bytes)
        return SshJob(self, handle["nodes"], str(handle["command"]), workdir, resume=True, reading=reading)


# Each node's ssh runs under a small shell that records its pid and, when ssh ends, ssh's
# exit code, in files: a bridge that restarts finds both, even for nodes that ended while
# it was down. $0 is the node's file prefix.
NODE_SCRIPT = (
    'umask 077; echo $$ > "$0.pid.tmp" && mv "$0.pid.tmp" "$0.pid"; "$@"; '
    'echo $? > "$0.rc.tmp" && mv "$0.rc.tmp" "$0.rc"'
)


class SshJob:
    job_id = ""  # plain SSH has no job handle for the service to show

    def __init__(
        self,
        backend: SshBackend,
        nodes: list[str],
        command: str,
        workdir: Path,
        resume: bool = False,
        reading: dict[str, Any] | None = None,
    ) -> None:
        """`reading`: the job id of this run's reports and how much of one the command prints
        (reports.job_reading; none: reports are not read)."""
        self.backend, self.command, self.workdir = backend, command, workdir
        self.reading = reading or reports.job_reading("", 0)
        self.nodes = nodes
        self.results: dict[str, NodeResult] = {}
        self._running: dict[str, int] = {}  # node -> pid of its shell (its process group)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stopping = False
        self._todo: list[tuple[int, str, bool]] = []  # (number, node, watch an ssh already running)
        for number, node in enumerate(nodes):
            prefix = self._prefix(number)
            if resume and Path(f"{prefix}.rc").exists():
                self.results[node] = self._judge(number, node, 0.0)
            elif resume and process_alive(_read_pid(prefix), str(prefix).encode()):
                self._todo.insert(0, (number, node, True))  # they hold lanes first
            elif resume and Path(f"{prefix}.pid").exists():
                lost = "its ssh ended while the bridge was down, leaving no exit code"
                output, _ = _read_output(Path(f"{prefix}.log"), 0)
                self.results[node] = NodeResult(node, "failed", meaning=lost, output=output)
            else:
                self._todo.append((number, node, False))
        self._workers = min(backend.parallelism, len(self._todo))
        if not self._workers:
            self._done.set()
        for lane in range(self._workers):
            threading.Thread(target=self._work, name=f"ssh-{lane}", daemon=True).start()

    def handle(self) -> dict[str, Any]:
        return {"kind": "ssh", "nodes": self.nodes, "command": self.command, **self.reading}

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            for _, node, _ in self._todo:
                self.results[node] = NodeResult(node, "skipped", meaning="not started: the run was stopped")
            self._todo.clear()
            running = list(self._running.items())
        for node, pid in running:
            remote = _remote_pid(Path(f"{self._prefix(self.nodes.index(node))}.log"))
            if remote:
                kill = f"kill -TERM {remote}" if not self.backend.sudo else f"sudo -n kill -TERM {remote}"
                try:
                    subprocess.run(
                        self.backend.ssh_argv(node, kill),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=self.backend.connect_timeout + 5,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    pass
            if pid > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)  # the node's shell and its ssh

    def result(self) -> tuple[str, Any]:
        nodes = [self.results[n] for n in self.nodes]
        return outcome_of(nodes), {"nodes": [n.as_json() for n in nodes]}

    def _prefix(self, number: int) -> Path:
        return self.workdir / f"{number:05d}"

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stopping or not self._todo:
                        return
                    number, node, running = self._todo.pop(0)
                if running:
                    self.results[node] = self._watch(number, node)
                else:
                    self.results[node] = self._run_node(number, node)
        finally:
            with self._lock:
                self._workers -= 1
                if not self._workers:
                    self._done.set()

    def _run_node(self, number: int, node: str) -> NodeResult:
        prefix = self._prefix(number)
        started = time.monotonic()
        try:
            with private_file(Path(f"{prefix}.log"), "wb") as sink:
                proc = subprocess.Popen(
                    ["sh", "-c", NODE_SCRIPT, str(prefix), *self.backend.ssh_argv(node, self.command)],
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    # Its own session: a signal for the bridge is not one for ssh, and the
                    # node's work outlives a bridge that is killed.
                    start_new_session=True,
                )
        except OSError as exc:
            return NodeResult(node, "failed", meaning=f"could not start the SSH client: {exc.strerror}")
        with self._lock:
            self._running[node] = proc.pid
            if self._stopping:  # stopped between taking the node and starting ssh
                os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        with self._lock:
            del self._running[node]
        return self._judge(number, node, time.monotonic() - started)

    def _watch(self, number: int, node: str) -> NodeResult:
        """A node whose ssh was started by the bridge before it restarted."""
        prefix = self._prefix(number)
        pid = _read_pid(prefix)
        started = time.monotonic()
        with self._lock:
            self._running[node] = pid or 0
        while process_alive(pid, str(prefix).encode()):
            time.sleep(0.2)
        with self._lock:
            del self._running[node]
        return self._judge(number, node, time.monotonic() - started)

    def _judge(self, number: int, node: str, duration: float) -> NodeResult:
        prefix = self._prefix(number)
        job_id, max_bytes = reports.reading_of(self.reading)
        tail, report = _read_output(Path(f"{prefix}.log"), max_bytes)
        try:
            code = int(Path(f"{prefix}.rc").read_text().strip())
        except (OSError, ValueError):
            code = None
        if code is None or (self._stopping and code not in GOOD_EXITS):
            return NodeResult(node, "failed", None, "stopped before Puppet finished", duration, tail)
        if code == UNREACHABLE:
            return NodeResult(node, "failed", code, "could not connect or log in over SSH", duration, tail)
        state = "finished" if code in GOOD_EXITS else "failed"
        changes = reports.node_changes(report, job_id, max_bytes) if max_bytes else {}
        return NodeResult(node, state, code, meaning_of(code), duration, tail, changes=changes)


def _read_pid(prefix: Path) -> int | None:
    try:
        return int(Path(f"{prefix}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _remote_pid(output: Path) -> int | None:
    try:
        with output.open("rb") as source:
            first = source.readline(200).decode("utf-8", "replace")
    except OSError:
        return None
    if first.startswith(PID_MARK) and first[len(PID_MARK) :].strip().isdigit():
        return int(first[len(PID_MARK) :])
    return None


def _read_output(output: Path, report_max_bytes: int) -> tuple[str, bytes | None]:
    """The tail of what the node printed, and the report it printed after it (None when it
    printed none). Only the end of the file is read: the report, in base64, and before it
    enough for the tail."""
    window = TAIL_CHARS * 2 + (report_max_bytes * 3 // 2 + 65536 if report_max_bytes else 0)
    try:
        with output.open("rb") as source:
            source.seek(0, 2)
            size = source.tell()
            source.seek(max(0, size - window))
            data = source.read()
    except OSError:
        return "", None
    printed, report = reports.split_output(data) if report_max_bytes else (data, None)
    text = printed[-TAIL_CHARS * 2 :].decode("utf-8", "replace")
    lines = [ANSI_RE.sub("", line) for line in text.splitlines() if not line.startswith(PID_MARK)]
    return "\n".join(lines[-TAIL_LINES:])[-TAIL_CHARS:], report
