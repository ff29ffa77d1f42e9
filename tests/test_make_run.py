"""`make run`'s supervisor (relay.embedded), started for real: OpenBao with persistent
storage, migrations, gunicorn and Celery, stopped by SIGINT as Ctrl-C would, started again."""

import json
import os
import queue
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import hvac
import pytest
import redis
import requests

from tests.bao import free_port
from tests.settings import outside_env

ROOT = Path(__file__).resolve().parent.parent


class Service:
    def __init__(self, var: Path, **env: str) -> None:
        self.port = int(env["PORT"])
        self.env = outside_env(RELAY_VAR_DIR=str(var), **env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relay.embedded"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if text in self.lines.get(timeout=1):
                    return
            except queue.Empty:
                if self.process.poll() is not None:
                    break
        raise AssertionError(f"never printed {text!r}:\n{''.join(self.output)}")

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "relay.embedded", "manage", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)


PRINT_DB_AND_SECRET = (
    "from django.conf import settings; from relay import vault;"
    "print(settings.DATABASES['default']['NAME']);"
    "print(vault.read(vault.path_for('connections/puppet', '%s'))['token'])"
)


def test_manage_py_without_var_or_settings_says_how_to_run_it(tmp_path):
    typed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=outside_env(RELAY_VAR_DIR=str(tmp_path / "var")),
        capture_output=True,
        text=True,
    )
    assert typed.returncode == 1
    assert typed.stderr.strip().splitlines() == [
        'manage.py: no settings here: run `make run` once (it generates var/), use `make manage ARGS="…"`,'
        " or set SECRET_KEY and TOKEN_PEPPERS (docs/configuration.md)."
    ]


def free_port_pair() -> int:
    """A port whose next one is free too (OpenBao's raft cluster port is VAULT_PORT + 1)."""
    while True:
        port = free_port()
        if port < 65535 and not listening(port + 1):
            return port


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.django_db(False)
def test_make_run_starts_everything_keeps_secrets_across_restarts_and_stops_cleanly(tmp_path):
    var = tmp_path / "var"
    ports = {"PORT": str(free_port()), "VAULT_PORT": str(free_port_pair())}
    service = Service(var, **ports)
    try:
        service.wait_for_line("Relay is up")
        service.wait_for_line("Ctrl-C stops everything")  # the lines after it, read as well
        text = "".join(service.output)
        assert "single-machine use only" in text
        assert f"http://127.0.0.1:{ports['PORT']}/admin/" in text and "createsuperuser" in text

        for name in (
            "openbao/init.json",
            "openbao/app-token",
            "secret_key",
            "token_peppers",
            "deployment_id",
        ):
            assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name
        assert (var / "relay.sqlite3").exists()  # SQLite under var/ by default
        # Its broker keys are under a deployment id of its own, kept in var/: two checkouts
        # sharing a Redis do not take each other's tasks.
        deployment = (var / "deployment_id").read_text().strip()
        broker = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        deadline = time.monotonic() + 60
        while not broker.keys(f"{deployment}:_kombu.binding.celery") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert broker.keys(f"{deployment}:_kombu.binding.celery"), "".join(service.output)

        service.manage(
            "shell", "-c", "from django.contrib.auth.models import User; User.objects.create_user('ops')"
        )
        key = service.manage("create_user_token", "ops").strip().splitlines()[-1]
        assert key.startswith("rlyu_")
        created = requests.post(
            service.url("/api/connections/puppet/"),
            json={"name": "prod"},
            headers={"Authorization": f"Token {key}"},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        token = created.json()["token"]
        runs = requests.get(
            service.url("/_puppet/runs"), headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert runs.json() == {"runs": []}
        # The links it shows are where it listens (RELAY_PUBLIC_URL follows PORT).
        source = (
            "apiVersion: v1\nsteps:\n- {name: s, image: relaysh/core, input: [echo hi]}\n"
            "triggers:\n- {name: hook, source: {type: webhook, image: relaysh/stdlib-trigger-json}}\n"
        )
        workflow = requests.post(
            service.url("/api/workflows/"),
            json={"name": "hooked", "source": source},
            headers={"Authorization": f"Token {key}"},
            timeout=10,
        )
        assert workflow.status_code == 201, workflow.text
        [hook] = workflow.json()["triggers"]
        assert hook["url"].startswith(service.url("/api/webhooks/")), hook
        assert requests.get(service.url("/admin/login/"), timeout=10).status_code == 200

        # `python manage.py` typed in the checkout finds make run's var/: its database and
        # its OpenBao (the connection's secret), with no environment of its own.
        typed = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", PRINT_DB_AND_SECRET % created.json()["id"]],
            cwd=ROOT,
            env=outside_env(RELAY_VAR_DIR=str(var), VAULT_PORT=ports["VAULT_PORT"]),
            capture_output=True,
            text=True,
        )
        assert typed.returncode == 0, typed.stderr
        assert typed.stdout.split()[-2:] == [str(var / "relay.sqlite3"), token]
        assert requests.get(service.url("/static/admin/css/base.css"), timeout=10).status_code == 200
    finally:
        code = service.interrupt()
    assert code == 0, "".join(service.output)
    assert not listening(int(ports["PORT"])) and not listening(int(ports["VAULT_PORT"]))

    # Again, now without Redis: the worker falls back to a filesystem queue.
    service = Service(var, REDIS_URL="redis://127.0.0.1:1/0", **ports)
    try:
        service.wait_for_line("Relay is up")
        assert "filesystem queue" in "".join(service.output)
        runs = requests.get(
            service.url("/_puppet/runs"), headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert runs.status_code == 200
        # Reports are taken (the rate limits count in the process), and deleted with their files.
        user = {"Authorization": f"Token {key}"}
        trigger = requests.post(service.url("/api/triggers/"), json={"name": "t"}, headers=user, timeout=10)
        sent = requests.post(
            service.url("/api/events"),
            data=b"host: node1.example.com\nstatus: changed\n",
            headers={
                "Authorization": f"Bearer {trigger.json()['token']}",
                "Content-Type": "application/x-yaml",
            },
            timeout=10,
        )
        assert sent.status_code == 202, sent.text
        assert any(path.is_file() for path in (var / "events/bodies").rglob("*"))
        event = f"/api/triggers/{trigger.json()['id']}/events/{sent.json()['id']}/"
        assert requests.delete(service.url(event), headers=user, timeout=10).status_code == 204
        deadline = time.monotonic() + 30  # parts the worker may have been writing meanwhile go too
        while any(path.is_file() for path in (var / "events").rglob("*")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(path.is_file() for path in (var / "events").rglob("*"))
        # The secret survived the restart in OpenBao's persistent storage.
        root = hvac.Client(
            f"http://127.0.0.1:{ports['VAULT_PORT']}",
            token=json.loads((var / "openbao/init.json").read_text())["root_token"],
        )
        secret = root.secrets.kv.v2.read_secret_version(
            f"relay/connections/puppet/{created.json()['id']}",
            mount_point="secret",
            raise_on_deleted_version=True,
        )
        assert secret["data"]["data"] == {"token": token}
        assert (var / "deployment_id").read_text().strip() == deployment  # the same across restarts
    finally:
        assert service.interrupt() == 0


@pytest.mark.parametrize(
    ("env", "public", "runtime"),
    [
        ({}, "http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ({"PORT": "8123"}, "http://127.0.0.1:8123", "http://127.0.0.1:8123"),
        (
            {"PORT": "8123", "RELAY_PUBLIC_URL": "https://relay.example.com/"},
            "https://relay.example.com",
            None,
        ),
    ],
)
def test_relay_public_url_defaults_to_where_the_service_listens(env, public, runtime):
    """`make run` on another PORT: its webhook URLs, a puppet connection's relayAPIURL and the
    address steps reach the service at are that port's, not whatever listens on 8000."""
    base = {k: v for k, v in os.environ.items() if k not in ("PORT", "RELAY_PUBLIC_URL", "STEP_RUNTIME_URL")}
    printed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings;"
            "print(settings.RELAY_PUBLIC_URL, settings.STEP_RUNTIME_URL)",
        ],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert printed[0] == public
    if runtime is not None:
        assert printed[1] == runtime
