"""A real OpenBao server in dev mode (in-memory, unsealed, KV v2 at secret/), for tests."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import hvac

BAO = str(Path(sys.executable).parent / "bao")
ROOT_TOKEN = "test-root-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class BaoDevServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.addr = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> "BaoDevServer":
        self.process = subprocess.Popen(
            [
                BAO,
                "server",
                "-dev",
                f"-dev-root-token-id={ROOT_TOKEN}",
                f"-dev-listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.root().sys.is_initialized() and not self.root().sys.is_sealed():
                    return self
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("bao server -dev did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def root(self) -> hvac.Client:
        return hvac.Client(url=self.addr, token=ROOT_TOKEN, timeout=5)

    def read(self, path: str) -> dict | None:
        try:
            return self.root().secrets.kv.v2.read_secret_version(
                path=path, mount_point="secret", raise_on_deleted_version=True
            )["data"]["data"]
        except hvac.exceptions.InvalidPath:
            return None

    def token_with_policy(self, name: str, rules: str, **kwargs: object) -> str:
        self.root().sys.create_or_update_policy(name, rules)
        return self.root().auth.token.create(policies=[name], **kwargs)["auth"]["client_token"]
