import base64
import gzip
import subprocess
from pathlib import Path

from django.test import Client

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "public-reports"
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
