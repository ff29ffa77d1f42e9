import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from relay_bridge.api import RelayClient
from rest_framework.test import APIClient

from puppet_connection.models import PuppetConnection
from relay import vault
from relay.models import UserToken
from relay.server import ThreadedServer
from tests.bao import BaoDevServer, free_port
from tests.bridge_helpers import Service
from tests.puppetdb import PuppetDB
from tests.puppetserver import PuppetServer
from tests.script_helpers import EngineWorker, StandIn, running_script_workers
from tests.sshd import Sshd
from tests.standins.orchestrator import Orchestrator


def point_vault_at(server: BaoDevServer, token: str) -> None:
    settings.VAULT_ADDR = server.addr
    settings.VAULT_TOKEN = token
    settings.VAULT_ROLE_ID = ""
    vault.reset()


@pytest.fixture(scope="session")
def bao() -> Iterator[BaoDevServer]:
    """The session's OpenBao: started once, shared by the tests that do not break it."""
    server = BaoDevServer().start()
    yield server
    server.stop()


class LiveServer(ThreadedServer):
    """pytest-django's live_server, served as production serves it: the ASGI application
    (relay.asgi) under uvicorn with relay.server's protocol and settings, in a thread of the
    test process, so that it shares the test's settings and database. (A gunicorn of its own
    would not see the settings tests change.)"""

    def __init__(self) -> None:
        from django.test.utils import modify_settings

        super().__init__()
        # What pytest-django's _live_server_helper enables for each test that uses it.
        self._live_server_modified_settings = modify_settings(ALLOWED_HOSTS={"append": self.host})


@pytest.fixture(scope="session")
def live_server(django_db_setup, django_db_blocker) -> Iterator[LiveServer]:
    with django_db_blocker.unblock():
        server = LiveServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """The session's headless Chromium (tests/browser.py's BrowserThread), started by the first
    test that needs it."""
    from tests.browser import BrowserThread  # Playwright is imported by the tests that use it

    thread = BrowserThread()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Iterator[Sshd]:
    """A real OpenSSH server on loopback: the bridge's SSH backend's "nodes"."""
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def puppetserver(request, tmp_path_factory) -> Iterator[PuppetServer]:
    """Debian's puppetserver, started once for the session (about a minute each start) and
    shared by the modules that run Puppet against it. Each sets its own manifest, and where
    the server's reports go (`puppetserver.reports.send_to`). When a test of the session uses
    PuppetDB, the server is told its port from the start (flushing its JRuby pool later to
    tell it would cost 20-40 s)."""
    wants_puppetdb = any("puppetdb" in getattr(item, "fixturenames", ()) for item in request.session.items)
    port = free_port() if wants_puppetdb else None
    server = PuppetServer(tmp_path_factory.mktemp("puppetserver"), puppetdb_port=port).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def puppetdb(puppetserver: PuppetServer, tmp_path_factory) -> Iterator[PuppetDB]:
    """Debian's PuppetDB, started once for the session after the puppetserver (it serves TLS
    with that server's certificate and CA), on a PostgreSQL database of its own. Tests keep
    out of each other's way by certname (each names its nodes with a prefix of its own)."""
    server = PuppetDB(
        tmp_path_factory.mktemp("puppetdb"),
        puppetserver.server_dir / "ssl",
        "localhost",
        _database_url(),
        ssl_port=puppetserver.puppetdb_port,
    ).start()
    yield server
    server.stop()


def _database_url() -> str:
    db = settings.DATABASES["default"]
    user, password = db.get("USER") or "postgres", db.get("PASSWORD") or ""
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgresql://{user}:{password}@{host}:{port}/{db['NAME']}"


@pytest.fixture(scope="session", autouse=True)
def no_bridge_outlives_the_tests(tmp_path_factory) -> Iterator[None]:
    """`relay-bridge poll --once` daemonizes its workers: none may linger after the session
    (a failed test may leave one waiting for a service that is gone)."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    subprocess.run(["pkill", "-f", f"relay-bridge --config {base}"], check=False)


@pytest.fixture(scope="session", autouse=True)
def stop_runs_listener(django_db_setup, django_db_blocker) -> Iterator[None]:
    # Torn down before django_db_setup (which it depends on): the listener's connection
    # would otherwise keep the test database from being dropped.
    yield
    from runs.notify import listener

    listener.stop()
    # A live server's request thread may still hold a long-poll (and its connection) for
    # a bridge that a test has stopped: end those sessions so the database can be dropped.
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session", autouse=True)
def broker_namespace_cleared() -> Iterator[None]:
    """Tests that post events queue tasks no worker takes: the session's broker namespace
    (tests/settings.py) goes at the end, not left behind in the shared Redis db."""
    yield
    import redis

    from tests.events_helpers import clear_queues

    try:
        clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))
    except redis.RedisError:
        pass  # no Redis: nothing was queued


@pytest.fixture(autouse=True)
def use_session_vault(bao: BaoDevServer) -> Iterator[BaoDevServer]:
    saved = (settings.VAULT_ADDR, settings.VAULT_TOKEN, settings.VAULT_ROLE_ID, settings.VAULT_SECRET_ID)
    point_vault_at(bao, bao.root().token)
    yield bao
    settings.VAULT_ADDR, settings.VAULT_TOKEN, settings.VAULT_ROLE_ID, settings.VAULT_SECRET_ID = saved
    vault.reset()


@pytest.fixture
def own_bao() -> Iterator[BaoDevServer]:
    """An OpenBao of this test's own, for tests that stop, seal or restrict it."""
    server = BaoDevServer().start()
    point_vault_at(server, server.root().token)
    yield server
    server.stop()


@pytest.fixture
def alice(db) -> User:
    return User.objects.create_user("alice", password="alice-password-1")


@pytest.fixture
def bob(db) -> User:
    return User.objects.create_user("bob", password="bob-password-1")


@pytest.fixture
def staff(db) -> User:
    return User.objects.create_superuser("root", password="root-password-1")


@pytest.fixture
def owner(db) -> User:
    return User.objects.create_user("ops")


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Iterator[StandIn]:
    """The module's HTTP(S) stand-in for a public server, reached through a step's proxy."""
    server = StandIn(tmp_path_factory.mktemp("standin"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxied_workers(
    django_db_setup, django_db_blocker, bao, live_server, standin, tmp_path_factory
) -> Iterator[tuple[EngineWorker, EngineWorker]]:
    """The module's script workers, whose steps' proxy lets them reach the stand-in's two ports."""
    with running_script_workers(
        django_db_blocker,
        bao,
        live_server.url,
        tmp_path_factory.mktemp("scripts"),
        STEP_PROXY_TEST_LOOPBACK_PORTS=f"{standin.port},{standin.tls_port}",
        RELAY_PUBLIC_URL=live_server.url,  # the service, which steps reach through the proxy
    ) as workers:
        yield workers


def api_token_for(user: User) -> str:
    """A new user API token (`rlyu_…`), as `Authorization: Token <token>` takes it."""
    _, token = UserToken.create_for(user)
    return str(token)


def client_for(user: User) -> APIClient:
    """An API client that authenticates the way users do: the Token header."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_for(user)}")
    return client


@pytest.fixture
def alice_api(alice: User) -> APIClient:
    return client_for(alice)


@pytest.fixture
def connection(alice: User) -> tuple[PuppetConnection, str]:
    conn, token = PuppetConnection.create_with_token(owner=alice, name="prod-puppet")
    return conn, str(token)


# A permission table's cells (tests/test_*_permissions.py): change one field of the world's
# object (`w`: its api_url, admin_url and `fresh` copy from the database) through a door, and
# say whether it was done, from the database rather than the answer.


def api_changed(api: APIClient, w: Any, **change: str) -> tuple[Any, bool]:
    response = api.patch(w.api_url, change, format="json")
    fresh = w.fresh
    return response, all(getattr(fresh, field) == value for field, value in change.items())


def admin_changed(admin: Client, w: Any, form: Callable[..., dict], **change: str) -> tuple[Any, bool]:
    """`form(w, **change)`: the admin's change form, as its page shows it, with the change."""
    response = admin.post(f"{w.admin_url}change/", form(w, **change))
    fresh = w.fresh
    return response, all(getattr(fresh, field) == value for field, value in change.items())


def api_given_to_bob(api: APIClient, w: Any) -> tuple[Any, bool]:
    response = api.patch(w.api_url, {"owner": "bob"}, format="json")
    return response, w.fresh.owner_id == w.bob.pk


def admin_given_to_bob(admin: Client, w: Any, form: Callable[..., dict]) -> tuple[Any, bool]:
    response = admin.post(f"{w.admin_url}change/", form(w, owner=w.bob.pk))
    return response, w.fresh.owner_id == w.bob.pk


def owner_as_actor(owner: User, door: str) -> User:
    """A permission table's owner row: staff in the admin only (it lets in staff alone), and
    their own rows as the API (staff or not)."""
    owner.is_staff = door == "admin"
    owner.save()
    return User.objects.get(pk=owner.pk)


def bridge(token: str) -> APIClient:
    """A client that authenticates as a bridge: the connection token as Bearer."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def run_concurrently(count: int, work) -> list:
    """work(i) in `count` threads that start together; each thread has its own database
    connection (Django's are per thread). Returns the results (or exceptions) in order."""
    from django.db import connections

    barrier = threading.Barrier(count)
    results: list = [None] * count

    def runner(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture
def service(live_server) -> Iterator[Service]:
    """For the bridge's tests: a connection on a live server, and a client that plays the
    workflow step. (test_bridge_step.py has a `service` of its own.)"""
    _, token = PuppetConnection.create_with_token(owner=User.objects.create_user("ops"), name="dc")
    client = RelayClient(live_server.url, str(token), attempts=1)
    yield Service(live_server.url, str(token), client)
    client.close()


@pytest.fixture
def pe(tmp_path) -> Iterator[Orchestrator]:
    """The PE orchestrator's stand-in (tests/standins/orchestrator.py), on a port of its own."""
    orchestrator = Orchestrator(tmp_path / "pe")
    yield orchestrator
    orchestrator.stop()


@pytest.fixture
def relay(live_server) -> Iterator[RelayClient]:
    """Our bridge's client of a PE connection on a live server."""
    _, token = PuppetConnection.create_with_token(owner=User.objects.create_user("ops"), name="pe")
    client = RelayClient(live_server.url, str(token), platform="pe", backend="orchestrator", attempts=2)
    yield client
    client.close()


@pytest.fixture
def oss(live_server) -> Iterator[Service]:
    """An open-source connection whose bridge has PuppetDB (the `puppetdb` setting)."""
    conn, token = PuppetConnection.create_with_token(owner=User.objects.create_user("ops"), name="oss")
    PuppetConnection.objects.filter(pk=conn.pk).update(platform="oss", backend="ssh", puppetdb=True)
    client = RelayClient(live_server.url, str(token), attempts=1)
    yield Service(live_server.url, str(token), client)
    client.close()
