"""What the bridge tests share: a connection on a live server, a bridge.yaml for the SSH
backend against the tests' sshd, the `relay-bridge` command, and waiting for a run."""

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from relay_bridge.api import RelayClient

from runs.models import Run
from tests.sshd import Sshd

RELAY_BRIDGE = str(Path(sys.executable).parent / "relay-bridge")


@dataclass
class Service:
    url: str
    token: str
    client: RelayClient  # plays the workflow step: creates and cancels runs


def bridge_config(
    directory: Path,
    service: Service,
    sshd: Sshd,
    nodes: dict[str, dict[str, str]],
    heartbeat: float = 0.5,
    **options: Any,
) -> Path:
    """A bridge.yaml with the module's keys: the SSH backend, its nodes aliases of `sshd`."""
    directory.mkdir(parents=True, exist_ok=True)
    ssh_config = sshd.write_config(nodes, options.pop("unreachable", ()))
    options.setdefault("node_puppet_path", str(sshd.fake_puppet()))
    config: dict[str, Any] = {
        "relay_api_url": service.url,
        "relay_connection_token": service.token,
        "backend": "ssh",
        "state_dir": str(directory / "state"),
        "heartbeat_interval": heartbeat,
    }
    config.update({f"backend_ssh_{key}": value for key, value in sshd.options(ssh_config, **options).items()})
    path = directory / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def config_file(
    directory: Path, service: Service, backend: str, options: dict[str, Any], heartbeat: float = 0.5
) -> Path:
    """A bridge.yaml for any backend."""
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "relay_api_url": service.url,
        "relay_connection_token": service.token,
        "backend": backend,
        "state_dir": str(directory / "state"),
        "heartbeat_interval": heartbeat,
        **{f"backend_{backend}_{key}": value for key, value in options.items()},
    }
    path = directory / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def relay_bridge(config: Path, *args: str, log: Path, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [RELAY_BRIDGE, "--config", str(config), *args],
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        **popen,
    )


def wait_for(what: Callable[[], Any], timeout: float = 30, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting: {message or what}")


def completed(run_id: str, timeout: float = 30) -> Run:
    return wait_for(
        lambda: Run.objects.filter(pk=run_id, status="complete").first(), timeout, f"run {run_id} to complete"
    )


def log_lines(log: Path, run_id: str | None = None) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if run_id is None or f"run={run_id}" in line]


def serve(config: Path, log: Path, *args: str) -> subprocess.Popen:
    """`relay-bridge serve`, once it says it serves (short long-polls: tests stop it often)."""
    server = relay_bridge(config, "serve", "--wait", "2", *args, log=log)
    wait_for(lambda: "msg=serving" in "".join(log_lines(log)), 20, "the bridge to serve")
    return server


def in_progress(run_id: str) -> Run:
    return wait_for(lambda: Run.objects.filter(pk=run_id, status="in-progress").first(), 30, "in progress")
