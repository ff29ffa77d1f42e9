"""Debian's real puppetserver, started by the tests with every directory of its own (conf.d,
confdir, codedir, vardir, CA) under a temporary directory and TLS on a loopback port; and an
agent configuration for this host that talks to it. Starting takes about a minute here, so
the session starts one (conftest.py's `puppetserver`) and the modules that need it share it."""

import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from tests.bao import free_port

SYSTEM_CONF = Path("/etc/puppet/puppetserver")
JAR = Path("/usr/share/puppetserver/puppetserver.jar")
LOGBACK = """<configuration scan="false">
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d %-5p [%c{2}] %m%n</pattern></encoder>
  </appender>
  <root level="warn"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


class ReportRelay:
    """The puppetserver's `reporturl`. puppetserver reads it once, when it starts, but each
    module that wants the reports has a service and a push trigger token of its own: the
    module points the relay at them (`send_to`, a URL with the token as its password, as a
    reporturl has it). Each report is passed on as Puppet's http processor sent it (body and
    content type), with those credentials as Basic auth; the answer comes back to Puppet.
    With nowhere to send to, reports are answered 503 and dropped; 502 when the target
    cannot be reached."""

    def __init__(self) -> None:
        self.target: str | None = None
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, answer = 503, b"no target"
                if relay.target is not None:
                    headers = {"Content-Type": self.headers["Content-Type"] or "application/octet-stream"}
                    try:
                        sent = requests.post(relay.target, data=body, headers=headers, timeout=30)
                        status, answer = sent.status_code, sent.content
                    except requests.RequestException as exc:
                        status, answer = 502, str(exc).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/reports"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def send_to(self, url: str | None) -> None:
        self.target = url

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PuppetServer:
    def __init__(self, directory: Path, puppetdb_port: int | None = None) -> None:
        """`puppetdb_port`: where the session's PuppetDB will serve TLS, when the session has
        one; the server then sends it facts, catalogs and reports from its start."""
        self.dir = directory
        self.port = free_port()
        self.puppetdb_port = puppetdb_port
        self.reports = ReportRelay()
        self.process: subprocess.Popen | None = None
        self.server_dir = directory / "server"
        self.agent_dir = directory / "agent"

    def start(self, timeout: float = 300) -> "PuppetServer":
        conf = self.dir / "conf.d"
        conf.mkdir(parents=True)
        for name in ("auth.conf", "web-routes.conf", "ca.conf", "metrics.conf"):
            shutil.copy(SYSTEM_CONF / "conf.d" / name, conf / name)
        shutil.copytree(SYSTEM_CONF / "services.d", self.dir / "services.d")
        (self.dir / "logback.xml").write_text(LOGBACK)
        (conf / "global.conf").write_text(f"global: {{ logging-config: {self.dir}/logback.xml }}\n")
        (conf / "webserver.conf").write_text(
            f"webserver: {{ client-auth: want, ssl-host: 127.0.0.1, ssl-port: {self.port} }}\n"
        )
        s = self.server_dir
        (conf / "puppetserver.conf").write_text(
            f"""jruby-puppet: {{
    ruby-load-path: [/usr/lib/puppetserver/ruby/vendor_ruby]
    gem-home: {s}/jruby-gems
    gem-path: [{s}/jruby-gems, /usr/lib/puppetserver/vendored-jruby-gems]
    server-conf-dir: {s}
    server-code-dir: {s}/code
    server-var-dir: {s}/var
    server-run-dir: {s}/run
    server-log-dir: {s}/log
    max-active-instances: 1
}}
http-client: {{}}
profiler: {{}}
# The admin API's jruby-pool flush (use_puppetdb): for this server's own certificate only.
puppet-admin: {{ client-whitelist: [localhost] }}
"""
        )
        (s / "code" / "environments" / "production" / "manifests").mkdir(parents=True)
        (s / "puppet.conf").write_text(
            f"""[main]
certname = localhost
# Its own CA and certificates: Debian's defaults (/etc/puppet/puppetserver/ca,
# /var/lib/puppet/ssl) are shared by everything on this machine.
cadir = {s}/ca
ssldir = {s}/ssl
vardir = {s}/var
dns_alt_names = localhost,127.0.0.1
[server]
autosign = true
reports = http
reporturl = {self.reports.url}
"""
        )
        a = self.agent_dir
        a.mkdir(parents=True)
        (a / "puppet.conf").write_text(
            f"""[main]
server = localhost
serverport = {self.port}
vardir = {a}/var
ssldir = {a}/ssl
logdir = {a}/log
rundir = {a}/run
color = false
"""
        )
        self.manifest("node default { }")
        if self.puppetdb_port:
            # Softly: PuppetDB starts after this server (it takes its certificate), so the runs
            # of modules before PuppetDB's first user find none, and must not fail for it.
            self._puppetdb_terminus(f"https://localhost:{self.puppetdb_port}", soft=True)
        self.process = subprocess.Popen(
            [
                "java",
                "-Xms512m",
                "-Xmx1g",
                "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger",
                "-Djruby.lib=/usr/share/jruby/lib",
                "-XX:+CrashOnOutOfMemoryError",
                "-jar",
                str(JAR),
                "--config",
                str(conf),
                "--bootstrap-config",
                str(self.dir / "services.d"),
            ],
            stdout=(self.dir / "server.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd=JAR.parent,
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # only to ask whether it is up yet
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"puppetserver exited: {(self.dir / 'server.log').read_text()[-3000:]}")
            try:
                url = f"https://127.0.0.1:{self.port}/status/v1/simple"
                with urllib.request.urlopen(url, context=insecure, timeout=2) as answer:
                    if answer.read() == b"running":
                        return self
            except (TimeoutError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("puppetserver did not start in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reports.close()

    def _puppetdb_terminus(self, ssl_url: str, soft: bool) -> None:
        """Debian's puppet-terminus-puppetdb: storeconfigs, `reports = puppetdb,http`,
        routes.yaml for facts, and puppetdb.conf naming `ssl_url`."""
        s = self.server_dir
        soft_failure = "true" if soft else "false"
        (s / "puppetdb.conf").write_text(
            f"[main]\nserver_urls = {ssl_url}\nsoft_write_failure = {soft_failure}\n"
        )
        (s / "routes.yaml").write_text("server:\n  facts:\n    terminus: puppetdb\n    cache: yaml\n")
        conf = (s / "puppet.conf").read_text()
        if "storeconfigs" not in conf:
            conf = conf.replace("reports = http\n", "reports = puppetdb,http\nstoreconfigs = true\n")
            (s / "puppet.conf").write_text(conf + "storeconfigs_backend = puppetdb\n")

    def use_puppetdb(self, ssl_url: str) -> None:
        """Send facts, catalogs and reports to the PuppetDB at `ssl_url` as well. Nothing
        to do when the server was started for it (`puppetdb_port`); else the terminus is
        configured now and the JRuby pool flushed (the admin API), whose new instance reads
        it: 20-40 s here. For the rest of the session: PuppetDB outlives this server's users."""
        if self.puppetdb_port and ssl_url == f"https://localhost:{self.puppetdb_port}":
            return
        self._puppetdb_terminus(ssl_url, soft=False)
        ssl = self.server_dir / "ssl"
        flushed = requests.delete(
            f"https://localhost:{self.port}/puppet-admin-api/v1/jruby-pool",
            cert=(str(ssl / "certs" / "localhost.pem"), str(ssl / "private_keys" / "localhost.pem")),
            verify=str(ssl / "certs" / "ca.pem"),
            timeout=60,
        )
        flushed.raise_for_status()

    def agent_run(self, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`puppet agent -t` on this host as this server's node."""
        return subprocess.run(
            ["puppet", "agent", "-t", f"--confdir={self.agent_dir}", *flags],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def manifest(self, text: str) -> None:
        (self.server_dir / "code" / "environments" / "production" / "manifests" / "site.pp").write_text(text)

    def node_puppet(self) -> Path:
        """The `node_puppet_path` for this host as a node of this server: Debian's puppet,
        with the agent configuration above (as /opt/puppetlabs/bin/puppet is on a real node)."""
        path = self.dir / "node-puppet"
        path.write_text(f'#!/bin/sh\nsub="$1"; shift\nexec puppet "$sub" --confdir={self.agent_dir} "$@"\n')
        path.chmod(0o755)
        return path

    def certname(self) -> str:
        done = subprocess.run(
            ["puppet", "config", "print", "certname", f"--confdir={self.agent_dir}"],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()
