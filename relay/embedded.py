"""`make run`: the whole service on one machine, in one foreground command.

Starts, in order: an OpenBao server with persistent file storage under var/ (initialised and
unsealed on first start, unsealed again on every later start), database migrations, gunicorn,
a Celery worker with its beat, and a Celery worker for the `steps` queue (script steps).
Ctrl-C (or SIGTERM) stops the web server and the workers first, then OpenBao, and exits 0.

Everything this generates lives under RELAY_VAR_DIR (default var/), files holding secrets
with mode 0600. That is fine for one machine, not for production: see docs/production.md "Production".
Set VAULT_ADDR to use an existing Vault instead of the embedded one.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import hvac
import requests

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RELAY_VAR_DIR", BASE_DIR / "var")).resolve()
BIN_DIR = Path(sys.executable).parent
APP_POLICY = "relay-app"
OPENBAO_CONFIG = """\
storage "raft" {{
  path = "{data}"
  node_id = "relay"
  performance_multiplier = 1
}}
listener "tcp" {{
  address = "127.0.0.1:{port}"
  tls_disable = true
}}
api_addr = "http://127.0.0.1:{port}"
cluster_addr = "http://127.0.0.1:{cluster_port}"
ui = false
"""


def say(message: str) -> None:
    print(f"[relay] {message}", flush=True)


def write_private(path: Path, text: str) -> None:
    """Create a file only its owner can read, without a window where it is readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.chmod(path, 0o600)


def generated_secret(path: Path, make: Callable[[], str]) -> Path:
    if not path.exists():
        write_private(path, make())
    return path


class Stack:
    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False

    def start(
        self, name: str, args: list[str], env: dict[str, str], log: Path | None = None
    ) -> subprocess.Popen:
        # A session of its own: Ctrl-C reaches only us, so we choose the order of shutdown.
        out = open(log, "ab") if log else None
        child = subprocess.Popen(args, env=env, start_new_session=True, stdout=out, stderr=out)
        self.children.append((name, child))
        return child

    def stop(self) -> None:
        self.stopping = True
        # Web and worker first (they may still be talking to Vault), OpenBao last.
        try:
            for name, child in reversed(self.children):
                if child.poll() is None:
                    say(f"stopping {name}")
                    child.terminate()
                    try:
                        child.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
        except KeyboardInterrupt:
            # Ctrl-C again while stopping: no more waiting.
            for _, child in self.children:
                if child.poll() is None:
                    child.kill()
                    child.wait()


def start_openbao(stack: Stack, env: dict[str, str]) -> None:
    """Run OpenBao on var/openbao, initialise and unseal it, and give the app a token that
    can only touch the app's own secrets."""
    home = VAR_DIR / "openbao"
    (home / "data").mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    port = int(os.environ.get("VAULT_PORT", "8200"))
    addr = f"http://127.0.0.1:{port}"
    # Raft is OpenBao's persistent storage (it has no "file" backend); one node, fast timers.
    # Its cluster port is VAULT_PORT + 1.
    (home / "config.hcl").write_text(
        OPENBAO_CONFIG.format(data=home / "data", port=port, cluster_port=port + 1)
    )
    for taken in (port, port + 1):
        if port_in_use(taken):
            raise SystemExit(
                f"port {taken} is taken; OpenBao needs VAULT_PORT and VAULT_PORT + 1: set VAULT_PORT"
            )
    stack.start(
        "openbao",
        [str(BIN_DIR / "bao"), "server", f"-config={home / 'config.hcl'}"],
        env,
        home / "openbao.log",
    )
    client = hvac.Client(url=addr, timeout=30)  # the first raft election takes seconds
    health = f"{addr}/v1/sys/health"
    # Any answer means it listens: 501 uninitialised, 503 sealed, 429 standby, 200 active.
    wait_for(lambda: requests.get(health, timeout=2).status_code in (200, 429, 501, 503), "openbao")

    keys_file = home / "init.json"
    if not client.sys.is_initialized():
        result = client.sys.initialize(secret_shares=1, secret_threshold=1)
        write_private(keys_file, json.dumps({"keys": result["keys"], "root_token": result["root_token"]}))
        say(f"OpenBao initialised; its unseal key and root token are in {keys_file} (mode 0600)")
    init = json.loads(keys_file.read_text())
    if client.sys.is_sealed():
        client.sys.submit_unseal_keys(init["keys"])
    # Unsealed is not yet active: raft elects its leader first, and until then writes fail.
    wait_for(lambda: requests.get(health, timeout=2).status_code == 200, "openbao (active)")
    say(
        "WARNING: the embedded OpenBao keeps its unseal key next to its data. That is for "
        "single-machine use only; production uses an external Vault (docs/production.md, 'Production')."
    )

    client.token = init["root_token"]
    mount = os.environ.get("VAULT_MOUNT_POINT", "secret")
    if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
        client.sys.enable_secrets_engine("kv", path=mount, options={"version": "2"})
    prefix = os.environ.get("VAULT_PATH_PREFIX", "relay")
    client.sys.create_or_update_policy(
        APP_POLICY,
        f'path "{mount}/data/{prefix}/*" {{ capabilities = ["create", "read", "update"] }}\n'
        f'path "{mount}/metadata/{prefix}/*" {{ capabilities = ["read", "list", "update", "delete"] }}\n',
    )
    # A periodic token renews itself forever (relay.vault renews it) but can do nothing else.
    app_token = client.auth.token.create(policies=[APP_POLICY], period="24h", no_default_policy=False)
    write_private(home / "app-token", app_token["auth"]["client_token"])
    env["VAULT_ADDR"] = addr
    env["VAULT_TOKEN_FILE"] = str(home / "app-token")


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (requests.RequestException, hvac.exceptions.VaultError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not start within {timeout:.0f}s")


def choose_broker(env: dict[str, str]) -> None:
    if os.environ.get("CELERY_BROKER_URL"):
        return
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    parts = urlparse(redis_url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=1).close()
    except OSError:
        # Safe because no data lives only in the broker: periodic sweeps re-enqueue from the DB.
        say(f"no Redis at {redis_url}; the worker uses a filesystem queue under {VAR_DIR}")
        env["CELERY_BROKER_URL"] = "filesystem://"
        (VAR_DIR / "celery-queue").mkdir(parents=True, exist_ok=True)


def base_env() -> dict[str, str]:
    """The environment of every process of the embedded service (and of `make manage`)."""
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(VAR_DIR, 0o700)
    env = dict(os.environ)
    env.setdefault("RELAY_VAR_DIR", str(VAR_DIR))
    env.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
    # Plain HTTP on localhost: HTTPS-only cookies and redirects would lock the admin out.
    for name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        env.setdefault(name, "false")
    env.setdefault("SECURE_HSTS_SECONDS", "0")
    if "SECRET_KEY" not in env and "SECRET_KEY_FILE" not in env:
        env["SECRET_KEY_FILE"] = str(
            generated_secret(VAR_DIR / "secret_key", lambda: secrets.token_urlsafe(50))
        )
    if "TOKEN_PEPPERS" not in env and "TOKEN_PEPPERS_FILE" not in env:
        env["TOKEN_PEPPERS_FILE"] = str(
            generated_secret(VAR_DIR / "token_peppers", lambda: f"1={secrets.token_urlsafe(48)}")
        )
    if "RELAY_DEPLOYMENT_ID" not in env:
        # Stable across restarts: it tags this checkout's Vault secrets (relay.vault) and
        # names its broker namespace (relay/settings.py), apart from other checkouts'.
        path = generated_secret(VAR_DIR / "deployment_id", lambda: f"local-{secrets.token_hex(6)}")
        env["RELAY_DEPLOYMENT_ID"] = path.read_text().strip()
    return env


def embedded_vault_env(env: dict[str, str]) -> None:
    """Point a command at the embedded OpenBao, the way `make run` points its own processes,
    unless a Vault is configured."""
    token_file = VAR_DIR / "openbao" / "app-token"
    if "VAULT_ADDR" not in env and token_file.exists():
        env["VAULT_ADDR"] = f"http://127.0.0.1:{int(env.get('VAULT_PORT', '8200'))}"
        env.setdefault("VAULT_TOKEN_FILE", str(token_file))


def checkout_env(environ: dict[str, str]) -> dict[str, str] | None:
    """The environment for `python manage.py …` typed in a checkout (`environ` as it was
    before anything imported): unchanged when the settings are configured; `make run`'s
    when it has generated var/; None when neither."""
    if any(name in environ for name in ("SECRET_KEY", "SECRET_KEY_FILE", "DJANGO_SETTINGS_MODULE", "DEBUG")):
        return environ
    if not (VAR_DIR / "secret_key").exists():
        return None
    env = base_env()
    embedded_vault_env(env)
    return env


def manage(args: list[str]) -> int:
    """`manage.py ARGS` with the embedded service's settings, e.g. createsuperuser."""
    env = base_env()
    embedded_vault_env(env)
    return subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], env=env).returncode


SUPERUSER_ENV = ("DJANGO_SUPERUSER_USERNAME", "DJANGO_SUPERUSER_EMAIL", "DJANGO_SUPERUSER_PASSWORD")


def createsuperuser(args: list[str]) -> int:
    """`make createsuperuser`: from DJANGO_SUPERUSER_* when they are set, else by asking on
    the terminal; with neither, one line says what to set (Django's own command would print
    that it skipped and exit 0, which a script takes for success)."""
    given = [name for name in SUPERUSER_ENV if os.environ.get(name)]
    if len(given) == len(SUPERUSER_ENV):
        return manage(["createsuperuser", "--noinput", *args])
    if sys.stdin.isatty() and not given:
        return manage(["createsuperuser", *args])
    missing = ", ".join(name for name in SUPERUSER_ENV if name not in given)
    print(
        f"make createsuperuser: no terminal to ask on; set {missing} (README, make run)"
        if not given
        else f"make createsuperuser: {missing} not set (it takes all three, or none on a terminal)",
        file=sys.stderr,
    )
    return 2


def main() -> int:
    env = base_env()
    stack = Stack()

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    port = int(os.environ.get("PORT", "8000"))
    host = os.environ.get("HOST", "127.0.0.1")
    try:
        if "VAULT_ADDR" not in os.environ:
            start_openbao(stack, env)
        choose_broker(env)
        manage = [sys.executable, str(BASE_DIR / "manage.py")]
        subprocess.run([*manage, "migrate", "--noinput"], env=env, check=True)
        subprocess.run([*manage, "collectstatic", "--noinput", "-v0"], env=env, check=True)
        stack.start(
            "gunicorn",
            [str(BIN_DIR / "gunicorn"), "-c", "python:relay.gunicorn_conf", "relay.asgi:application"],
            {**env, "PORT": str(port), "HOST": host},
        )
        stack.start(
            "celery",
            [
                str(BIN_DIR / "celery"),
                "-A",
                "relay",
                "worker",
                "--beat",
                "--loglevel",
                "INFO",
                "--concurrency",
                os.environ.get("CELERY_CONCURRENCY", "2"),
                "--schedule",
                str(VAR_DIR / "celerybeat-schedule"),
            ],
            env,
        )
        # Script steps on their own worker and queue: a slow script never holds the engine.
        stack.start(
            "celery-steps",
            [
                str(BIN_DIR / "celery"),
                "-A",
                "relay",
                "worker",
                "--queues",
                "steps",
                "--hostname",
                "steps@%h",
                "--loglevel",
                "INFO",
                "--concurrency",
                os.environ.get("STEP_CONCURRENCY", "4"),
            ],
            env,
        )
        wait_for(lambda: requests.get(f"http://{host}:{port}/healthz", timeout=1).ok, "gunicorn")
        say(f"Relay is up: admin at http://{host}:{port}/admin/, API docs at http://{host}:{port}/api/docs/")
        say("Create the first admin user in another terminal: make createsuperuser")
        say("  (that is Django's createsuperuser with this service's settings)")
        say("Ctrl-C stops everything.")
        while True:
            for name, child in stack.children:
                if child.poll() is not None:
                    say(f"{name} exited with {child.returncode}; stopping")
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()
        say("stopped")


if __name__ == "__main__":
    if sys.argv[1:2] == ["manage"]:
        sys.exit(manage(sys.argv[2:]))
    if sys.argv[1:2] == ["createsuperuser"]:
        sys.exit(createsuperuser(sys.argv[2:]))
    sys.exit(main())
