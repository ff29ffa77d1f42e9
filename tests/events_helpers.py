import base64
import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "public-reports"
EVENTS = "/api/events"


def post(token: str, body: bytes, content_type: str = "application/x-yaml", basic: bool = True, **extra):
    auth = "Basic " + base64.b64encode(f"any:{token}".encode()).decode() if basic else f"Bearer {token}"
    return Client().generic(
        "POST",
        EVENTS,
        body,
        content_type=content_type,
        HTTP_AUTHORIZATION=auth,
        HTTP_HOST="127.0.0.1",
        **extra,
    )


def gz(data: bytes) -> bytes:
    return gzip.compress(data)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def big_report(resources: int, host: str = "big.example.com") -> bytes:
    """A Puppet 8 style YAML report (report_format 12) with `resources` changed files, each
    with an event and a few log lines: about 1.2 KB a resource."""
    import uuid

    lines = [
        "--- !ruby/object:Puppet::Transaction::Report",
        f"host: {host}",
        "time: '2026-11-21T10:00:00.123456789+00:00'",
        "configuration_version: 1763719200",
        f"transaction_uuid: {uuid.uuid4()}",
        "report_format: 12",
        "puppet_version: 8.4.0",
        "status: changed",
        "transaction_completed: true",
        "noop: false",
        "noop_pending: false",
        "environment: production",
        "logs:",
    ]
    for i in range(resources):
        lines += [
            "- level: notice",
            f"  message: content changed '{{sha256}}aaaa' to '{{sha256}}{i:064x}'",
            f'  source: "/Stage[main]/Profile::Web/File[/srv/www/{i}.html]/content"',
            "  tags:",
            "  - notice",
            "  - file",
            "  - class",
            "  - profile::web",
            f"  time: '2026-11-21T10:00:{i % 60:02d}.{i:09d}+00:00'",
            '  file: "/etc/puppetlabs/code/environments/production/modules/profile/manifests/web.pp"',
            f"  line: {i % 500}",
        ]
    lines += [
        "metrics:",
        "  resources:",
        "    name: resources",
        "    label: Resources",
        "    values:",
        f"    - - total\n      - Total\n      - {resources}",
        f"    - - changed\n      - Changed\n      - {resources}",
        "resource_statuses:",
    ]
    for i in range(resources):
        lines += [
            f"  File[/srv/www/{i}.html]:",
            f'    title: "/srv/www/{i}.html"',
            '    file: "/etc/puppetlabs/code/environments/production/modules/profile/manifests/web.pp"',
            f"    line: {i % 500}",
            f"    resource: File[/srv/www/{i}.html]",
            "    resource_type: File",
            "    provider_used: posix",
            "    containment_path:",
            "    - Stage[main]",
            "    - Profile::Web",
            f"    - File[/srv/www/{i}.html]",
            "    evaluation_time: 0.001234",
            "    tags:",
            "    - file",
            "    - class",
            "    - profile::web",
            "    - profile",
            "    - web",
            f"    time: '2026-11-21T10:00:{i % 60:02d}.{i:09d}+00:00'",
            "    failed: false",
            "    failed_to_restart: false",
            "    changed: true",
            "    out_of_sync: true",
            "    skipped: false",
            "    change_count: 1",
            "    out_of_sync_count: 1",
            "    events:",
            "    - audited: false",
            "      property: content",
            '      previous_value: "{sha256}aaaa"',
            f'      desired_value: "{{sha256}}{i:064x}"',
            "      historical_value:",
            "      message: content changed",
            "      name: content_changed",
            "      status: success",
            f"      time: '2026-11-21T10:00:{i % 60:02d}.{i:09d}+00:00'",
            "      redacted:",
            "      corrective_change: false",
            "    corrective_change: false",
        ]
    return ("\n".join(lines) + "\n").encode()


def puppet_apply(workdir: Path, manifest: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """A real `puppet apply` of `manifest` with its own directories under `workdir`."""
    (workdir / "site.pp").write_text(manifest)
    state = workdir / "state"
    state.mkdir(exist_ok=True)
    dirs = [f"--{name}={state}" for name in ("confdir", "codedir", "vardir", "logdir", "rundir")]
    return subprocess.run(
        ["puppet", "apply", "--detailed-exitcodes", "--color=false", *dirs, *flags, str(workdir / "site.pp")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def stored_report(workdir: Path) -> bytes:
    """The report a `puppet_apply(..., "--reports=store", f"--reportdir={workdir}/reports")` kept."""
    [report] = list((workdir / "reports").rglob("*.yaml"))
    return report.read_bytes()


class ChildProcess:
    """A test's own service process (a Celery worker, beat): SIGTERM and wait, SIGKILL if it
    will not go; `kill()` is a machine's crash, as far as the process goes."""

    process: subprocess.Popen

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


class Worker(ChildProcess):
    """`celery worker` in its own process, on the tests' Redis db (and broker namespace) and
    the test database. `pool` "solo" runs tasks in the worker process itself (so `kill()`
    kills the task mid-way); "prefork" runs them in a child, as production does. `env`
    adds to the environment (another RELAY_DEPLOYMENT_ID, EVENTS_MAX_ATTEMPTS, ...); the
    worker's log goes to `log` when given."""

    def __init__(
        self, pool: str = "solo", env: dict[str, str] | None = None, log: Path | None = None
    ) -> None:
        db = connection.settings_dict
        self.log = log
        out = open(log, "ab") if log else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "relay",
                "worker",
                "--pool",
                pool,
                *(["--concurrency", "1"] if pool == "prefork" else []),
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "WARNING",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
                **(env or {}),
            },
            stdout=out,
            stderr=out,
        )
        if log:
            out.close()

    def logged(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""


def wait_until(check: Callable[[], object], timeout: float = 60, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError("timed out")


def queue_key(queue: str = "celery") -> str:
    """The Redis key of a Celery queue in this test session's broker namespace."""
    return settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "") + queue


def clear_queues(client, prefix: str | None = None) -> None:
    """Drop every key of this session's broker namespace (not other sessions' on the same db),
    or of the namespace `prefix`."""
    if prefix is None:
        prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


# A report processor of the tests' own, installed into a `puppet_apply` work directory: it
# sends what the Puppet module's report processor (puppetlabs-relay 2.x) sends, built the same
# way from the live report (its `{"data": ...}` push body), and Puppet's own JSON form of the
# report, each with its trigger's token (from the environment: RELAY_TEST_EVENTS_URL,
# RELAY_TEST_PUSH_TOKEN, RELAY_TEST_JSON_TOKEN). Use it as `--reports=http,relaytest`.
MODULE_LIKE_PROCESSOR = """\
require 'json'
require 'net/http'
require 'puppet'

Puppet::Reports.register_report(:relaytest) do
  desc 'The module push body and the JSON report, for the tests.'

  def process
    url = URI(ENV.fetch('RELAY_TEST_EVENTS_URL'))
    # The module sends nothing for a run that changed nothing, unless noop left changes pending.
    unless status == 'unchanged' && !noop_pending
      changed = resource_statuses.reject do |_, s|
        s.skipped || (s.change_count.zero? && s.out_of_sync_count.zero?)
      end
      data = {
        host: host,
        noop: noop,
        status: status,
        time: time.iso8601,
        configuration_version: configuration_version,
        transaction_uuid: transaction_uuid,
        code_id: code_id,
        summary: summary,
        resource_statuses: changed.transform_values { |s|
          {
            resource_type: s.resource_type,
            title: s.title,
            change_count: s.change_count,
            out_of_sync_count: s.out_of_sync_count,
            containment_path: s.containment_path,
            corrective_change: s.corrective_change,
          }
        },
      }
      send_to(url, ENV.fetch('RELAY_TEST_PUSH_TOKEN'), { data: data }.to_json)
    end
    send_to(url, ENV.fetch('RELAY_TEST_JSON_TOKEN'), Puppet::Util::Json.dump(to_data_hash))
  end

  def send_to(url, token, body)
    headers = { 'Content-Type' => 'application/json', 'Authorization' => "Bearer #{token}" }
    request = Net::HTTP::Post.new(url, headers)
    request.body = body
    response = Net::HTTP.start(url.host, url.port) { |http| http.request(request) }
    raise "#{url}: #{response.code} #{response.body}" unless response.code == '202'
  end
end
"""


def install_module_like_processor(workdir: Path) -> None:
    """Into `puppet_apply`'s libdir ($vardir/lib), where Puppet looks for report processors."""
    reports = workdir / "state" / "lib" / "puppet" / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "relaytest.rb").write_text(MODULE_LIKE_PROCESSOR)
