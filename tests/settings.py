"""The small test override of relay.settings: production-like (DEBUG off), real Postgres."""

import os
import secrets
import tempfile
from pathlib import Path

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "test-only-secret-key-not-for-production-0123456789abcdef")
os.environ.setdefault("TOKEN_PEPPERS", "1=test-only-pepper-number-one-0123456789abcdef")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/relay")
for name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
    os.environ.setdefault(name, "false")
# In os.environ, so that worker processes the tests start share them.
os.environ.setdefault("EVENTS_STORAGE_LOCATION", tempfile.mkdtemp(prefix="relay-events-"))
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")  # the tests' own Redis db
# A deployment id of this test session's own: it tags the tests' Vault secrets, and test runs
# sharing the broker's Redis db take only their own tasks.
os.environ.setdefault("RELAY_DEPLOYMENT_ID", f"test-{secrets.token_hex(6)}")
os.environ.setdefault("REDIS_URL", os.environ["CELERY_BROKER_URL"])  # rate limits' counters too
# conftest.py points these at the OpenBao dev server the test session starts.
os.environ.setdefault("VAULT_ADDR", "http://127.0.0.1:1")
# Sandbox uids of this test session's own (a root worker runs each script as one): test
# sessions sharing the machine (a second checkout's, CI beside a session) then never count or
# wait for each other's sandboxes (tests/script_helpers.sandbox_processes).
os.environ.setdefault("STEP_SANDBOX_UID", str(200_000 + 256 * secrets.randbelow(4000)))
# The engine's internal do-nothing step (workflows/steps/noop.py), here and in test workers.
os.environ.setdefault("WORKFLOW_NOOP_STEPS", "true")

from relay.settings import *  # noqa: E402, F403

# What the test run sets for itself: processes that must see the service's own defaults
# (`make run`, `manage.py check --deploy`) get the environment without these.
TEST_ONLY_ENV = (
    "DEBUG",
    "SECRET_KEY",
    "TOKEN_PEPPERS",
    "DJANGO_SETTINGS_MODULE",
    "SECURE_",
    "SESSION_",
    "CSRF_",
    "VAULT_",
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_",
    "EVENTS_",
    "RELAY_DEPLOYMENT_ID",
    "WORKFLOW_",
    "STEP_SANDBOX_UID",
)


def outside_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(TEST_ONLY_ENV)}, **extra}


# A worker process the tests start posts to the Slack stand-in as Slack's Web API (its
# SLACK_API_URL in the environment too): what SlackStandIn.allow_api sets in the test process.
if os.environ.get("TEST_SLACK_CA_BUNDLE"):
    SLACK_API_ALLOW_LOOPBACK = True
    SLACK_CA_BUNDLE = os.environ["TEST_SLACK_CA_BUNDLE"]

STATIC_ROOT = Path(tempfile.mkdtemp(prefix="relay-static-"))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed, not security
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
# The live server serves the apps' static files (htmx, the pages' CSS) from where they are, as
# `make run` serves what collectstatic gathered: the tests' STATIC_ROOT stays empty.
WHITENOISE_USE_FINDERS = True
