"""A real OpenSSH server on a loopback port, with a host key and a client key of its own,
for the bridge's SSH backend. Nodes are ssh config aliases to it; each alias can pass
`FAKE_PUPPET_*` variables (SetEnv/AcceptEnv) to tell the stand-in `puppet` how to behave."""

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.bao import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"

# A `puppet` for the nodes when the test is about the bridge, not Puppet: it records its
# arguments and pid, prints the file FAKE_PUPPET_PRINT names, sleeps FAKE_PUPPET_SLEEP
# seconds and exits FAKE_PUPPET_EXIT. Asked for its `lastrunreport`, it names
# FAKE_PUPPET_REPORT (nothing when unset), without counting that as a run, after
# FAKE_PUPPET_CONFIG_SLEEP seconds (what a real `puppet config print` costs: Ruby's start).
FAKE_PUPPET = """#!/bin/sh
if [ "$1" = config ]; then sleep "${FAKE_PUPPET_CONFIG_SLEEP:-0}"; echo "${FAKE_PUPPET_REPORT:-}"; exit 0; fi
log="${FAKE_PUPPET_LOG:-/dev/null}"
echo "start $(date +%s.%N) $$ ${FAKE_PUPPET_NODE:-} $*" >> "$log"
echo "Notice: fake puppet on ${FAKE_PUPPET_NODE:-node} with $*"
[ -n "${FAKE_PUPPET_PRINT:-}" ] && cat "$FAKE_PUPPET_PRINT"
sleep "${FAKE_PUPPET_SLEEP:-0}"
echo "end $(date +%s.%N) $$ ${FAKE_PUPPET_NODE:-}" >> "$log"
exit "${FAKE_PUPPET_EXIT:-0}"
"""


def write_fake_puppet(directory: Path) -> Path:
    path = directory / "fake-puppet"
    path.write_text(FAKE_PUPPET)
    path.chmod(0o755)
    return path


class Sshd:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.user = getpass.getuser()
        self.process: subprocess.Popen | None = None
        self.aliases: list[str] = []

    def start(self) -> "Sshd":
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / name)], check=True
            )
        shutil.copy(self.dir / "client_key.pub", self.dir / "authorized_keys")
        host_key = (self.dir / "host_key.pub").read_text().split()[:2]
        (self.dir / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {' '.join(host_key)}\n")
        (self.dir / "sshd_config").write_text(
            f"""ListenAddress 127.0.0.1:{self.port}
HostKey {self.dir}/host_key
AuthorizedKeysFile {self.dir}/authorized_keys
PidFile {self.dir}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# The test directory lives under /tmp (world-writable): its keys would fail the checks.
StrictModes no
UseDNS no
AcceptEnv FAKE_PUPPET_*
# Many nodes at once connect here at once.
MaxStartups 200
MaxSessions 200
LogLevel ERROR
"""
        )
        if not Path("/run/sshd").exists() and os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True)  # sshd's privilege separation directory
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "sshd.log").open("wb"),
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()}") from None
                time.sleep(0.05)
        raise RuntimeError("sshd did not start")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)

    def fake_puppet(self) -> Path:
        return write_fake_puppet(self.dir)

    def write_config(self, nodes: dict[str, dict[str, str]], unreachable: tuple[str, ...] = ()) -> Path:
        """An ssh config in which each node is an alias of this sshd, passing its env;
        `unreachable` aliases point at a port nobody listens on."""
        blocks = []
        for name, env in nodes.items():
            port = free_port() if name in unreachable else self.port
            values = " ".join(f"{key}={value}" for key, value in {"FAKE_PUPPET_NODE": name, **env}.items())
            blocks.append(
                f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias [127.0.0.1]:{self.port}\n"
                f"  SetEnv {values}\n"
            )
        path = self.dir / f"ssh_config_{len(list(self.dir.glob('ssh_config_*')))}"
        path.write_text("\n".join(blocks))
        return path

    def options(self, ssh_config: Path | None = None, **more: object) -> dict[str, object]:
        """The bridge's `backend_ssh_*` options for this server."""
        options: dict[str, object] = {
            "user": self.user,
            "identity_file": str(self.dir / "client_key"),
            "known_hosts_file": str(self.dir / "known_hosts"),
            "strict_host_key_checking": "yes",
        }
        if ssh_config:
            options["ssh_config_file"] = str(ssh_config)
        else:
            options["port"] = self.port
        options.update(more)
        return options


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
