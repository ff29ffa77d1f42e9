import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.settings import outside_env

ROOT = Path(__file__).resolve().parent.parent


def manage(args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = outside_env(DJANGO_SETTINGS_MODULE="relay.settings", **env)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=clean, capture_output=True, text=True, cwd=ROOT
    )


@pytest.fixture
def production(tmp_path) -> dict[str, str]:
    """What docs/production.md sets, with secrets given as files."""
    (tmp_path / "secret_key").write_text(secrets.token_urlsafe(50))
    (tmp_path / "peppers").write_text(f"1={secrets.token_urlsafe(40)}\n")
    (tmp_path / "db").write_text("postgres://postgres@127.0.0.1:5432/relay")
    return {
        "SECRET_KEY_FILE": str(tmp_path / "secret_key"),
        "TOKEN_PEPPERS_FILE": str(tmp_path / "peppers"),
        "DATABASE_URL_FILE": str(tmp_path / "db"),
        "ALLOWED_HOSTS": "relay.example.com",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
        "SECURE_HSTS_PRELOAD": "true",
        "VAULT_ADDR": "https://vault.example.com:8200",
        "RELAY_DEPLOYMENT_ID": "production",
    }


def test_check_deploy_passes_with_production_values(production):
    result = manage(["check", "--deploy", "--fail-level", "WARNING"], **production)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_warns_without_a_deployment_id(production):
    del production["RELAY_DEPLOYMENT_ID"]
    result = manage(["check", "--deploy", "--fail-level", "WARNING"], **production)
    assert result.returncode != 0 and "relay.W001" in result.stderr and "RELAY_DEPLOYMENT_ID" in result.stderr


def test_a_malformed_deployment_id_is_refused(production):
    result = manage(["check"], **{**production, "RELAY_DEPLOYMENT_ID": "prod/../x"})
    assert result.returncode != 0 and "RELAY_DEPLOYMENT_ID is 1-64" in result.stderr


def test_a_missing_secret_key_stops_the_service_outside_debug(production):
    del production["SECRET_KEY_FILE"]
    result = manage(["check"], **production)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def test_missing_peppers_stop_the_service_outside_debug(production):
    del production["TOKEN_PEPPERS_FILE"]
    result = manage(["check"], **production)
    assert result.returncode != 0 and "TOKEN_PEPPERS" in result.stderr


def test_a_short_pepper_is_refused(production):
    del production["TOKEN_PEPPERS_FILE"]
    result = manage(["check"], TOKEN_PEPPERS="1=short", **production)
    assert result.returncode != 0 and "32+ characters" in result.stderr


def test_debug_mode_runs_without_secrets():
    result = manage(["check"], DEBUG="true")
    assert result.returncode == 0, result.stderr


def test_s3_event_storage_is_configured_from_the_environment(production, tmp_path):
    (tmp_path / "s3-secret").write_text("s3-secret-key\n")
    code = (
        "from django.core.files.storage import storages; s = storages['events']; "
        "print(type(s).__name__, s.bucket_name, s.endpoint_url, s.location, s.secret_key)"
    )
    result = manage(
        ["shell", "-c", code],
        EVENTS_STORAGE="s3",
        EVENTS_S3_BUCKET="reports",
        EVENTS_S3_ENDPOINT_URL="https://s3.example.com",
        EVENTS_S3_ACCESS_KEY_ID="id",
        EVENTS_S3_SECRET_ACCESS_KEY_FILE=str(tmp_path / "s3-secret"),
        **production,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-5:] == [
        "S3Storage",
        "reports",
        "https://s3.example.com",
        "relay-events",
        "s3-secret-key",
    ]


def test_an_unknown_event_storage_stops_the_service(production):
    result = manage(["check"], EVENTS_STORAGE="ftp", **production)
    assert result.returncode != 0 and "EVENTS_STORAGE" in result.stderr
