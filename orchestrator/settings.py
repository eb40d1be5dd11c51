"""Django settings for Stepwise.

Two ways to run, one code path:
- embedded default (nothing configured): SQLite under var/ (WAL, busy timeout, IMMEDIATE
  transactions) and Kombu's filesystem transport, so no server is needed;
- production: DATABASE_URL (PostgreSQL via psycopg 3), CELERY_BROKER_URL and REDIS_URL.

Security follows STEPWISE_ENV (orchestrator/operations/deployment.py, docs/security.md): DEBUG is
off unless turned on; in development the secrets are generated into var/secrets/ once and
reused; with STEPWISE_ENV=production nothing is generated and an insecure value refuses to
start.
"""
import json
import os
from pathlib import Path

import dj_database_url
import yaml
from django.core.exceptions import ImproperlyConfigured

from .operations import deployment

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("STEPWISE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
# Under pytest-xdist each test worker (and the Celery workers it starts, which inherit this
# variable) gets its own broker folder / Redis database, so parallel tests never share queues.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
XDIST_INDEX = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else -1
# The same for every file under var/ that processes share (the cache holding rate limits and
# breakers, the example tools' outbox): one per test worker, so parallel tests never count
# each other's e-mails or trip each other's breakers.
XDIST_SUFFIX = f"-{XDIST_WORKER}" if XDIST_WORKER else ""


def _isolated_redis(url: str) -> str:
    if not url.startswith("redis") or XDIST_INDEX < 0:
        return url
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    return f"{base}/{1 + XDIST_INDEX % 15}"


# --- deployment and security (docs/security.md) ---------------------------------------------
STEPWISE_ENV = deployment.environment()
PRODUCTION = STEPWISE_ENV == deployment.PRODUCTION
SECRETS_DIR = VAR_DIR / "secrets"

DEBUG = deployment.env_bool("DJANGO_DEBUG", False)
# Development generates its own secrets once (var/secrets/) instead of sharing a known one.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "") or (
    "" if PRODUCTION else deployment.local_secret(SECRETS_DIR / "django-secret-key"))
# Old keys still accepted for signatures (sessions, password resets) while rotating.
SECRET_KEY_FALLBACKS = deployment.env_list("DJANGO_SECRET_KEY_FALLBACKS")
ALLOWED_HOSTS = deployment.env_list(
    "DJANGO_ALLOWED_HOSTS", "" if PRODUCTION else ",".join(deployment.DEVELOPMENT_HOSTS))
CSRF_TRUSTED_ORIGINS = deployment.env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
# Key of the keyed hashes that stand in for redacted values in the audit ledger: its own
# secret, never derived from SECRET_KEY (docs/security.md#keys-and-rotation).
AUDIT_REDACTION_KEY = os.environ.get("AUDIT_REDACTION_KEY", "") or (
    "" if PRODUCTION else deployment.local_secret(SECRETS_DIR / "audit-redaction-key"))
# Key that encrypts webhook secrets at rest (triggers/sealing.py): its own secret too. Old keys
# still open secrets sealed before a rotation (`manage.py stepwise_reseal_triggers`).
STEPWISE_TRIGGER_KEY = os.environ.get("STEPWISE_TRIGGER_KEY", "") or (
    "" if PRODUCTION else deployment.local_secret(SECRETS_DIR / "trigger-key"))
STEPWISE_TRIGGER_KEY_FALLBACKS = deployment.env_list("STEPWISE_TRIGGER_KEY_FALLBACKS")

if PRODUCTION:
    deployment.require_production(
        debug=DEBUG, secret_key=SECRET_KEY, secret_key_fallbacks=SECRET_KEY_FALLBACKS,
        allowed_hosts=ALLOWED_HOSTS, redaction_key=AUDIT_REDACTION_KEY,
        trigger_key=STEPWISE_TRIGGER_KEY)
    # HTTPS only. Behind a proxy that terminates TLS, name the header it sets
    # (DJANGO_SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO) so Django knows the request was https.
    SECURE_SSL_REDIRECT = deployment.env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    # Probes talk plain HTTP inside the deployment; liveness says nothing but "ok".
    SECURE_REDIRECT_EXEMPT = [r"^api/v1/health/$", r"^api/v1/health/ready/$"]
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = deployment.env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = deployment.env_bool("DJANGO_SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    if os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER"):
        SECURE_PROXY_SSL_HEADER = (os.environ["DJANGO_SECURE_PROXY_SSL_HEADER"], "https")

INSTALLED_APPS = [
    # Django's admin with Stepwise's site: reviewers who are not staff may sign in to decide
    # (orchestrator/web/admin_site.py).
    "orchestrator.apps.StepwiseAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served from here, never a CDN
    "django_celery_beat",
    "django_celery_results",
    "channels",
    "orchestrator",
    "approvals",
    "audit",
    "budgets",
    "triggers",
    "notifications",
    "alerts",
    "evaluation",
    "retention",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "orchestrator.web.csp.ContentSecurityPolicyMiddleware",
    # Trace id (and run id) on every line a request logs; a span per request when tracing is on.
    "orchestrator.web.requestlog.RequestContextMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: every middleware above runs in the request's thread (orchestrator/web/onethread.py).
    "orchestrator.web.onethread.OneThreadPerRequest",
]

# Every response's Content-Security-Policy (orchestrator/web/csp.py): scripts from this server's own
# files only; websockets to this origin ('self'); ReDoc's search runs in a blob: worker.
STEPWISE_CSP = os.environ.get("STEPWISE_CSP", "; ".join([
    "default-src 'self'", "script-src 'self'", "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'",
    "worker-src 'self' blob:", "object-src 'none'", "base-uri 'self'", "form-action 'self'",
    "frame-ancestors 'none'"]))

ROOT_URLCONF = "orchestrator.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = None
ASGI_APPLICATION = "orchestrator.asgi.application"

# --- database -----------------------------------------------------------------------------
# How services read and write the engine's rows (orchestrator/store/, docs/architecture.md):
# "fast" (statements compiled once; on PostgreSQL, held writes sent together and with the
# COMMIT) or "reference" (Django's public ORM API only). Fast on both databases: its compiled
# statements serve the embedded SQLite path too.
STEPWISE_STORE = os.environ.get("STEPWISE_STORE", "fast").strip().lower()
if STEPWISE_STORE not in ("fast", "reference"):
    raise ImproperlyConfigured(f"STEPWISE_STORE must be fast or reference, not {STEPWISE_STORE!r}")
# The fast store's own switches (docs/operations.md#database-connections).
# PIPELINE: on PostgreSQL a service's held writes go in one round trip (psycopg's pipeline
# mode); off, each write waits for its answer. PREPARE_AFTER: psycopg prepares a statement on
# the server after it has run this many times on a connection, and values travel apart from
# the statement (server-side binding); "off" sends every statement as text with its values
# inlined, for a pooler that cannot keep prepared statements (PgBouncer in transaction mode
# before 1.21).
STEPWISE_FAST_STORE = {
    "PIPELINE": deployment.env_bool("STEPWISE_DB_PIPELINE", True),
    "PREPARE_AFTER": os.environ.get("STEPWISE_DB_PREPARE_AFTER", "5").strip().lower(),
}
if STEPWISE_FAST_STORE["PREPARE_AFTER"] != "off" and not STEPWISE_FAST_STORE["PREPARE_AFTER"].isdigit():
    raise ImproperlyConfigured("STEPWISE_DB_PREPARE_AFTER must be a number of runs (0 or "
                               f"more) or off, not {STEPWISE_FAST_STORE['PREPARE_AFTER']!r}")
DB_POOL_MAX = int(os.environ.get("STEPWISE_DB_POOL", "0"))
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(
        os.environ["DATABASE_URL"], conn_health_checks=True,
        conn_max_age=int(os.environ.get("STEPWISE_DB_CONN_MAX_AGE_S", "60")))}
    DATABASES["default"].setdefault("TEST", {})
    POSTGRESQL = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    if POSTGRESQL and STEPWISE_STORE == "fast":
        # Django's, sending the fast store's held writes before its own statements and with
        # the COMMIT (orchestrator/store/fast/postgresql).
        DATABASES["default"]["ENGINE"] = "orchestrator.store.fast.postgresql"
        if STEPWISE_FAST_STORE["PREPARE_AFTER"] != "off":
            DATABASES["default"].setdefault("OPTIONS", {}).update(
                server_side_binding=True, prepare_threshold=int(STEPWISE_FAST_STORE["PREPARE_AFTER"]))
    # The web server's PostgreSQL connection pool (docs/benchmark.md#the-api-under-load). Under
    # ASGI every request runs in a thread of its own, so a persistent connection never outlives
    # its request: without a pool each request opened a connection (a backend fork and its
    # authentication). `orchestrator/asgi.py` turns it on for the web process only;
    # workers keep one persistent connection per process (CELERY_DB_REUSE_MAX below).
    if DB_POOL_MAX > 0 and POSTGRESQL:
        # CONN_HEALTH_CHECKS (on) makes Django give the pool a check: a connection is tested as
        # it is handed out, so after a database restart the pool replaces its dead connections
        # instead of failing a request on each.
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, DB_POOL_MAX), "max_size": DB_POOL_MAX,
            # A request waits this long for a free connection, then fails (a 500 and a log
            # line) rather than queueing without bound behind a stuck database.
            "timeout": float(os.environ.get("STEPWISE_DB_POOL_TIMEOUT_S", "10")),
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("STEPWISE_SQLITE_PATH", str(VAR_DIR / "stepwise.sqlite3")),
            # Workers are separate processes: a file database, WAL so readers never block the
            # writer, IMMEDIATE so a transaction takes the write lock up front instead of
            # failing on upgrade, and a generous busy timeout instead of "database is locked".
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            # Integration tests run real worker processes, which need a file they can open.
            "TEST": {"NAME": str(VAR_DIR / "test_stepwise.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]

# --- Redis / channels -----------------------------------------------------------------------
REDIS_URL = _isolated_redis(os.environ.get("REDIS_URL", ""))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The live pages' outbox relay (orchestrator/web/live/relay.py, docs/live.md): how often it reads
# the outbox when nothing woke it. On PostgreSQL a NOTIFY wakes it at each commit, so polling
# is only a backstop; SQLite has no NOTIFY, so there it polls often (one indexed query).
STEPWISE_RELAY_POLL_S = float(os.environ.get("STEPWISE_RELAY_POLL_S",
                                             "0.25" if not os.environ.get("DATABASE_URL") else "2"))
# Whether a websocket starts this process's outbox relay (on by default; a test of the consumers
# alone, on an event loop of its own that closes after each call, turns it off).
STEPWISE_LIVE_RELAY = os.environ.get("STEPWISE_LIVE_RELAY", "1") != "0"
# Long-polls of the run API (`wait_for_change`) one person may hold at once in one web process:
# each holds a server thread while it waits; one more is answered 429.
STEPWISE_LONG_POLLS_PER_PERSON = int(os.environ.get("STEPWISE_LONG_POLLS_PER_PERSON", "4"))

# Shared counters for rate limits and circuit breakers: every worker must see the same ones.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "orchestrator.operations.redis_cache.SharedClientRedisCache",
                          "LOCATION": REDIS_URL, "KEY_PREFIX": "stepwise"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                          "LOCATION": str(VAR_DIR / f"cache{XDIST_SUFFIX}")}}

# --- Celery ---------------------------------------------------------------------------------
BROKER_DIR = VAR_DIR / f"broker{XDIST_SUFFIX}"
CELERY_BROKER_URL = _isolated_redis(os.environ.get("CELERY_BROKER_URL", "stepwisefs://"))
if XDIST_INDEX >= 0 and os.environ.get("CELERY_BROKER_URL"):
    # Celery prefers the CELERY_BROKER_URL environment variable to this setting; under xdist
    # it must name the isolated database too, or parallel test workers share their queues.
    os.environ["CELERY_BROKER_URL"] = CELERY_BROKER_URL
if CELERY_BROKER_URL.startswith(("filesystem://", "stepwisefs://")):
    for sub in ("queue", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        # The virtual transport polls; 1 s (its default) would dominate step latency.
        "polling_interval": 0.01,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("redis://"):
    # Survives a broker restart (orchestrator/operations/broker.py).
    CELERY_BROKER_TRANSPORT = "orchestrator.operations.broker:RedisTransport"
CELERY_RESULT_BACKEND = os.environ.get(
    "CELERY_RESULT_BACKEND", REDIS_URL if REDIS_URL else "django-db"
)
CELERY_RESULT_EXTENDED = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A message may be a replay: ack after the work, give it back if the worker dies, and take
# one message at a time so a dying worker strands nothing but the step it was running.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "orchestrator"
# Celery's Django fixup closes the database connection around every task unless told to
# reuse it: a new PostgreSQL connection per step would sit on every step's critical path.
CELERY_DB_REUSE_MAX = int(os.environ.get("CELERY_DB_REUSE_MAX", "1000"))
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
# The database scheduler, sending only while its process holds the beat leader lease, so
# several beats may run (orchestrator/beat.py); a follower takes over within the lease.
CELERY_BEAT_SCHEDULER = "orchestrator.beat:LeaderScheduler"
STEPWISE_BEAT_LEASE_S = float(os.environ.get("STEPWISE_BEAT_LEASE_S", "10"))
CELERY_BEAT_SCHEDULE = {
    "stepwise-reap": {
        "task": "orchestrator.tasks.reap",
        "schedule": float(os.environ.get("STEPWISE_REAP_INTERVAL_S", "2")),
        "options": {"queue": "orchestrator", "expires": 10},
    },
    # Firings held back by a trigger's rate or its team's cap start when they may
    # (triggers/services/firing.py, docs/triggers.md#admission-control).
    "stepwise-trigger-admit": {
        "task": "triggers.tasks.admit_queued",
        "schedule": float(os.environ.get("STEPWISE_TRIGGER_ADMIT_INTERVAL_S", "2")),
        "options": {"queue": "orchestrator", "expires": 10},
    },
    # Webhook posts refused before they were authenticated: one ledger entry per trigger and
    # minute, with the count (triggers/services/webhooks.py).
    "stepwise-trigger-refusals": {
        "task": "triggers.tasks.record_refusals",
        "schedule": 20.0,
        "options": {"queue": "orchestrator", "expires": 60},
    },
    # Alerts (alerts/, docs/operations.md#alerts): the outbox since the last scan, then the
    # conditions only the clock shows (stuck runs, deadlines, queue age).
    "stepwise-alerts": {
        "task": "alerts.tasks.scan",
        "schedule": float(os.environ.get("STEPWISE_ALERTS_INTERVAL_S", "10")),
        "options": {"queue": "orchestrator", "expires": 30},
    },
    # Evaluations (evaluation/evaluations.py) advance when one of their runs ends; this sweep is
    # the backstop for a message lost on the way.
    "stepwise-evaluations": {
        "task": "evaluation.tasks.sweep",
        "schedule": float(os.environ.get("STEPWISE_EVALUATION_SWEEP_S", "15")),
        "options": {"queue": "orchestrator.evaluation", "expires": 60},
    },
    # Bulk re-runs (orchestrator/engine/services/reruns.py) send their next chunk on themselves;
    # this sweep is the backstop for a message lost on the way.
    "stepwise-reruns": {
        "task": "orchestrator.tasks.reruns_sweep",
        "schedule": float(os.environ.get("STEPWISE_RERUN_SWEEP_S", "30")),
        "options": {"queue": "orchestrator", "expires": 60},
    },
    # Its own queue, so only the worker that holds the signing key consumes it (docs/security.md).
    # A poll: the task signs the head when a checkpoint is due (AUDIT_CHECKPOINT_INTERVAL_S or
    # AUDIT_CHECKPOINT_ENTRIES, whichever comes first; docs/audit.md#checkpoints).
    "stepwise-audit-checkpoint": {
        "task": "audit.tasks.checkpoint",
        "schedule": float(os.environ.get("AUDIT_CHECKPOINT_POLL_S", "5")),
        "options": {"queue": "audit", "expires": 30},
    },
}

# --- Stepwise -------------------------------------------------------------------------------
# The model registry: a step names a model; the registry says which provider serves it and
# what a token costs. Override with STEPWISE_MODELS (JSON) or STEPWISE_MODELS_FILE.
STEPWISE_MODELS = {
    "fast": {"provider": "scripted", "input_usd_per_mtok": 0.25, "output_usd_per_mtok": 1.25},
    "deep": {"provider": "scripted", "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0},
}
if os.environ.get("STEPWISE_MODELS_FILE"):
    STEPWISE_MODELS = json.loads(Path(os.environ["STEPWISE_MODELS_FILE"]).read_text())
elif os.environ.get("STEPWISE_MODELS"):
    STEPWISE_MODELS = json.loads(os.environ["STEPWISE_MODELS"])

# The model that grades an evaluation's rubrics (docs/evaluation-scoring.md), and the Python
# modules whose @scorer functions evaluations may name (comma separated).
STEPWISE_EVALUATION_GRADER = os.environ.get("STEPWISE_EVALUATION_GRADER", "fast")
STEPWISE_EVALUATION_SCORERS = [
    m.strip() for m in os.environ.get("STEPWISE_EVALUATION_SCORERS", "").split(",") if m.strip()]

# What a version must pass before it is published, beside its gates: each a function
# (workflow=, version=) -> [{"path", "message"}]. The evaluation app's release gate
# (docs/evaluation.md#the-release-gate) checks the workflow's release policy.
STEPWISE_PUBLISH_CHECKS = ["evaluation.gate.release_problems"]
# What a workflow's admin page shows beside its own fields: each a function (request, workflow)
# -> HTML. The evaluation app's release policy, with the gate's verdict on the latest version.
STEPWISE_WORKFLOW_ADMIN_PANELS = ["evaluation.admin.release_policy_panel"]

# Python modules whose @tool functions are registered at start-up (comma separated).
STEPWISE_TOOL_MODULES = [
    m.strip() for m in os.environ.get("STEPWISE_TOOL_MODULES", "examples.tools").split(",") if m
]
# A worker's claim on a running step lasts this long and is renewed by its heartbeat every
# third of it; a killed worker's step is retried once the lease runs out.
STEPWISE_LEASE_S = int(os.environ.get("STEPWISE_LEASE_S", "30"))
# Eager dispatch (orchestrator.engine.services.kinds.worker.Carry): a worker whose step succeeds
# claims the run's next step on the same queue in that transaction and runs it itself, with no
# broker hop and no claim transaction, up to this many steps per message and while the message
# has run for less than this many seconds; then the next step goes through the broker, behind
# other runs' work. 0 steps: every step is a message of its own.
STEPWISE_CARRY_STEPS = int(os.environ.get("STEPWISE_CARRY_STEPS", "10"))
STEPWISE_CARRY_S = float(os.environ.get("STEPWISE_CARRY_S", "0.5"))
# Large values out of the row (orchestrator.engine.artifacts): a step's or run's input or output, a
# map item or an event payload whose JSON is longer than this many bytes is stored once as an
# artifact, by its SHA-256, and the row holds a reference (0: everything stays in the row).
# Where: a directory (the embedded default), or an S3-compatible bucket through
# django-storages when STEPWISE_ARTIFACTS_S3_BUCKET is set (credentials from boto3's usual
# chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or an instance role).
STEPWISE_ARTIFACT_BYTES = int(os.environ.get("STEPWISE_ARTIFACT_BYTES", 64 * 1024))
STEPWISE_ARTIFACT_CACHE_BYTES = int(os.environ.get("STEPWISE_ARTIFACT_CACHE_BYTES", 64 * 1024 * 1024))
STEPWISE_ARTIFACTS_DIR = Path(os.environ.get("STEPWISE_ARTIFACTS_DIR", VAR_DIR / "artifacts"))
if os.environ.get("STEPWISE_ARTIFACTS_S3_BUCKET"):
    _ARTIFACTS = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": os.environ["STEPWISE_ARTIFACTS_S3_BUCKET"],
        "location": os.environ.get("STEPWISE_ARTIFACTS_S3_PREFIX", "stepwise-artifacts"),
        "endpoint_url": os.environ.get("STEPWISE_ARTIFACTS_S3_ENDPOINT") or None,
        "region_name": os.environ.get("STEPWISE_ARTIFACTS_S3_REGION") or None,
        "default_acl": None, "querystring_auth": False, "file_overwrite": True}}
else:
    _ARTIFACTS = {"BACKEND": "django.core.files.storage.FileSystemStorage",
                  "OPTIONS": {"location": STEPWISE_ARTIFACTS_DIR}}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "artifacts": _ARTIFACTS,
}
# A queued step nobody claimed for this long is dispatched again (its message was lost).
STEPWISE_REDISPATCH_AFTER_S = int(os.environ.get("STEPWISE_REDISPATCH_AFTER_S", "60"))
# Child runs nest at most this deep below their top-level run; a sub-workflow step that would
# start one deeper fails permanent (workflows calling each other in a cycle end there).
STEPWISE_MAX_CHILD_DEPTH = int(os.environ.get("STEPWISE_MAX_CHILD_DEPTH", "8"))
# Per-dependency limits shared by all workers: calls per second ("tool:http.request",
# "model:fast" ...; JSON), and the circuit breaker: after this many consecutive transient
# failures a dependency is not called for the cool-down.
STEPWISE_RATE_LIMITS = json.loads(os.environ.get("STEPWISE_RATE_LIMITS", "{}"))
STEPWISE_BREAKER_FAILURES = int(os.environ.get("STEPWISE_BREAKER_FAILURES", "5"))
STEPWISE_BREAKER_COOLDOWN_S = float(os.environ.get("STEPWISE_BREAKER_COOLDOWN_S", "30"))
# Capacity classes beside interactive, batch and evaluation, and each class's guaranteed share
# of every provider quota (orchestrator/engine/capacity.py, docs/operations.md#capacity): JSON,
# e.g. {"bulk": {"shares": {"model:fast": 0.1}, "default_share": 0.05}}.
STEPWISE_CAPACITY_CLASSES = json.loads(os.environ.get("STEPWISE_CAPACITY_CLASSES", "{}"))
# Quotas of model providers and named connections shared by all workers and divided between
# the capacity classes (orchestrator/engine/quotas.py): JSON, e.g.
# {"model:fast": {"tokens_per_minute": 200000, "concurrent": 8}}.
STEPWISE_QUOTAS = json.loads(os.environ.get("STEPWISE_QUOTAS", "{}"))
# A class that has not asked for a dependency for this long lends its guaranteed share out.
STEPWISE_QUOTA_IDLE_S = float(os.environ.get("STEPWISE_QUOTA_IDLE_S", "30"))
# Where outbound calls may go (orchestrator.integrations.egress, docs/egress.md): JSON with a
# `default` policy, `tools` ({"http.request": {...}}) and `teams` ({"<slug>": {..., "tools":
# {...}}}) layers. Unset: http/https to public addresses on ports 80 and 443, 1 MiB responses.
STEPWISE_EGRESS = json.loads(os.environ.get("STEPWISE_EGRESS", "{}"))
# Named connections the integration tools use (orchestrator/integrations/connections.py,
# docs/tools.md): a mapping of names to connections, as JSON in STEPWISE_CONNECTIONS or in the
# JSON/YAML file STEPWISE_CONNECTIONS_FILE. Credentials only as {"env": NAME} or {"file": PATH}.
# Unset in development: the example workflows' connections under var/ (and the local RabbitMQ, whose
# password comes from STEPWISE_EXAMPLE_RABBITMQ_PASSWORD, which `make run` sets); unset in
# production: none.
if os.environ.get("STEPWISE_CONNECTIONS_FILE"):
    STEPWISE_CONNECTIONS = yaml.safe_load(Path(os.environ["STEPWISE_CONNECTIONS_FILE"]).read_text())
elif os.environ.get("STEPWISE_CONNECTIONS"):
    STEPWISE_CONNECTIONS = json.loads(os.environ["STEPWISE_CONNECTIONS"])
elif PRODUCTION:
    STEPWISE_CONNECTIONS = {}
else:
    STEPWISE_CONNECTIONS = {
        "examples-warehouse": {
            "kind": "sql", "url": f"sqlite:///{VAR_DIR / 'examples' / 'warehouse.sqlite3'}",
            "description": "The example workflows' sample rows (read-only)."},
        "examples-files": {
            "kind": "files", "root": str(VAR_DIR / "files"), "writes": True,
            "description": "var/files/ of this checkout."},
        "examples-rabbitmq": {
            "kind": "rabbitmq", "url": "amqp://guest@127.0.0.1:5672//",
            "password": {"env": "STEPWISE_EXAMPLE_RABBITMQ_PASSWORD"}, "exchanges": ["amq.topic"],
            "timeout_s": 5, "description": "The local RabbitMQ's default guest account."},
        "examples-mail": {
            "kind": "mail", "backend": "file", "path": str(VAR_DIR / "outbox" / "mail"),
            "from_email": "stepwise@example.com", "allowed_domains": ["example.com"],
            "description": "E-mails as files in var/outbox/mail/."},
    }
# Where the example tools write what they "send" (examples/tools.py: e-mails, refunds).
STEPWISE_OUTBOX_DIR = Path(os.environ.get("STEPWISE_OUTBOX_DIR", VAR_DIR / f"outbox{XDIST_SUFFIX}"))
# A workflow's budget default when a step has no price history: the design's $0.10.
STEPWISE_DEFAULT_STEP_COST_USD = os.environ.get("STEPWISE_DEFAULT_STEP_COST_USD", "0.10")
# The fraction of a run's or a step's cost limit at which a budget.warning alert goes out once
# (a team's or a workflow's limit carries its own warn_at). docs/budgets.md.
STEPWISE_BUDGET_WARN_AT = os.environ.get("STEPWISE_BUDGET_WARN_AT", "0.8")

# --- triggers (triggers/, docs/triggers.md) ---------------------------------------------------
# The brokers queue-event triggers read, by name: {"name": "amqp://..." | "redis://..."}. A
# trigger names one; the `stepwise_consume` process connects to those its enabled triggers use.
# Development knows the local RabbitMQ and Redis; production names its own (JSON).
STEPWISE_EVENT_SOURCES = json.loads(os.environ["STEPWISE_EVENT_SOURCES"]) if os.environ.get(
    "STEPWISE_EVENT_SOURCES") else ({} if PRODUCTION else {
        "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//", "redis": "redis://127.0.0.1:6379/0"})
# The cap on a team's unfinished runs, on every start path, when its budget limit sets none
# (budgets.services.budget_admit; 0: no cap).
STEPWISE_TEAM_MAX_LIVE_RUNS = int(os.environ.get("STEPWISE_TEAM_MAX_LIVE_RUNS", "200"))
# Run starts a person, and an API token, may ask for through the API, the builder and API
# triggers (orchestrator/web/api/throttling.py; DRF's "<n>/<sec|min|hour|day>", empty: no limit).
STEPWISE_RUN_START_RATES = {
    "run_start.person": os.environ.get("STEPWISE_RUN_START_RATE_PERSON", "120/min") or None,
    "run_start.token": os.environ.get("STEPWISE_RUN_START_RATE_TOKEN", "120/min") or None,
}
# The consumer re-reads its triggers this often, so a change in the admin needs no restart.
STEPWISE_CONSUMER_RELOAD_S = float(os.environ.get("STEPWISE_CONSUMER_RELOAD_S", "5"))
# Hold each acknowledgement this long after the event's run is committed. Zero in real use;
# the fault tests set it to kill the consumer between the commit and the ack.
STEPWISE_CONSUMER_ACK_DELAY_S = float(os.environ.get("STEPWISE_CONSUMER_ACK_DELAY_S", "0"))
# A Redis-stream event left unacknowledged this long by a consumer that died is claimed.
STEPWISE_CONSUMER_CLAIM_IDLE_S = float(os.environ.get("STEPWISE_CONSUMER_CLAIM_IDLE_S", "60"))
# --- notifications (notifications/, docs/approvals.md#notifications) --------------------------
# Where links in notifications point: the address people open Stepwise at.
STEPWISE_BASE_URL = os.environ.get("STEPWISE_BASE_URL", "http://127.0.0.1:8000")
# An outgoing webhook (Slack-compatible payload) told about the same events as the e-mail;
# its calls follow the egress policy of the caller `notify.webhook` (docs/egress.md).
STEPWISE_NOTIFY_WEBHOOK_URL = os.environ.get("STEPWISE_NOTIFY_WEBHOOK_URL", "")
# E-mail: SMTP when DJANGO_EMAIL_HOST is set; otherwise each message is written to a file under
# var/mail/ (embedded default), so nothing leaves the machine until someone configures it.
DEFAULT_FROM_EMAIL = os.environ.get("DJANGO_DEFAULT_FROM_EMAIL", "stepwise@localhost")
if os.environ.get("DJANGO_EMAIL_HOST"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = os.environ["DJANGO_EMAIL_HOST"]
    EMAIL_PORT = int(os.environ.get("DJANGO_EMAIL_PORT", "587"))
    EMAIL_HOST_USER = os.environ.get("DJANGO_EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = os.environ.get("DJANGO_EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = deployment.env_bool("DJANGO_EMAIL_USE_TLS", True)
else:
    EMAIL_BACKEND = os.environ.get("DJANGO_EMAIL_BACKEND",
                                   "django.core.mail.backends.filebased.EmailBackend")
    EMAIL_FILE_PATH = VAR_DIR / "mail"

# --- alerts (alerts/, docs/operations.md#alerts) ------------------------------------------------
# An outbox event is read this long after it was written, so a transaction that committed after
# a later id (PostgreSQL) is not passed over.
STEPWISE_ALERTS_SETTLE_S = float(os.environ.get("STEPWISE_ALERTS_SETTLE_S", "2"))

# --- API ------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orchestrator.web.api.authentication.CompiledTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "orchestrator.web.api.schema.StepwiseAutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "orchestrator.web.api.pagination.KeysetPagination",
    "PAGE_SIZE": 50,
    # Every error in one shape, {"errors": [{"path", "message"}]} (orchestrator/web/api/errors.py).
    "EXCEPTION_HANDLER": "orchestrator.web.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Stepwise API",
    "DESCRIPTION": "Durable, budgeted, audited AI workflows.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The UI's assets come with the package (drf-spectacular-sidecar): the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The API token first in "Authorize": what a program uses (the cookie is the browser's).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "orchestrator.web.api.schema.token_scheme_first"],
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "orchestrator.models.RunState",
        "StepStateEnum": "orchestrator.models.StepState",
        "ApprovalStateEnum": "approvals.models.ApprovalState",
        "StepKindEnum": "orchestrator.engine.states.StepKind",
        "TriggerKindEnum": "triggers.models.TriggerKind",
        "RiskTierEnum": "orchestrator.engine.definitions.format.RISK_TIERS",
        "CaseRiskTierEnum": "evaluation.models.RiskTier",
        "EvaluationStateEnum": "evaluation.models.EvaluationState",
        "EvaluationCaseStateEnum": "evaluation.models.CaseRunState",
    },
}

# Logs (docs/operations.md#logs): one line per record with the run, step, attempt, workflow,
# team and trace ids (orchestrator/operations/logs.py); JSON lines in production, readable text
# otherwise (STEPWISE_LOG_FORMAT=json|text overrides). Secrets are masked before any line is
# written. Workers and beat use this same configuration (orchestrator/celery.py), never Celery's
# own.
STEPWISE_LOG_FORMAT = os.environ.get("STEPWISE_LOG_FORMAT", "json" if PRODUCTION else "text")
# dictConfig, then every record scrubbed as it is created: a library's own handlers redact too.
LOGGING_CONFIG = "orchestrator.operations.logs.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "ids": {"()": "orchestrator.operations.logs.ContextFilter"},
        "redact": {"()": "orchestrator.operations.logs.RedactFilter"},
    },
    "formatters": {
        "json": {"()": "orchestrator.operations.logs.JsonFormatter"},
        "text": {"()": "orchestrator.operations.logs.TextFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["ids", "redact"],
                             "formatter": STEPWISE_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("STEPWISE_LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's request logger prints through the root handler only (its own "console"
        # handler would print each 4xx/5xx warning a second time under DEBUG).
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # Celery's per-task "received"/"succeeded" lines: the reaper's sweep every 2 s floods
        # them; the engine logs what matters itself.
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        # Beat's "Sending due task" line for every tick of the 2-second sweep
        # (STEPWISE_BEAT_LOG_LEVEL=INFO shows each message beat sends).
        "celery.beat": {"level": os.environ.get("STEPWISE_BEAT_LOG_LEVEL", "WARNING")},
    },
}

# --- metrics (orchestrator/operations/metrics.py, docs/operations.md#metrics) ---------------
# Every process (web, each worker's prefork children) writes its counters here; /metrics sums
# them. Set before prometheus-client is imported anywhere; `make run` empties it at start.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / f"prometheus{XDIST_SUFFIX}"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
# /metrics answers operators (signed in, or with their API token) and, for a Prometheus
# server, `Authorization: Bearer <STEPWISE_METRICS_TOKEN>` when this is set.
STEPWISE_METRICS_TOKEN = os.environ.get("STEPWISE_METRICS_TOKEN", "")

# --- traces (orchestrator/operations/tracing.py, docs/operations.md#traces) ------------------
# OpenTelemetry spans from the API through the scheduler to each step and its model/tool call.
# Off by default; on, spans go to STEPWISE_OTLP_ENDPOINT (OTLP over HTTP) or to the console.
STEPWISE_TRACING = deployment.env_bool("STEPWISE_TRACING", False)
STEPWISE_OTLP_ENDPOINT = os.environ.get("STEPWISE_OTLP_ENDPOINT", "")

# --- audit ledger (audit/, docs/audit.md) -----------------------------------------------------
# Days an entry is kept before `manage.py audit_prune` may delete it; unset keeps it forever.
AUDIT_RETENTION_DAYS = int(os.environ["AUDIT_RETENTION_DAYS"]) if os.environ.get("AUDIT_RETENTION_DAYS") else None
# Where `manage.py audit_export` writes when no --output is given.
AUDIT_EXPORT_DIR = Path(os.environ.get("AUDIT_EXPORT_DIR", VAR_DIR / "audit-exports"))
# (AUDIT_REDACTION_KEY is set with the other secrets at the top of this file.)
# Anchoring (audit/anchoring.py): signed checkpoints of the chain head, written out of the
# database. The Ed25519 private key is a file the database does not hold; production names it,
# development generates var/secrets/audit-signing-key.pem on first use.
AUDIT_SIGNING_KEY_FILE = os.environ.get("AUDIT_SIGNING_KEY_FILE", "") or (
    "" if PRODUCTION else str(SECRETS_DIR / "audit-signing-key.pem"))
# Public keys (base64 of the raw 32 bytes, comma separated) trusted besides the signing key's
# own: the keys that signed older checkpoints, kept after a rotation.
AUDIT_VERIFY_KEYS = deployment.env_list("AUDIT_VERIFY_KEYS")
# A checkpoint is signed when the audit worker starts, then every AUDIT_CHECKPOINT_INTERVAL_S
# (STEPWISE_CHECKPOINT_S) or every AUDIT_CHECKPOINT_ENTRIES entries, whichever comes first.
AUDIT_CHECKPOINT_INTERVAL_S = float(os.environ.get("STEPWISE_CHECKPOINT_S")
                                    or os.environ.get("AUDIT_CHECKPOINT_INTERVAL_S") or 60)
AUDIT_CHECKPOINT_ENTRIES = int(os.environ.get("AUDIT_CHECKPOINT_ENTRIES", "1000"))
# How many chains the ledger is partitioned into on PostgreSQL, each sealed under its own lock
# (docs/audit.md#shards); SQLite, one writer at a time, always keeps one.
AUDIT_LEDGER_SHARDS = int(os.environ.get("AUDIT_LEDGER_SHARDS", "1"))
# audit_verify fails when entries older than the interval plus this are covered by no checkpoint.
AUDIT_CHECKPOINT_GRACE_S = float(os.environ.get("AUDIT_CHECKPOINT_GRACE_S", "60"))
# Where checkpoints are kept: this directory, or with AUDIT_CHECKPOINT_S3_BUCKET an S3 bucket
# created with object lock (audit/stores.py). Keep either off the database's host.
AUDIT_CHECKPOINT_DIR = Path(os.environ.get("AUDIT_CHECKPOINT_DIR", VAR_DIR / "audit-checkpoints"))
if os.environ.get("AUDIT_CHECKPOINT_S3_BUCKET"):
    STORAGES["audit_checkpoints"] = {"BACKEND": "audit.s3.LockedS3Storage", "OPTIONS": {
        "bucket_name": os.environ["AUDIT_CHECKPOINT_S3_BUCKET"],
        "location": os.environ.get("AUDIT_CHECKPOINT_S3_PREFIX", "audit-checkpoints"),
        "endpoint_url": os.environ.get("AUDIT_CHECKPOINT_S3_ENDPOINT") or None,
        "region_name": os.environ.get("AUDIT_CHECKPOINT_S3_REGION") or None,
        "retain_days": int(os.environ.get("AUDIT_CHECKPOINT_S3_RETAIN_DAYS", "0")),
        "lock_mode": os.environ.get("AUDIT_CHECKPOINT_S3_LOCK_MODE", "COMPLIANCE"),
        "default_acl": None, "querystring_auth": False, "file_overwrite": True}}
# The archive a prune exports what it deletes to first (audit/services.py: audit_prune): a
# directory, or an S3 bucket with object lock; unset, a prune deletes without an archive.
if os.environ.get("AUDIT_ARCHIVE_S3_BUCKET"):
    STORAGES["audit_archive"] = {"BACKEND": "audit.s3.LockedS3Storage", "OPTIONS": {
        "bucket_name": os.environ["AUDIT_ARCHIVE_S3_BUCKET"],
        "location": os.environ.get("AUDIT_ARCHIVE_S3_PREFIX", "audit-archive"),
        "endpoint_url": os.environ.get("AUDIT_ARCHIVE_S3_ENDPOINT") or None,
        "region_name": os.environ.get("AUDIT_ARCHIVE_S3_REGION") or None,
        "retain_days": int(os.environ.get("AUDIT_ARCHIVE_S3_RETAIN_DAYS", "0")),
        "default_acl": None, "querystring_auth": False, "file_overwrite": False}}
elif os.environ.get("AUDIT_ARCHIVE_DIR"):
    STORAGES["audit_archive"] = {"BACKEND": "django.core.files.storage.FileSystemStorage",
                                 "OPTIONS": {"location": os.environ["AUDIT_ARCHIVE_DIR"]}}

# --- request size limits (docs/limits.md) -----------------------------------------------------
# The largest API request body, in bytes. Our parsers refuse a larger one with 413 in the
# `{"errors": [...]}` shape before reading it; Django applies the same bound to form data.
# A definition is further bounded by orchestrator.engine.definitions.limits (512 KiB), run input
# by 1 MiB. The ASGI application (orchestrator/asgi.py: BodyLimit) refuses a larger body of
# any request before Django reads it.
STEPWISE_MAX_REQUEST_BYTES = int(os.environ.get("STEPWISE_MAX_REQUEST_BYTES", 2 * 1024 * 1024))
DATA_UPLOAD_MAX_MEMORY_SIZE = STEPWISE_MAX_REQUEST_BYTES
#: The render budget of every template, on the web and in workers (docs/limits.md): the
#: largest value or output one render may build, and its time.
STEPWISE_TEMPLATE_MAX_CHARS = int(os.environ.get("STEPWISE_TEMPLATE_MAX_CHARS", 1024 * 1024))
STEPWISE_TEMPLATE_MAX_SECONDS = float(os.environ.get("STEPWISE_TEMPLATE_MAX_SECONDS", 2.0))
REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"] = [
    "orchestrator.web.api.renderers.JSONBodyRenderer",
    "rest_framework.renderers.BrowsableAPIRenderer",
]
REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] = [
    "orchestrator.web.api.parsers.JSONBodyParser",
    "orchestrator.web.api.parsers.FormBodyParser",
    "orchestrator.web.api.parsers.MultiPartBodyParser",
]
#: Attestation (docs/audit.md#attestation): this process's Ed25519 signing key, from a PEM file
#: or as base64 of its raw 32 bytes; neither: generated as the process starts.
STEPWISE_ATTESTATION_KEY_FILE = os.environ.get("STEPWISE_ATTESTATION_KEY_FILE", "")
STEPWISE_ATTESTATION_KEY = os.environ.get("STEPWISE_ATTESTATION_KEY", "")
#: Accept only keys an operator provisioned first (`manage.py attestation_keys provision`).
STEPWISE_ATTESTATION_PROVISIONED_ONLY = os.environ.get(
    "STEPWISE_ATTESTATION_PROVISIONED_ONLY", "").lower() in ("1", "true", "yes")
#: How long a process trusts what it read of a key's registration: a revocation holds within it.
STEPWISE_ATTESTATION_KEY_CACHE_S = float(os.environ.get("STEPWISE_ATTESTATION_KEY_CACHE_S", "5"))

# --- single sign-on (orchestrator/web/sso/, docs/operations.md#single-sign-on) ---------------
# OpenID Connect through mozilla-django-oidc; off unless a client id is set. The admin's
# username and password form stays either way.
STEPWISE_OIDC_ENABLED = bool(os.environ.get("STEPWISE_OIDC_CLIENT_ID"))
#: The name on the login page's button: "Sign in with <name>".
STEPWISE_OIDC_PROVIDER_NAME = os.environ.get("STEPWISE_OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = os.environ.get("STEPWISE_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = os.environ.get("STEPWISE_OIDC_CLIENT_SECRET", "")
#: The ID token's `iss` must be this when set (the provider's issuer identifier).
STEPWISE_OIDC_ISSUER = os.environ.get("STEPWISE_OIDC_ISSUER", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("STEPWISE_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("STEPWISE_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("STEPWISE_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("STEPWISE_OIDC_JWKS_ENDPOINT", "")
OIDC_RP_SIGN_ALGO = os.environ.get("STEPWISE_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("STEPWISE_OIDC_SCOPES", "openid email profile groups")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = float(os.environ.get("STEPWISE_OIDC_TIMEOUT_S", "10"))
#: The claims holding the username and the list of the provider's groups.
STEPWISE_OIDC_USERNAME_CLAIM = os.environ.get("STEPWISE_OIDC_USERNAME_CLAIM", "preferred_username")
STEPWISE_OIDC_GROUPS_CLAIM = os.environ.get("STEPWISE_OIDC_GROUPS_CLAIM", "groups")
#: Create an account at a person's first sign-in; off, only existing accounts may sign in.
OIDC_CREATE_USER = deployment.env_bool("STEPWISE_OIDC_CREATE_USERS", False)
#: Refuse a person none of whose groups is in STEPWISE_OIDC_GROUPS.
STEPWISE_OIDC_REFUSE_UNMAPPED = deployment.env_bool("STEPWISE_OIDC_REFUSE_UNMAPPED", True)
#: The provider's groups -> teams, roles, groups, staff (orchestrator/web/sso/mapping.py).
STEPWISE_OIDC_GROUPS = json.loads(
    Path(os.environ["STEPWISE_OIDC_GROUPS_FILE"]).read_text()
    if os.environ.get("STEPWISE_OIDC_GROUPS_FILE") else os.environ.get("STEPWISE_OIDC_GROUPS", "{}"))
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
LOGIN_REDIRECT_URL = "/admin/"
LOGIN_REDIRECT_URL_FAILURE = "/sso/refused/"
if STEPWISE_OIDC_ENABLED:
    AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend",
                               "orchestrator.web.sso.backends.StepwiseOIDCBackend"]
TEMPLATES[0]["OPTIONS"]["context_processors"].append("orchestrator.web.sso.context.sso")

# --- retention (retention/, docs/operations.md#retention) ---------------------------------------
# What owners may set, per kind of row: {"runs": {"min_days": 1, "max_days": 3650}, ...}; a
# policy outside these is refused. Defaults (days, or null: kept forever) apply to a team
# without its own policy. Both from JSON in the environment.
STEPWISE_RETENTION_LIMITS = {
    "runs": {"min_days": 1, "max_days": 3650}, "notifications": {"min_days": 1, "max_days": 3650},
    "firings": {"min_days": 1, "max_days": 3650}, "dead_letters": {"min_days": 1, "max_days": 3650},
    "ledger": {"min_days": 365, "max_days": 3650},
    **json.loads(os.environ.get("STEPWISE_RETENTION_LIMITS", "{}"))}
STEPWISE_RETENTION_DEFAULTS = json.loads(os.environ.get("STEPWISE_RETENTION_DEFAULTS", "{}"))
# A sweep deletes at most this many rows of a kind per transaction, and stops starting new
# batches after this many seconds (the next sweep carries on).
STEPWISE_RETENTION_BATCH = int(os.environ.get("STEPWISE_RETENTION_BATCH", "200"))
STEPWISE_RETENTION_BUDGET_S = float(os.environ.get("STEPWISE_RETENTION_BUDGET_S", "60"))
# Artifacts: a process remembers that an artifact exists for at most STEPWISE_ARTIFACT_MEMORY_S
# (and refreshes its modification time when it first relies on it); the collector deletes an
# unreferenced artifact only when it was last refreshed more than STEPWISE_ARTIFACT_GC_GRACE_S
# ago, which must exceed the memory plus the longest transaction.
STEPWISE_ARTIFACT_MEMORY_S = float(os.environ.get("STEPWISE_ARTIFACT_MEMORY_S", "3600"))
STEPWISE_ARTIFACT_GC_GRACE_S = float(os.environ.get("STEPWISE_ARTIFACT_GC_GRACE_S", str(24 * 3600)))
CELERY_BEAT_SCHEDULE.update({
    # Rows past their team's or workflow's retention, then unreferenced artifacts.
    "stepwise-retention": {
        "task": "retention.tasks.sweep",
        "schedule": float(os.environ.get("STEPWISE_RETENTION_INTERVAL_S", "3600")),
        "options": {"queue": "orchestrator", "expires": 600},
    },
    # The ledger's prune signs checkpoints: on the queue of the worker holding the signing key.
    "stepwise-retention-ledger": {
        "task": "retention.tasks.prune_ledger",
        "schedule": float(os.environ.get("STEPWISE_RETENTION_LEDGER_INTERVAL_S", "86400")),
        "options": {"queue": "audit", "expires": 3600},
    },
})
