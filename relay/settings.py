"""Settings for the Relay service.

Every value comes from the environment (django-environ) with a typed default. The defaults
suit `make run` on one machine; docs/configuration.md lists every variable and
docs/production.md what production sets. A variable NAME that holds a secret may instead be
given as NAME_FILE, a path to a file holding it (for Docker/Kubernetes secrets and systemd
credentials).
"""

import os
import re
import tempfile
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()


def env_secret(name: str, default: str | None = None) -> str | None:
    """NAME_FILE (a file's contents, stripped) wins over NAME."""
    path = env.str(f"{name}_FILE", default="")
    if path:
        return Path(path).read_text().strip()
    return env.str(name, default=default)


DEBUG = env.bool("DEBUG", default=False)
VAR_DIR = Path(env.str("RELAY_VAR_DIR", default=str(BASE_DIR / "var")))

SECRET_KEY = env_secret("SECRET_KEY", default="insecure-debug-only-secret-key" if DEBUG else None)
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) is required unless DEBUG is on.")


def _parse_peppers(value: str) -> dict[int, bytes]:
    """`1=old-pepper,2=new-pepper`: the highest id signs new tokens, the others still verify."""
    peppers: dict[int, bytes] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        pepper_id, sep, pepper = item.partition("=")
        if not sep or not pepper_id.isdigit() or len(pepper) < 32:
            raise ImproperlyConfigured(
                "TOKEN_PEPPERS is a comma-separated list of ID=PEPPER, each pepper 32+ characters."
            )
        peppers[int(pepper_id)] = pepper.encode()
    return peppers


TOKEN_PEPPERS = _parse_peppers(
    env_secret("TOKEN_PEPPERS", default="1=insecure-debug-only-pepper-0123456789" if DEBUG else "") or ""
)
if not TOKEN_PEPPERS:
    raise ImproperlyConfigured("TOKEN_PEPPERS (or TOKEN_PEPPERS_FILE) is required unless DEBUG is on.")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Production defaults are the safe ones; `make run` turns them off for plain-HTTP localhost.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
if env.bool("SECURE_PROXY_SSL_HEADER", default=False):
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The health check must answer plain HTTP from load balancers.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

INSTALLED_APPS = [
    # First: its templates/admin/ override the admin's own (a list's title).
    "relay",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "connections",
    "puppet_connection",
    "runs",
    "inventory",
    "triggers",
    "workflows",
    "stepruntime",
    "scriptsteps",
    "pages",
]

MIDDLEWARE = [
    "relay.middleware.ControlCharacterPathMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "relay.urls"
WSGI_APPLICATION = "relay.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": environ.Env.db_url_config(
        env_secret("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'relay.sqlite3'}")
    )
}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
# No health check (a SELECT 1 before every request's first query): a connection the
# database dropped fails that one request with a 503 problem (relay.api.problems), and
# Django replaces it before the next.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # `make run`'s default, shared by the web, engine and steps processes: a transaction that
    # read and then writes cannot take SQLite's write lock while another process holds it
    # ("database is locked" at once, not after the timeout: a step's credential was lost so).
    # IMMEDIATE takes the lock at BEGIN, and waits up to `timeout` seconds for it. WAL lets
    # readers and the one writer go on together: in the default rollback journal a commit
    # waits until no process reads, and a reader until no process commits, so a burst's reads
    # (the runs list, the engine's) held every write back (README "Configuration", figures).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Times to the second, saying their zone (relay/formats/en/formats.py).
FORMAT_MODULE_PATH = ["relay.formats"]

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Event bodies and their offloaded parts, content-addressed: see EVENTS_STORAGE below.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Where event bodies and offloaded parts live: "filesystem" (fsynced files under
# EVENTS_STORAGE_LOCATION) or "s3" (any S3-compatible store, through django-storages).
EVENTS_STORAGE = env.str("EVENTS_STORAGE", default="filesystem")
if EVENTS_STORAGE == "s3":
    STORAGES["events"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env.str("EVENTS_S3_BUCKET"),
            "endpoint_url": env.str("EVENTS_S3_ENDPOINT_URL", default="") or None,
            "region_name": env.str("EVENTS_S3_REGION", default="") or None,
            "access_key": env_secret("EVENTS_S3_ACCESS_KEY_ID", default="") or None,
            "secret_key": env_secret("EVENTS_S3_SECRET_ACCESS_KEY", default="") or None,
            "location": env.str("EVENTS_S3_PREFIX", default="relay-events"),
            "file_overwrite": True,  # same name, same content
            "default_acl": None,
        },
    }
elif EVENTS_STORAGE == "filesystem":
    STORAGES["events"] = {
        "BACKEND": "relay.storage.DurableFileSystemStorage",
        "OPTIONS": {
            "location": env.str("EVENTS_STORAGE_LOCATION", default=str(VAR_DIR / "events")),
            "allow_overwrite": True,  # same name, same content: a race between two saves is harmless
        },
    }
else:
    raise ImproperlyConfigured("EVENTS_STORAGE is filesystem or s3.")

# Never echo Authorization headers or token-bearing locals on error pages or in error mails.
DEFAULT_EXCEPTION_REPORTER_FILTER = "relay.reporting.RelayExceptionReporterFilter"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first so an anonymous API call gets 401 with WWW-Authenticate, not 403.
        "relay.api.authentication.UserTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "relay.api.renderers.ProblemJSONRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["relay.api.parsers.BoundedJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "relay.api.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "relay.api.problems.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Relay for Puppet",
    "DESCRIPTION": "Puppet connections, runs (/_puppet/runs) and push triggers (/api/events).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two choice sets are called `kind` (a trigger's, a step's): each its own enum by name.
    "ENUM_NAME_OVERRIDES": {
        "TriggerKindEnum": "triggers.models.TriggerKind",
        "StepKindEnum": "workflows.models.StepKind",
        # A run and its steps appear whole and as summaries (the runs list): one enum each.
        "StepRunStatusEnum": "workflows.models.StepStatus",
        "WorkflowRunStatusEnum": "workflows.models.RunStatus",
        "WorkflowRunOutcomeEnum": "workflows.models.RunOutcome",
        # A connection's setting and what its bridge reported share their choices.
        "PuppetPlatformEnum": "puppet_connection.models.Platform",
        "PuppetBackendEnum": "puppet_connection.models.Backend",
    },
}

# Vault (or OpenBao): where plain tokens live. See relay/vault.py and docs/production.md "Vault".
VAULT_ADDR = env.str("VAULT_ADDR", default="http://127.0.0.1:8200")
VAULT_TOKEN = env_secret("VAULT_TOKEN", default="")
VAULT_ROLE_ID = env.str("VAULT_ROLE_ID", default="")
VAULT_SECRET_ID = env_secret("VAULT_SECRET_ID", default="")
VAULT_APPROLE_MOUNT = env.str("VAULT_APPROLE_MOUNT", default="approle")
VAULT_MOUNT_POINT = env.str("VAULT_MOUNT_POINT", default="secret")
VAULT_PATH_PREFIX = env.str("VAULT_PATH_PREFIX", default="relay")
VAULT_CACERT = env.str("VAULT_CACERT", default="")
VAULT_NAMESPACE = env.str("VAULT_NAMESPACE", default="")
VAULT_TIMEOUT = env.float("VAULT_TIMEOUT", default=5.0)
# This deployment's name where deployments may share infrastructure (staging beside production):
# its Vault secrets are tagged with it, and the reconciler deletes only orphans so tagged;
# its broker keys are prefixed with it (below). Empty: the reconciler deletes nothing.
# `make run` generates one into var/deployment_id.
RELAY_DEPLOYMENT_ID = env.str("RELAY_DEPLOYMENT_ID", default="")
if RELAY_DEPLOYMENT_ID and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", RELAY_DEPLOYMENT_ID):
    raise ImproperlyConfigured("RELAY_DEPLOYMENT_ID is 1-64 letters, digits, '.', '_' or '-'.")

# Celery: no data depends on the broker (every task can be re-derived from the database),
# so `make run` may fall back to a filesystem transport when no Redis is reachable.
REDIS_URL = env_secret("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env_secret("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with its races closed (relay/fsqueue.py says which).
    CELERY_BROKER_TRANSPORT = "relay.fsqueue:Transport"
    _queue_dir = VAR_DIR / "celery-queue"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        # kombu puts the pidbox exchange files in ./control unless told otherwise.
        "control_folder": str(_queue_dir / "control"),
        # How long a worker that found its queues empty waits before it looks again (kombu's
        # default, 1 s, is a wait at every hop of a run when no Redis answers: a burst of 100
        # runs took minutes). A look lists one directory.
        "polling_interval": 0.1,
    }
elif RELAY_DEPLOYMENT_ID:
    # Every key (queues, unacked messages, bindings, control channels) under the deployment's
    # id: deployments sharing a Redis never take each other's tasks.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{RELAY_DEPLOYMENT_ID}:"}
CELERY_TASK_IGNORE_RESULT = True
# A request that queues work must not hang on a dead broker: give up fast; the periodic
# sweepers send what was not queued.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULE = {
    "expire-runs": {
        "task": "runs.tasks.expire_runs",
        "schedule": env.float("RUN_EXPIRY_INTERVAL", default=15.0),
    },
    "sweep-rollouts": {
        "task": "runs.tasks.sweep_rollouts",
        "schedule": env.float("ROLLOUT_SWEEP_INTERVAL", default=15.0),
    },
    "requeue-stuck-events": {
        "task": "triggers.tasks.requeue_stuck_events",
        "schedule": env.float("EVENTS_SWEEP_INTERVAL", default=60.0),
    },
    "purge-expired-events": {
        "task": "triggers.tasks.purge_expired_events",
        "schedule": env.float("EVENTS_SWEEP_INTERVAL", default=60.0),
    },
    "delete-released-objects": {
        "task": "triggers.tasks.delete_released_objects",
        "schedule": env.float("EVENTS_SWEEP_INTERVAL", default=60.0),
    },
    "start-due-schedules": {
        "task": "workflows.tasks.start_due_schedules",
        "schedule": env.float("SCHEDULE_TICK_INTERVAL", default=5.0),
        # A tick that waited longer than the next is worth nothing: the next one does its work.
        "options": {"expires": env.float("SCHEDULE_TICK_INTERVAL", default=5.0)},
    },
    "sweep-workflow-runs": {
        "task": "workflows.tasks.sweep_workflow_runs",
        "schedule": env.float("WORKFLOW_SWEEP_INTERVAL", default=15.0),
    },
    "reconcile-vault-secrets": {
        "task": "relay.tasks.reconcile_vault_secrets",
        "schedule": env.float("VAULT_RECONCILE_INTERVAL", default=300.0),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Every node runs a beat (`worker --beat`, the Procfile); one is active. celery-redbeat keeps
# the schedule in Redis, and the active beat holds a lock there that it extends at each tick
# (at least every BEAT_MAX_LOOP_INTERVAL seconds) to BEAT_LOCK_TIMEOUT seconds; the others try
# to take it every BEAT_MAX_LOOP_INTERVAL seconds. So the periodic work goes on within
# BEAT_LOCK_TIMEOUT + BEAT_MAX_LOOP_INTERVAL seconds of the death of the node that ran it
# (at once after a clean stop, which releases the lock). relay.beat keeps a beat that lost its
# lock (Redis unreachable for longer than that) waiting for it rather than exiting.
# `make run` without Redis (the filesystem broker): Celery's file scheduler, one machine.
BEAT_LOCK_TIMEOUT = env.int("BEAT_LOCK_TIMEOUT", default=30)
CELERY_BEAT_MAX_LOOP_INTERVAL = env.float("BEAT_MAX_LOOP_INTERVAL", default=5.0)
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"
else:
    CELERY_BEAT_SCHEDULER = "relay.beat:Scheduler"
    CELERY_REDBEAT_REDIS_URL = REDIS_URL
    CELERY_REDBEAT_REDIS_OPTIONS: dict = {}
    # Deployments sharing a Redis have a schedule and a lock each.
    CELERY_REDBEAT_KEY_PREFIX = f"{RELAY_DEPLOYMENT_ID or 'relay'}:redbeat:"
    CELERY_REDBEAT_LOCK_TIMEOUT = BEAT_LOCK_TIMEOUT

# Runs (/_puppet/runs). Times in seconds.
RUN_MAX_HEARTBEAT_INTERVAL = env.int("RUN_MAX_HEARTBEAT_INTERVAL", default=3600)
RUN_HEARTBEAT_GRACE = env.int("RUN_HEARTBEAT_GRACE", default=60)
RUN_ACCEPTED_TIMEOUT = env.int("RUN_ACCEPTED_TIMEOUT", default=300)
# An accepted run not started whose bridge has said nothing this long is listed `pending` again
# to the shipped Ruby agent, which takes it back when restarted (runs.models.offered). Twice
# the agent's own promise (3 x 15 s), so a live agent is never offered a run it is starting.
RUN_REOFFER_AFTER = env.int("RUN_REOFFER_AFTER", default=90)
RUN_PENDING_TIMEOUT = env.int("RUN_PENDING_TIMEOUT", default=3600)
RUN_MAX_NODES = env.int("RUN_MAX_NODES", default=10000)
ROLLOUT_MAX_PAUSE = env.int("ROLLOUT_MAX_PAUSE", default=24 * 3600)  # seconds between batches, at most
RUN_RESULTS_MAX_BYTES = env.int("RUN_RESULTS_MAX_BYTES", default=1024 * 1024)  # larger: stored
# A state PUT carries a whole fleet's results: its body may be larger than other requests'.
RUN_STATE_MAX_BODY_BYTES = env.int("RUN_STATE_MAX_BODY_BYTES", default=64 * 1024 * 1024)
RUN_LONG_POLL_MAX = 60
# Long-polls one connection may hold waiting in one web process; more answer at once. Per
# process: a deployment holds at most this times its web processes (WEB_CONCURRENCY times the nodes).
RUN_LONG_POLL_MAX_WAITERS = env.int("RUN_LONG_POLL_MAX_WAITERS", default=4)
# Threads of each web process for Django's synchronous code (relay.django_asgi).
WEB_THREADS = env.int("WEB_THREADS", default=16)
# Connections of each web process's asynchronous pool (relay.adb: long-poll, heartbeats).
WEB_ASYNC_DB_CONNECTIONS = env.int("WEB_ASYNC_DB_CONNECTIONS", default=4)
RUNS_NOTIFY_CHANNEL = "relay_runs"
# A workflow run's status, or one of its steps', changed (workflows.models.notify_run_changed):
# open run pages waiting on it (pages.live) look again.
WORKFLOW_RUNS_NOTIFY_CHANNEL = "relay_workflow_runs"
# Seconds an open run page's request waits for a change before it is answered "unchanged"
# (204) and asks again; and how many may wait at once in one web process (more are answered
# at once, and ask again a second later).
PAGES_LIVE_WAIT = env.int("PAGES_LIVE_WAIT", default=25)
PAGES_LIVE_MAX_WAITERS = env.int("PAGES_LIVE_MAX_WAITERS", default=2000)
# Seconds an open run page's ticket stands for its session and permissions (pages.versions):
# the loop sends it changes without asking Django; a permission taken away shows that late.
PAGES_LIVE_TICKET_AGE = env.int("PAGES_LIVE_TICKET_AGE", default=300)
# Largest JSON request body any API view parses; larger is a 413 before it is read.
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=2 * 1024 * 1024)

# The fleet inventory a bridge sends from PuppetDB (/_puppet/inventory). Sizes in bytes, times
# in seconds. A page over either bound is refused (413, 400): the bridge sends smaller ones.
INVENTORY_PAGE_MAX_BYTES = env.int("INVENTORY_PAGE_MAX_BYTES", default=2 * 1024 * 1024)
INVENTORY_PAGE_MAX_NODES = env.int("INVENTORY_PAGE_MAX_NODES", default=1000)
INVENTORY_FACTS_MAX = env.int("INVENTORY_FACTS_MAX", default=50)  # paths in an allow-list
INVENTORY_FACT_MAX_BYTES = env.int("INVENTORY_FACT_MAX_BYTES", default=4096)  # one fact's value
# A node whose last report is older is `stale` (PE's console calls it unresponsive after an hour).
INVENTORY_STALE_AFTER = env.int("INVENTORY_STALE_AFTER", default=3600)
# A sync that sent no page for this long is taken as dead: another may start.
INVENTORY_SYNC_IDLE = env.int("INVENTORY_SYNC_IDLE", default=120)
# A query scope's preview: the bridge's answer is used this long, then asked again.
INVENTORY_QUERY_FRESH = env.int("INVENTORY_QUERY_FRESH", default=300)
INVENTORY_QUERIES_WAITING = 20  # listed to the bridge at a time
# A full sync at least this often: it also drops the nodes PuppetDB purged.
INVENTORY_FULL_SYNC_EVERY = env.int("INVENTORY_FULL_SYNC_EVERY", default=24 * 3600)

# Push triggers (/api/events). Sizes in bytes.
EVENTS_MAX_BODY_BYTES = env.int("EVENTS_MAX_BODY_BYTES", default=32 * 1024 * 1024)
EVENTS_MAX_DECOMPRESSED_BYTES = env.int("EVENTS_MAX_DECOMPRESSED_BYTES", default=32 * 1024 * 1024)
EVENTS_MAX_GZIP_RATIO = env.int("EVENTS_MAX_GZIP_RATIO", default=100)
# What reading one report (a child process of the worker) may take: memory beyond the
# worker's own, and seconds. More ends the event `failed`; the worker is not touched. A
# report costs the reference reader about 30 times its size (the fast path 11-17; docs/performance.md),
# so by default the largest body the door takes can be read.
EVENTS_READ_MEMORY_BYTES = env.int("EVENTS_READ_MEMORY_BYTES", default=40 * EVENTS_MAX_DECOMPRESSED_BYTES)
EVENTS_READ_TIMEOUT = env.float("EVENTS_READ_TIMEOUT", default=60.0)
# Attempts at reading an event (a worker lost mid-read counts) before it ends `failed`.
EVENTS_MAX_ATTEMPTS = env.int("EVENTS_MAX_ATTEMPTS", default=5)
EVENTS_STUCK_AFTER = env.int("EVENTS_STUCK_AFTER", default=120)  # seconds in `received`
# Events older than this many days are deleted with their stored objects; 0 keeps them forever.
EVENTS_RETENTION_DAYS = env.int("EVENTS_RETENTION_DAYS", default=30)
# Per-trigger budgets on POST /api/events, over which it answers 429 (0 turns one off). Sized
# in docs/push-triggers.md "Push triggers": 5,000 agents reporting every 30 minutes fit with room to spare.
EVENTS_RATE_LIMIT_PER_MINUTE = env.int("EVENTS_RATE_LIMIT_PER_MINUTE", default=600)
EVENTS_RATE_LIMIT_BYTES_PER_HOUR = env.int("EVENTS_RATE_LIMIT_BYTES_PER_HOUR", default=8 * 1024**3)
if EVENTS_STUCK_AFTER <= EVENTS_READ_TIMEOUT:
    # The sweeper would send again an event that is still being read.
    raise ImproperlyConfigured("EVENTS_STUCK_AFTER must be longer than EVENTS_READ_TIMEOUT.")
# Webhook triggers (/api/webhooks/<id>/): a body is the event as it is, so it is kept to what
# a run's event data may be (triggers.reports.EVENT_DATA_MAX_BYTES, 1 MiB) or less.
WEBHOOK_MAX_BODY_BYTES = min(env.int("WEBHOOK_MAX_BODY_BYTES", default=1024 * 1024), 1024 * 1024)
# Webhook trigger images that pass the request's JSON body through as the event, unchanged
# (Relay's own generic JSON trigger): the only ones this service stands in for, since it runs
# no containers. Add your own pass-through images here (any tag or digest of one counts).
WEBHOOK_PASS_THROUGH_IMAGES = env.list("WEBHOOK_PASS_THROUGH_IMAGES", default=["relaysh/stdlib-trigger-json"])
# Schedule triggers: how often beat looks for schedules that are due (seconds): a run starts
# at most this late. Each look reads only the due rows, by an index.
SCHEDULE_TICK_INTERVAL = env.float("SCHEDULE_TICK_INTERVAL", default=5.0)
# Where users reach this service, for links in notifications, webhook URLs and a Puppet
# connection's relayAPIURL: by default where `make run` listens (PORT).
RELAY_PUBLIC_URL = env.str(
    "RELAY_PUBLIC_URL", default=f"http://127.0.0.1:{env.int('PORT', default=8000)}"
).rstrip("/")
SLACK_TIMEOUT = env.float("SLACK_TIMEOUT", default=10.0)
# Hosts a Slack webhook URL may name (https only). The connection is refused anyway when the
# name resolves to a loopback, private, link-local, multicast or reserved address.
SLACK_WEBHOOK_HOSTS = [
    host.strip().lower().rstrip(".")
    for host in env.list("SLACK_WEBHOOK_HOSTS", default=["hooks.slack.com"])
    if host.strip()
]
# For tests only, and deliberately not read from the environment, so that no deployment can
# turn them on by accident: tests/test_events_slack.py lets the Slack stand-in on loopback be
# reached, with a CA of its own. None is the system's CAs.
SLACK_WEBHOOK_ALLOW_LOOPBACK = False
SLACK_CA_BUNDLE: str | None = None
# Slack's Web API, where the relaysh/slack-step-message-send step posts (https only; public
# addresses only, as for webhooks). SLACK_API_ALLOW_LOOPBACK is for tests, like the above.
SLACK_API_URL = env.str("SLACK_API_URL", default="https://slack.com/api").rstrip("/")
SLACK_API_ALLOW_LOOPBACK = False

# Workflows (workflows/engine.py). Times in seconds.
APPROVAL_TIMEOUT = env.int("APPROVAL_TIMEOUT", default=3600)  # then the approval fails the run
# How long a process keeps a workflow secret's value it read from Vault (0: not at all).
# Exact whatever it is: a replaced value is never served (WorkflowSecret.value_of).
SECRET_CACHE_SECONDS = env.float("SECRET_CACHE_SECONDS", default=30.0)
# How long a worker may hold a step while starting or checking it; past it, the sweeper
# gives the step to another worker (its own was killed). Longer than any step's start.
WORKFLOW_STEP_LEASE = env.int("WORKFLOW_STEP_LEASE", default=300)
WORKFLOW_STEP_MAX_ATTEMPTS = env.int("WORKFLOW_STEP_MAX_ATTEMPTS", default=5)
WORKFLOW_STUCK_AFTER = env.int("WORKFLOW_STUCK_AFTER", default=60)  # idle runs the sweeper looks at
# A worker that ends a step which makes exactly one other ready starts that one itself, without
# a trip through the broker, for up to this many seconds of its task (0: never).
WORKFLOW_INLINE_SECONDS = env.float("WORKFLOW_INLINE_SECONDS", default=1.0)
# Budgets (docs/security.md "Budgets"), each checked as it is spent. A run started by a step (the step
# runtime's POST /workflows/{name}/run) is one deeper than the step's run; deeper than
# RUN_MAX_DEPTH is refused. One owner's runs not yet complete, at most RUN_MAX_IN_PROGRESS:
# the API and the step runtime answer 429 past it, a trigger's run fails at once saying so.
RUN_MAX_DEPTH = env.int("RUN_MAX_DEPTH", default=3)
RUN_MAX_IN_PROGRESS = env.int("RUN_MAX_IN_PROGRESS", default=100)
# Schedule triggers: per workflow document, and per owner across all their workflows (a
# revision over either is a 400 at the trigger); a tick starts at most
# SCHEDULES_PER_OWNER_PER_TICK runs of one owner, the owners taking turns.
SCHEDULES_PER_WORKFLOW = env.int("SCHEDULES_PER_WORKFLOW", default=20)
SCHEDULES_PER_OWNER = env.int("SCHEDULES_PER_OWNER", default=100)
SCHEDULES_PER_TICK = env.int("SCHEDULES_PER_TICK", default=200)
SCHEDULES_PER_OWNER_PER_TICK = env.int("SCHEDULES_PER_OWNER_PER_TICK", default=10)
# What one step may send the step runtime API: its outputs together (as stored), its runtime
# logs (POST /logs and their messages: records and bytes), its emitted events (count and
# bytes of their JSON), its UI decorators together. 413 past a size, 429 past a count.
STEP_OUTPUTS_MAX_BYTES = env.int("STEP_OUTPUTS_MAX_BYTES", default=4 * 1024 * 1024)
STEP_LOG_MAX_RECORDS = env.int("STEP_LOG_MAX_RECORDS", default=10_000)
STEP_LOG_MAX_BYTES = env.int("STEP_LOG_MAX_BYTES", default=4 * 1024 * 1024)
STEP_EVENTS_MAX = env.int("STEP_EVENTS_MAX", default=100)
STEP_EVENTS_MAX_BYTES = env.int("STEP_EVENTS_MAX_BYTES", default=4 * 1024 * 1024)
STEP_DECORATORS_MAX_BYTES = env.int("STEP_DECORATORS_MAX_BYTES", default=64 * 1024)
# What a step says of its outputs (PUT /outputs/{name}/metadata, before or after the value:
# any name, so without a budget its count would have none).
STEP_OUTPUT_METADATA_MAX_BYTES = env.int("STEP_OUTPUT_METADATA_MAX_BYTES", default=256 * 1024)
# Parsed workflow documents each process keeps (workflows.engine.parsed), weighed by what
# each holds in memory (1 to 12 times the document's text; docs/security.md "Budgets").
PARSED_CACHE_MAX_BYTES = env.int("PARSED_CACHE_MAX_BYTES", default=64 * 1024 * 1024)
# The internal do-nothing step image (workflows/steps/noop.py), for tests and the bench only.
# The step runtime API's base URL as a running step reaches it (the service itself, at the URL
# root); a step's METADATA_API_URL is this with the step's credential as its user part.
STEP_RUNTIME_URL = env.str(
    "STEP_RUNTIME_URL", default=f"http://127.0.0.1:{env.int('PORT', default=8000)}"
).rstrip("/")
WORKFLOW_NOOP_STEPS = env.bool("WORKFLOW_NOOP_STEPS", default=False)
# What one evaluation of an expression (a step's spec, env or `when`, a trigger's `when` or
# binding, a /spec query) may spend (workflows/dialect/budget.py): steps (nodes, calls, items
# walked), characters built in all, and the longest value. Over it, the evaluation fails:
# a 400 at validate/save, a step that fails, a 422 from the step runtime API. The dry runs
# of one document's constant expressions share EXPRESSION_VALIDATE_MAX_*.
EXPRESSION_MAX_STEPS = env.int("EXPRESSION_MAX_STEPS", default=500_000)
EXPRESSION_MAX_CHARS = env.int("EXPRESSION_MAX_CHARS", default=64 * 1024 * 1024)
EXPRESSION_MAX_VALUE_CHARS = env.int("EXPRESSION_MAX_VALUE_CHARS", default=4 * 1024 * 1024)
EXPRESSION_VALIDATE_MAX_STEPS = env.int("EXPRESSION_VALIDATE_MAX_STEPS", default=200_000)
EXPRESSION_VALIDATE_MAX_CHARS = env.int("EXPRESSION_VALIDATE_MAX_CHARS", default=16 * 1024 * 1024)

# Script steps (scriptsteps/, docs/script-steps.md "Script steps"): `relaysh/core` steps run in bubblewrap on
# the Celery queue `steps`. Limits are per step; times in seconds, sizes in bytes.
STEP_WALL_TIME = env.int("STEP_WALL_TIME", default=600)
STEP_CPU_SECONDS = env.int("STEP_CPU_SECONDS", default=300)
STEP_MEMORY_BYTES = env.int("STEP_MEMORY_BYTES", default=512 * 1024 * 1024)
STEP_MAX_PROCESSES = env.int("STEP_MAX_PROCESSES", default=256)
STEP_OUTPUT_BYTES = env.int("STEP_OUTPUT_BYTES", default=1024 * 1024)  # then the step is killed
STEP_WORK_DIR_BYTES = env.int("STEP_WORK_DIR_BYTES", default=256 * 1024 * 1024)  # /work and /tmp each
# Every sandbox has a network namespace of its own (scriptsteps/network.py): it reaches the
# runtime API through its worker, and with STEP_NETWORK, public HTTP(S) through the worker's
# proxy; STEP_PROXY_ALLOW, when set, the only destinations it may ask for ("host",
# "*.example.com", "host:443", "*:443"). Each step holds at most STEP_NET_CONNECTIONS
# connections at once; one idle for STEP_NET_IDLE_SECONDS is closed.
STEP_NETWORK = env.bool("STEP_NETWORK", default=True)
STEP_PROXY_ALLOW = env.list("STEP_PROXY_ALLOW", default=[])
STEP_NET_CONNECTIONS = env.int("STEP_NET_CONNECTIONS", default=32)
STEP_NET_IDLE_SECONDS = env.float("STEP_NET_IDLE_SECONDS", default=120.0)
# Tests only, never in production: loopback destinations on these ports pass the proxy's check
# (the tests' stand-in servers listen on loopback).
STEP_PROXY_TEST_LOOPBACK_PORTS = env.list("STEP_PROXY_TEST_LOOPBACK_PORTS", cast=int, default=[])
# Per-step cgroups (pids, memory, cpuacct; cgroup v1) when the worker may make them: "auto",
# "true" (refuse to run steps without them) or "false" (rlimits on the sandbox's uid only).
STEP_CGROUPS = env.str("STEP_CGROUPS", default="auto")
STEP_CGROUP_PARENT = env.str("STEP_CGROUP_PARENT", default="relay-steps")
# A worker running as root runs each sandbox as a uid of its own from STEP_SANDBOX_UID to
# STEP_SANDBOX_UID + STEP_SANDBOX_UIDS - 1 (used by nothing else), group STEP_SANDBOX_GID; a
# file per uid under STEP_SANDBOX_UID_LOCKS says which are taken (shared by the machine's workers).
STEP_SANDBOX_UID = env.int("STEP_SANDBOX_UID", default=61000)
STEP_SANDBOX_UIDS = env.int("STEP_SANDBOX_UIDS", default=256)
STEP_SANDBOX_GID = env.int("STEP_SANDBOX_GID", default=61000)
STEP_SANDBOX_UID_LOCKS = env.str("STEP_SANDBOX_UID_LOCKS", default="/run/relay-step-uids")
STEP_BWRAP = env.str("STEP_BWRAP", default="/usr/bin/bwrap")
# relay_sdk and its dependencies for `relaysh/core:latest-python` (the Makefile builds it).
# `ni`, the step runtime's command-line client (stepruntime/), at /usr/local/bin/ni in every sandbox.
STEP_NI = Path(env.str("STEP_NI", default=str(BASE_DIR / "stepruntime" / "bin" / "ni")))
STEP_PYTHON_DIR = Path(env.str("STEP_PYTHON_DIR", default=str(BASE_DIR / ".step-python")))
# Where a sandbox's mounts are prepared (copies of STEP_NI and STEP_PYTHON_DIR, the generated
# /etc, each step's network directory): a directory every sandbox uid can reach, wherever the
# checkout is (scriptsteps/mounts.py). Under root, /run; otherwise the system's temporary
# directory, one per user.
STEP_MOUNT_DIR = Path(
    env.str(
        "STEP_MOUNT_DIR",
        default="/run/relay-step-mounts"
        if os.geteuid() == 0
        else os.path.join(tempfile.gettempdir(), f"relay-step-mounts-{os.geteuid()}"),
    )
)
STEP_HEARTBEAT = env.float("STEP_HEARTBEAT", default=5.0)
# A script whose worker has not been heard of for this long ended with it (the worker died).
STEP_LOST_AFTER = env.int("STEP_LOST_AFTER", default=60)
# A script no worker of the `steps` queue took within this long fails (none is running).
STEP_QUEUE_TIMEOUT = env.int("STEP_QUEUE_TIMEOUT", default=900)
# Other images: "podman" or "docker" runs them in a container; empty: they fail, saying so.
STEP_CONTAINER_RUNTIME = env.str("STEP_CONTAINER_RUNTIME", default="")
STEP_CONTAINER_SCRIPTS = Path(env.str("STEP_CONTAINER_SCRIPTS", default=str(VAR_DIR / "step-scripts")))
CELERY_TASK_ROUTES = {"scriptsteps.tasks.*": {"queue": "steps"}}

# How often "last used" may be written for one token.
TOKEN_LAST_USED_RESOLUTION = 60

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
