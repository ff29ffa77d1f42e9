"""Debian's real PuppetDB (the `puppetdb` package), started by the tests with its own conf
dir, vardir, ports and PostgreSQL database, and TLS with the session puppetserver's CA and
certificate (so it starts after puppetserver, and the agent's terminus trusts it).

As shipped, PuppetDB compiles its Clojure (and that of the Debian libraries it loads) at
every start. The first start on a machine writes the class files it compiles into a cache
(`cache_dir`, keyed on the package's version) that later starts load instead.

Feeding it: `replace_facts` and `store_report` are PuppetDB's own commands
(`/pdb/cmd/v1`), made synchronous with `secondsToWaitForCompletion`, for synthetic nodes;
a real `puppet agent -t` through puppetserver with the terminus feeds it too
(tests/test_puppetdb.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.bao import free_port

JAR = Path("/usr/share/puppetdb/puppetdb.jar")
SYSTEM_CONF = Path("/etc/puppetdb")
# What trapperkeeper loads (bootstrap.cfg) and the entry point: compiled ahead of time.
NAMESPACES = (
    "puppetlabs.puppetdb.core",
    "puppetlabs.trapperkeeper.services.webserver.jetty9-service",
    "puppetlabs.trapperkeeper.services.webrouting.webrouting-service",
    "puppetlabs.trapperkeeper.services.authorization.authorization-service",
    "puppetlabs.trapperkeeper.services.metrics.metrics-service",
    "puppetlabs.trapperkeeper.services.status.status-service",
    "puppetlabs.trapperkeeper.services.scheduler.scheduler-service",
    "puppetlabs.puppetdb.cli.services",
    "puppetlabs.puppetdb.command",
    "puppetlabs.puppetdb.pdb-routing",
    "puppetlabs.puppetdb.config",
    "puppetlabs.puppetdb.dashboard",
)
LOGBACK = """<configuration scan="false">
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d %-5p [%c{2}] %m%n</pattern></encoder>
  </appender>
  <root level="warn"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def package_version() -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "puppetdb"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "relay-tests"


def cache_dir() -> Path:
    """Where the class files of the installed package's PuppetDB are kept (per machine)."""
    return cache_root() / f"puppetdb-classes-{package_version()}"


# The first start on a machine: PuppetDB's own start with the compiler writing the class files
# of every namespace it loads (the services trapperkeeper loads too), which costs that start
# little more than the compiling it does anyway.
COMPILING_START = """(binding [*compile-files* true]
  (doseq [name '[%s]] (require name))
  (apply (resolve 'puppetlabs.puppetdb.core/-main) *command-line-args*))
"""


class PuppetDB:
    def __init__(
        self, directory: Path, ssl_dir: Path, certname: str, database_url: str, ssl_port: int | None = None
    ) -> None:
        """`ssl_dir`: the puppetserver's (certs/ca.pem, certs/<certname>.pem,
        private_keys/<certname>.pem); `database_url`: a PostgreSQL server's URL (the
        database in it is not used: PuppetDB gets `<that name>_puppetdb`); `ssl_port`: the
        port puppetserver's terminus was told (PuppetServer's `puppetdb_port`)."""
        self.dir = directory
        self.ssl_dir = ssl_dir
        self.certname = certname
        self.port = free_port()  # cleartext, 127.0.0.1 only
        self.ssl_port = ssl_port or free_port()
        server = psycopg.conninfo.conninfo_to_dict(database_url)
        self.db = f"{server.get('dbname') or 'relay'}_puppetdb"
        self.admin_url = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
        self.db_host, self.db_port = server.get("host") or "127.0.0.1", server.get("port") or "5432"
        self.db_user, self.db_password = server.get("user") or "postgres", server.get("password") or ""
        self.process: subprocess.Popen | None = None
        self.start_seconds = 0.0
        self.cached = False  # whether it started from the machine's compiled classes
        self._building: Path | None = None  # the class files a compiling start writes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ssl_url(self) -> str:
        return f"https://localhost:{self.ssl_port}"  # the name its certificate has

    def ca(self) -> Path:
        return self.ssl_dir / "certs" / "ca.pem"

    def create_database(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.db}"')
        with psycopg.connect(
            self.admin_url.replace("dbname=postgres", f"dbname={self.db}"), autocommit=True
        ) as c:
            c.execute("CREATE EXTENSION pg_trgm")

    def drop_database(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    def start(self, timeout: float = 300) -> PuppetDB:
        began = time.monotonic()
        cache = cache_dir()
        self.cached = (cache / ".complete").exists()
        self.create_database()
        conf = self.dir / "conf.d"
        conf.mkdir(parents=True)
        shutil.copy(SYSTEM_CONF / "conf.d" / "auth.conf", conf / "auth.conf")
        shutil.copy(SYSTEM_CONF / "bootstrap.cfg", self.dir / "bootstrap.cfg")
        (self.dir / "logback.xml").write_text(LOGBACK)
        (self.dir / "var").mkdir()
        ssl = self.ssl_dir
        (conf / "config.ini").write_text(
            f"""[global]
vardir = {self.dir}/var
logging-config = {self.dir}/logback.xml

[command-processing]
threads = 1
concurrent-writes = 1

[database]
subname = //{self.db_host}:{self.db_port}/{self.db}
username = {self.db_user}
password = {self.db_password}
# PuppetDB opens 25 connections per pool by default: the test PostgreSQL is shared.
maximum-pool-size = 4
gc-interval = 0

[read-database]
subname = //{self.db_host}:{self.db_port}/{self.db}
username = {self.db_user}
password = {self.db_password}
maximum-pool-size = 4

[puppetdb]
disable-update-checking = true
"""
        )
        (conf / "jetty.ini").write_text(
            f"""[jetty]
host = 127.0.0.1
port = {self.port}
ssl-host = 127.0.0.1
ssl-port = {self.ssl_port}
ssl-key = {ssl}/private_keys/{self.certname}.pem
ssl-cert = {ssl}/certs/{self.certname}.pem
ssl-ca-cert = {ssl}/certs/ca.pem
"""
        )
        if self.cached:
            classes, compiler, main = cache, [], ["-m", "puppetlabs.puppetdb.core"]
        else:
            cache.parent.mkdir(parents=True, exist_ok=True)
            classes = self._building = cache.parent / f"{cache.name}.{uuid.uuid4().hex}"
            classes.mkdir()
            script = self.dir / "compiling-start.clj"
            script.write_text(COMPILING_START % " ".join(NAMESPACES))
            compiler, main = [f"-Dclojure.compile.path={classes}"], [str(script)]
        classpath = f"{classes}:{JAR}"
        self.process = subprocess.Popen(
            [
                "java",
                "-Xmx512m",
                "-Djava.security.egd=/dev/urandom",
                "-XX:+CrashOnOutOfMemoryError",
                *compiler,
                "-cp",
                classpath,
                "clojure.main",
                *main,
                "services",
                "--config",
                str(conf),
                "--bootstrap-config",
                str(self.dir / "bootstrap.cfg"),
            ],
            stdout=(self.dir / "puppetdb.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.dir / "puppetdb.log").read_text()[-3000:]
                self.stop()
                raise RuntimeError(f"puppetdb exited: {log}")
            try:
                answer = requests.get(f"{self.url}/status/v1/services/puppetdb-status", timeout=2)
                if answer.ok and answer.json().get("state") == "running":
                    self.start_seconds = time.monotonic() - began
                    self._keep_classes(cache)
                    return self
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("puppetdb did not start in time")

    def _keep_classes(self, cache: Path) -> None:
        """After a compiling start: a copy of its class files becomes the machine's cache,
        renamed into place whole (a half-written cache is never used; a session that got
        there first wins). The running PuppetDB keeps its own until it stops."""
        if not self._building:
            return
        staging = cache.parent / f"{cache.name}.{uuid.uuid4().hex}.copy"
        shutil.copytree(self._building, staging)
        (staging / ".complete").write_text(package_version())
        try:
            staging.rename(cache)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._building:
            shutil.rmtree(self._building, ignore_errors=True)
        try:
            self.drop_database()
        except psycopg.Error:
            pass

    # Commands (https://www.puppet.com/docs/puppetdb/7/api/command/v1/commands), synchronous.

    def command(self, name: str, version: int, certname: str, payload: dict[str, Any]) -> None:
        answer = requests.post(
            f"{self.url}/pdb/cmd/v1",
            params={
                "command": name,
                "version": version,
                "certname": certname,
                "secondsToWaitForCompletion": 30,
            },
            json=payload,
            timeout=60,
        )
        answer.raise_for_status()
        if answer.json().get("timed_out"):
            raise RuntimeError(f"PuppetDB did not process {name} for {certname} in time")

    def replace_facts(self, certname: str, facts: dict[str, Any], environment: str = "production") -> None:
        self.command(
            "replace facts",
            5,
            certname,
            {
                "certname": certname,
                "environment": environment,
                "values": facts,
                "producer_timestamp": now(),
                "producer": self.certname,
            },
        )

    def store_report(
        self,
        certname: str,
        status: str = "unchanged",
        noop: bool = False,
        transaction_uuid: str | None = None,
        job_id: str | None = None,
        resources: list[dict[str, Any]] | None = None,
        environment: str = "production",
    ) -> str:
        """A report for `certname`; returns its transaction_uuid."""
        transaction = transaction_uuid or str(uuid.uuid4())
        stamp = now()
        self.command(
            "store report",
            8,
            certname,
            {
                "certname": certname,
                "environment": environment,
                "status": status,
                "noop": noop,
                "noop_pending": any(e.get("status") == "noop" for r in resources or [] for e in r["events"]),
                "puppet_version": "7.23.0",
                "report_format": 12,
                "configuration_version": "1",
                "transaction_uuid": transaction,
                "job_id": job_id,
                "catalog_uuid": transaction,
                "code_id": None,
                "cached_catalog_status": "not_used",
                "producer_timestamp": stamp,
                "producer": self.certname,
                "start_time": stamp,
                "end_time": stamp,
                "corrective_change": False,
                "type": "agent",
                "resources": resources or [],
                "metrics": [],
                "logs": [],
            },
        )
        return transaction


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
