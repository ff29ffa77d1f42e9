"""What the benchmarks share: a database of their own, an OpenBao dev server, Django set up in
this process (to make data with the ORM), and gunicorn with the production configuration."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.bao import BaoDevServer, free_port  # noqa: E402

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
# BENCH_PG_SOCKET=1: the service reaches PostgreSQL through its Unix socket, as a service on
# the database's own box can (see docs/performance.md); else by TCP on 127.0.0.1.
SOCKET = bool(os.environ.get("BENCH_PG_SOCKET"))


def _recreate(database: str, drop_only: bool = False) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        if not drop_only:
            admin.execute(f"CREATE DATABASE {database}")


@contextmanager
def prepared(database: str, **extra_env: str) -> Iterator[dict[str, str]]:
    """A migrated database and a Vault, Django set up here; yields the service's environment."""
    _recreate(database)
    bao = BaoDevServer().start()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "relay.settings",
        "DATABASE_URL": f"postgres://postgres@/{database}?host=/var/run/postgresql"
        if SOCKET
        else f"postgres://postgres@127.0.0.1:5432/{database}",
        "SECRET_KEY": "bench-only-secret-key-0123456789abcdefghijklmnopqrstuvwxyz",
        "TOKEN_PEPPERS": "1=bench-only-pepper-0123456789abcdefghijklmnop",
        "SECURE_SSL_REDIRECT": "false",
        "VAULT_ADDR": bao.addr,
        "VAULT_TOKEN": bao.root().token,
        "PORT": str(free_port()),
        "ACCESS_LOG": "",
        "LOG_LEVEL": "WARNING",
        **extra_env,
    }
    os.environ.update(env)
    if "STATIC_ROOT" in env:
        Path(env["STATIC_ROOT"]).mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, check=True)
    import django

    django.setup()
    from django.db import connections

    try:
        yield env
    finally:
        connections.close_all()
        bao.stop()
        _recreate(database, drop_only=True)


@contextmanager
def gunicorn(env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """gunicorn as production runs it (relay/gunicorn_conf.py); yields its port and its
    master's pid."""
    from django.db import connections

    connections.close_all()  # the workers fork; they must not share this process's connection
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "-c",
            "python:relay.gunicorn_conf",
            "relay.asgi:application",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL if env.get("ACCESS_LOG") == "-" else None,  # the access log's lines
    )
    port = int(env["PORT"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        yield port, server.pid
    finally:
        server.terminate()
        server.wait()
