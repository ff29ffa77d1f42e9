"""Debian's real puppetserver, started by the tests with every directory of its own (conf.d,
confdir, codedir, vardir, CA) under a temporary directory and TLS on a loopback port; and an
agent configuration for this host that talks to it. Starting takes about a minute here."""

import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

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


class PuppetServer:
    def __init__(self, directory: Path, reporturl: str) -> None:
        self.dir = directory
        self.port = free_port()
        self.reporturl = reporturl
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
reporturl = {self.reporturl}
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
