"""The SSH backend the RFC designed: `puppet agent -t` on each node over the OpenSSH client,
`parallelism` nodes at a time.

Each node's command first prints its shell's pid and then execs Puppet, so a cancel can
stop Puppet on the node itself (`kill -TERM <pid>` over a second connection), not only
the local ssh client. Output goes to a file per node under the run's work directory."""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from relay_bridge.backends import (
    GOOD_EXITS,
    NodeResult,
    RunError,
    meaning_of,
    nodes_of,
    outcome_of,
    puppet_flags,
)
from relay_bridge.config import ConfigError

OPTIONS = {
    "openssh_client_path": "ssh",
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
}
PID_MARK = "relay-bridge: pid "
TAIL_CHARS, TAIL_LINES = 4000, 40
UNREACHABLE = 255  # what the OpenSSH client exits with when it could not connect or log in
# A host name, certname or address, never anything ssh could read as an option.
NODE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@\[\]-]*$")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _option(options: dict[str, Any], name: str, kind: type, minimum: int | None = None) -> Any:
    value = options.get(name, OPTIONS[name])
    if value is None:
        return None
    key = f"backend_ssh_{name}"
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        if not isinstance(value, bool):
            raise ConfigError(key, "must be true or false")
        return value
    if kind is int:
        try:
            value = int(value)
        except (TypeError, ValueError):
            raise ConfigError(key, "must be a whole number") from None
        if minimum is not None and value < minimum:
            raise ConfigError(key, f"must be {minimum} or more")
        return value
    if kind is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
            raise ConfigError(key, "must be a list of Key=value ssh options")
        return [v.strip() for v in value]
    if not isinstance(value, (str, int)) or not str(value):
        raise ConfigError(key, "must be a string")
    return str(value)


class SshBackend:
    name = "ssh"
    platform = "oss"

    def __init__(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"backend_ssh_{unknown[0]}", f"is not an option of the ssh backend ({', '.join(OPTIONS)})"
            )
        self.client = _option(options, "openssh_client_path", str)
        self.user = _option(options, "user", str)
        self.identity_file = _option(options, "identity_file", str)
        self.port = _option(options, "port", int, 1)
        self.parallelism = _option(options, "parallelism", int, 1)
        self.puppet = _option(options, "node_puppet_path", str)
        self.connect_timeout = _option(options, "connect_timeout", int, 1)
        self.known_hosts_file = _option(options, "known_hosts_file", str)
        self.strict = _option(options, "strict_host_key_checking", str)
        self.config_file = _option(options, "ssh_config_file", str)
        self.extra = _option(options, "ssh_options", list)
        self.sudo = _option(options, "sudo", bool)

    def ssh_argv(self, node: str, command: str) -> list[str]:
        argv = [self.client, "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
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
        puppet = [*(["sudo", "-n"] if self.sudo else []), self.puppet, "agent", "-t", *puppet_flags(run)]
        return f'echo "{PID_MARK}$$"; exec {shlex.join(puppet)}'

    def start(self, run: dict[str, Any], workdir: Path) -> SshJob:
        nodes = nodes_of(run, "ssh")
        if self.parallelism < 1:
            raise RunError("parallelism must be 1 or more")
        workdir.mkdir(parents=True, exist_ok=True)
        return SshJob(self, nodes, self.puppet_command(run), workdir)


class SshJob:
    job_id = ""  # plain SSH has no job handle for the service to show

    def __init__(self, backend: SshBackend, nodes: list[str], command: str, workdir: Path) -> None:
        self.backend, self.command, self.workdir = backend, command, workdir
        self.nodes = nodes
        self.results: dict[str, NodeResult] = {}
        self._todo = list(enumerate(nodes))
        self._running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stopping = False
        self._workers = min(backend.parallelism, len(nodes))
        for number in range(self._workers):
            threading.Thread(target=self._work, name=f"ssh-{number}", daemon=True).start()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            for _, node in self._todo:
                self.results[node] = NodeResult(node, "skipped", meaning="not started: the run was stopped")
            self._todo.clear()
            running = list(self._running.items())
        for node, (proc, output) in running:
            pid = _remote_pid(output)
            if pid:
                kill = f"kill -TERM {pid}" if not self.backend.sudo else f"sudo -n kill -TERM {pid}"
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
            proc.terminate()

    def result(self) -> tuple[str, Any]:
        nodes = [self.results[n] for n in self.nodes]
        return outcome_of(nodes), {"nodes": [n.as_json() for n in nodes]}

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stopping or not self._todo:
                        return
                    number, node = self._todo.pop(0)
                self.results[node] = self._run_node(number, node)
        finally:
            with self._lock:
                self._workers -= 1
                if not self._workers:
                    self._done.set()

    def _run_node(self, number: int, node: str) -> NodeResult:
        if not NODE_RE.match(node):
            return NodeResult(node, "failed", meaning="not a valid host name")
        output = self.workdir / f"{number:05d}.log"
        started = time.monotonic()
        try:
            with output.open("wb") as sink:
                proc = subprocess.Popen(
                    self.backend.ssh_argv(node, self.command),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C or SIGTERM for the bridge is not one for ssh
                )
        except OSError as exc:
            return NodeResult(node, "failed", meaning=f"could not start the SSH client: {exc.strerror}")
        with self._lock:
            self._running[node] = (proc, output)
            if self._stopping:  # stopped between taking the node and starting ssh
                proc.terminate()
        code = proc.wait()
        with self._lock:
            del self._running[node]
        duration = time.monotonic() - started
        tail = _tail(output)
        if code < 0 or (self._stopping and code not in GOOD_EXITS):
            return NodeResult(node, "failed", None, "stopped before Puppet finished", duration, tail)
        if code == UNREACHABLE:
            return NodeResult(node, "failed", code, "could not connect or log in over SSH", duration, tail)
        state = "finished" if code in GOOD_EXITS else "failed"
        return NodeResult(node, state, code, meaning_of(code), duration, tail)


def _remote_pid(output: Path) -> int | None:
    try:
        with output.open("rb") as source:
            first = source.readline(200).decode("utf-8", "replace")
    except OSError:
        return None
    if first.startswith(PID_MARK) and first[len(PID_MARK) :].strip().isdigit():
        return int(first[len(PID_MARK) :])
    return None


def _tail(output: Path) -> str:
    try:
        with output.open("rb") as source:
            source.seek(0, 2)
            size = source.tell()
            source.seek(max(0, size - TAIL_CHARS * 2))
            text = source.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ANSI_RE.sub("", line) for line in text.splitlines() if not line.startswith(PID_MARK)]
    return "\n".join(lines[-TAIL_LINES:])[-TAIL_CHARS:]
