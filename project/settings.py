"""Settings for the fair webhook platform, all from the environment.

Every variable is listed in README.md. Defaults make `make run` work on a fresh
clone (SQLite and an embedded Redis under var/); production sets them explicitly.
"""

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from core import adaptive_modes, redis_connection
from core.env import (
    env_bool,
    env_choice,
    env_float,
    env_float_list,
    env_int,
    env_list,
    env_str,
    secret_from_file_or_env,
)
from project import embedded_redis, launch

BASE_DIR = Path(__file__).resolve().parent.parent
# Nothing here writes or starts anything: project.launch makes VAR_DIR, the development
# secret key and the embedded Redis, from the process entry points.
VAR_DIR = launch.var_dir()  # one reading of VAR_DIR for settings and the set-up alike

DEBUG = env_bool("DEBUG", False)


def _development_secret_key() -> str:
    """The one project.launch generated into var/ (sessions survive restarts); a key for
    this process alone if there is none yet. Production sets SECRET_KEY."""
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return secrets.token_urlsafe(50)


SECRET_KEY = secret_from_file_or_env("SECRET_KEY") or _development_secret_key()
SECRET_KEY_GENERATED = not secret_from_file_or_env("SECRET_KEY")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_prometheus",
    "django_rq",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "webhooks",
    "tenants",
    "delivery",
    "ingest",
    "dashboards",
    "simulation",
    "api",
    "axes",
    "csp",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "project.two_factor",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    # Before anything that reads the header (the After middleware below does, first).
    "core.content_length.MalformedContentLengthMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Which second factor, if any, this session verified; then the door that asks for one.
    "django_otp.middleware.OTPMiddleware",
    "project.two_factor.gate.RequireOperatorSecondFactor",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Times in the viewer's zone (the portal's `tz` cookie); settings.TIME_ZONE otherwise.
    "dashboards.timezones.ViewerTimeZoneMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # After authentication: it answers a locked-out login with the lockout page.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# The machine doors (/ingest/, /api/v1/events: signatures and bearer tokens, no cookies)
# run on this subset: project/machine_doors.py says why.
MACHINE_MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "core.content_length.MalformedContentLengthMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

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
            ],
        },
    },
]


def _database_config() -> dict:
    url = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")
    try:
        config = dj_database_url.parse(url, conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL={url!r} is not valid: {exc}") from exc
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Web and workers write side by side: WAL lets readers run during a write, the
        # busy timeout makes a writer wait instead of failing, and IMMEDIATE takes the
        # write lock at BEGIN so two writers never deadlock upgrading a read lock.
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    # Per process, so that two test sessions on one machine never share a test database.
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["TEST"] = {"NAME": str(VAR_DIR / f"test_db_{os.getpid()}.sqlite3")}
    else:
        config["TEST"] = {"NAME": f"test_{config['NAME']}_{os.getpid()}"}
    return {"default": config}


DATABASES = _database_config()
# PostgreSQL: ingest's write statement is prepared once per connection, then only bound
# (core.prepared_statements). Off behind a pooler that cannot carry prepared statements.
DB_PREPARED_STATEMENTS = env_bool("DB_PREPARED_STATEMENTS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: the schedule. Unset means a private redis-server on a unix socket under var/.
REDIS_URL = env_str("REDIS_URL", "")
EMBEDDED_REDIS = not REDIS_URL
if EMBEDDED_REDIS:
    # Its address only: project.launch starts it (see docs/ARCHITECTURE.md).
    REDIS_URL = embedded_redis.socket_url(embedded_redis.socket_for(VAR_DIR / "redis"))
elif not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(
        f"REDIS_URL={REDIS_URL!r} is not valid: expected redis://, rediss:// or unix://."
    )
# A Redis that hangs (not one that refuses) must not hang ingest or a delivery slot: every
# command of the schedule's client gives up after this long (options in REDIS_URL win).
REDIS_SOCKET_TIMEOUT = env_float("REDIS_SOCKET_TIMEOUT", 3.0, minimum=0.5)
REDIS_CONNECT_TIMEOUT = env_float("REDIS_CONNECT_TIMEOUT", 1.0, minimum=0.1)

# The schedule's own Redis; empty means REDIS_URL's. May be a Redis Cluster, given by seed
# nodes as redis+cluster://host:port,host:port (RQ's queues stay on REDIS_URL: RQ needs
# one server). See docs/SCHEDULER.md, "Sharding".
SCHEDULER_REDIS_URL = env_str("SCHEDULER_REDIS_URL", "")
if SCHEDULER_REDIS_URL:
    try:
        redis_connection.check_url(SCHEDULER_REDIS_URL)
    except ValueError as exc:
        raise ImproperlyConfigured(f"SCHEDULER_REDIS_URL is not valid: {exc}") from exc

RQ_QUEUES = {
    "default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 300},
    "maintenance": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 300},
}
RQ_SHOW_ADMIN_LINK = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
FORMAT_MODULE_PATH = ["project.formats"]  # times to the second (project/formats/en)
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "admin:login"

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
# Behind a TLS-terminating proxy: the header it sets to "https" (e.g. X-Forwarded-Proto),
# so that SECURE_SSL_REDIRECT and secure cookies see the request as HTTPS.
_PROXY_SSL_HEADER = env_str("SECURE_PROXY_SSL_HEADER", "")
if _PROXY_SSL_HEADER:
    if not _PROXY_SSL_HEADER.replace("-", "").replace("_", "").isalnum():
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER={_PROXY_SSL_HEADER!r} is not valid: a header name such as"
            " X-Forwarded-Proto."
        )
    SECURE_PROXY_SSL_HEADER = (
        "HTTP_" + _PROXY_SSL_HEADER.upper().replace("-", "_").removeprefix("HTTP_"),
        "https",
    )
X_FRAME_OPTIONS = "DENY"

# Every page's Content-Security-Policy (django-csp): scripts, styles, images and fonts
# from this site only, nothing inline (no inline <script>, <style> or style attribute
# runs), no plug-ins, no framing, forms that post only here. A page that needs more says
# so itself (the API reference: csp_update; a framed portal: PORTAL_FRAME_ANCESTORS).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [NONE],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        "base-uri": [NONE],
        "object-src": [NONE],
    }
}

# --- The platform's own settings (see README.md, "Configuration") ---

# Scheduler: "fair" (per-tenant lanes) or "fifo" (one line; only for comparisons).
SCHEDULER_MODE = env_str("SCHEDULER_MODE", "fair")
if SCHEDULER_MODE not in {"fair", "fifo"}:
    raise ImproperlyConfigured(f"SCHEDULER_MODE={SCHEDULER_MODE!r} is not valid: fair or fifo.")
SCHEDULER_TURN_SIZE = env_int("SCHEDULER_TURN_SIZE", 1, minimum=1, maximum=100)
SCHEDULER_RETRY_MIN_SHARE = env_float("SCHEDULER_RETRY_MIN_SHARE", 0.1)
if SCHEDULER_RETRY_MIN_SHARE > 1:
    raise ImproperlyConfigured("SCHEDULER_RETRY_MIN_SHARE must be between 0 and 1.")
SCHEDULER_FALLBACK_WEIGHT = env_int("SCHEDULER_FALLBACK_WEIGHT", 1, minimum=1, maximum=16)
SCHEDULER_SHARD = env_int("SCHEDULER_SHARD", 0, minimum=0)
# The schedule split into this many shards by destination endpoint, tagged SCHEDULER_SHARD,
# SCHEDULER_SHARD + 1, ... (docs/SCHEDULER.md, "Shards"). Changing it moves endpoints
# between shards: stop the workers, change it, then `manage.py rebuild_lanes --forget-shards
# <the tags no longer used>`. On a Redis Cluster, a process warns when the shards' tags
# crowd onto fewer masters than they could use, naming a SCHEDULER_SHARD that spreads them.
SCHEDULER_SHARDS = env_int("SCHEDULER_SHARDS", 1, minimum=1, maximum=64)
# The shards this process's workers pick from (indexes 0 to SCHEDULER_SHARDS - 1); empty
# means all. Acks and renewals still go to whichever shard holds a lease.
SCHEDULER_PICK_SHARDS = env_list("SCHEDULER_PICK_SHARDS", [])
if not all(i.isdigit() and int(i) < SCHEDULER_SHARDS for i in SCHEDULER_PICK_SHARDS):
    raise ImproperlyConfigured(
        f"SCHEDULER_PICK_SHARDS={','.join(SCHEDULER_PICK_SHARDS)!r} is not valid: shard"
        f" indexes from 0 to {SCHEDULER_SHARDS - 1} (SCHEDULER_SHARDS - 1), comma-separated."
    )
SCHEDULER_PICK_SHARDS = sorted({int(i) for i in SCHEDULER_PICK_SHARDS})
# Deliveries per second for a tenant whose own rate is empty; 0 = unlimited.
TENANT_DEFAULT_RATE_PER_SECOND = env_float("TENANT_DEFAULT_RATE_PER_SECOND", 0.0)
if TENANT_DEFAULT_RATE_PER_SECOND > 10_000:
    raise ImproperlyConfigured("TENANT_DEFAULT_RATE_PER_SECOND must be at most 10000.")
LEASE_SECONDS = env_int("LEASE_SECONDS", 30, minimum=2, maximum=60)

# Delivery workers.
# Requests one worker process drives at once (one libcurl multi loop, delivery/pipeline/engine.py):
# an endpoint that never answers holds one of these until its timeout, so this is sized
# for hundreds of hung endpoints beside healthy traffic (docs/BENCHMARKS.md: memory per
# request). DELIVERY_SLOTS, its older name, is still read so that deployments that set it
# keep their value.
DELIVERY_CONCURRENCY = env_int(
    "DELIVERY_CONCURRENCY",
    env_int("DELIVERY_SLOTS", 1024, minimum=1, maximum=10_000),
    minimum=1,
    maximum=10_000,
)
DELIVERY_CONNECT_TIMEOUT = env_float("DELIVERY_CONNECT_TIMEOUT", 5.0)
DELIVERY_RESPONSE_CAP_BYTES = env_int("DELIVERY_RESPONSE_CAP_BYTES", 20_000, minimum=0)
# Svix's schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (then dead).
RETRY_SCHEDULE_SECONDS = env_float_list(
    "RETRY_SCHEDULE_SECONDS", [5, 300, 1800, 7200, 18000, 36000, 36000]
)
RETRY_JITTER = env_float("RETRY_JITTER", 0.2)
RETRY_AFTER_MAX_SECONDS = env_float("RETRY_AFTER_MAX_SECONDS", 36000)
ENDPOINT_DISABLE_AFTER_FAILURES = env_int("ENDPOINT_DISABLE_AFTER_FAILURES", 100, minimum=1)
# Whose in-flight limit adapts to how it answers, between 1 and its cap (docs/SCHEDULER.md,
# "Adaptive limits"): "uncapped", the endpoints without a cap of their own (nobody stated
# their capacity); "all", every endpoint, a set cap being its ceiling; "off", none (each
# cap is the limit, fixed). An endpoint with fixed_max_in_flight never adapts.
DELIVERY_ADAPTIVE_CONCURRENCY = env_choice(
    "DELIVERY_ADAPTIVE_CONCURRENCY", adaptive_modes.ADAPT_UNCAPPED, adaptive_modes.SPELLINGS
)
# The cap of an endpoint without one of its own (an empty max_in_flight): fixed, or, where
# limits adapt, the ceiling its limit grows to. A receiver's capacity is unknown, so the
# fixed one stays small; the adaptive limit starts low and backs off on its own.
DELIVERY_MAX_IN_FLIGHT = env_int("DELIVERY_MAX_IN_FLIGHT", 2, minimum=1, maximum=1000)
DELIVERY_ADAPTIVE_CEILING = env_int("DELIVERY_ADAPTIVE_CEILING", 64, minimum=1, maximum=1000)
# Consecutive failures at which an endpoint counts as failing (operational event
# endpoint.failing; endpoint.recovered at its next success).
ENDPOINT_FAILING_AFTER_FAILURES = env_int("ENDPOINT_FAILING_AFTER_FAILURES", 5, minimum=1)
ENDPOINT_DISABLE_AFTER_DAYS = env_float("ENDPOINT_DISABLE_AFTER_DAYS", 5.0)
# Outbound requests to loopback/private/link-local addresses are refused unless this is on.
ALLOW_PRIVATE_DESTINATIONS = env_bool("ALLOW_PRIVATE_DESTINATIONS", False)

# Ingest.
INGEST_MAX_BODY_BYTES = env_int("INGEST_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
INGEST_TIMESTAMP_TOLERANCE_SECONDS = env_int("INGEST_TIMESTAMP_TOLERANCE_SECONDS", 300, minimum=1)
# Keep a source, its secrets, tenants and destinations between ingest requests, each
# checked against the configuration's version (one query) on every request: a change
# still applies to the next request (ingest.config_cache). Off: three queries instead.
INGEST_CONFIG_CACHE = env_bool("INGEST_CONFIG_CACHE", True)
PUBLISH_MAX_BATCH = env_int("PUBLISH_MAX_BATCH", 500, minimum=1, maximum=10_000)
# The fairness-key guard (webhooks.key_hygiene): a source that registers more tenants than
# this per window is keyed on something unbounded; its auto-registration is suspended.
AUTO_REGISTER_LIMIT = env_int("AUTO_REGISTER_LIMIT", 1000, minimum=1)
AUTO_REGISTER_WINDOW_SECONDS = env_int("AUTO_REGISTER_WINDOW_SECONDS", 3600, minimum=1)

# Observability.
# /readyz: each check (database, Redis, the schedule's Redis) must answer within this.
READINESS_TIMEOUT_SECONDS = env_float("READINESS_TIMEOUT_SECONDS", 1.0, minimum=0.05)
METRICS_TOP_N = env_int("METRICS_TOP_N", 20, minimum=1, maximum=1000)
METRICS_TOKEN = secret_from_file_or_env("METRICS_TOKEN")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # runserver's line per request follows LOG_LEVEL too (`make run` sets WARNING).
        "django.server": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    },
}

# `python manage.py rqworker default maintenance` runs delivery workers: RQ workers
# whose process also runs a delivery engine of DELIVERY_CONCURRENCY requests (delivery/worker/rq_worker.py).
RQ = {"WORKER_CLASS": env_str("RQ_WORKER_CLASS", "delivery.worker.DeliveryWorker")}
MAINTENANCE_INTERVAL_SECONDS = env_int("MAINTENANCE_INTERVAL_SECONDS", 15, minimum=1)
# A window replay (delivery.replays.window) feeds this many deliveries into the tenant's lane
# at a time, and the next chunk only once these have left it. Workers look for a chunk
# to feed every REPLAY_FEED_SECONDS (one of them at a time), besides each sweep.
REPLAY_CHUNK_SIZE = env_int("REPLAY_CHUNK_SIZE", 200, minimum=1, maximum=10_000)
REPLAY_FEED_SECONDS = env_float("REPLAY_FEED_SECONDS", 1.0, minimum=0.1)
# Previews stop counting here and say "more than": a count over a huge window is a long scan.
REPLAY_COUNT_LIMIT = env_int("REPLAY_COUNT_LIMIT", 100_000, minimum=1)
# Retention (delivery.upkeep.retention, pruned in bounded batches by the maintenance sweep;
# docs/RELIABILITY.md "What is kept and for how long"). Open work is never pruned.
RETENTION_DAYS = env_int("RETENTION_DAYS", 30, minimum=1)
DEAD_LETTER_RETENTION_DAYS = env_int("DEAD_LETTER_RETENTION_DAYS", 90, minimum=1)
PAYLOAD_RETENTION_DAYS = env_int("PAYLOAD_RETENTION_DAYS", RETENTION_DAYS, minimum=1)
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 365, minimum=1)
# A payload outliving its event's row is impossible (the row goes with it): refuse to
# start rather than silently keep it shorter than the operator asked.
if PAYLOAD_RETENTION_DAYS > RETENTION_DAYS:
    raise ImproperlyConfigured(
        f"PAYLOAD_RETENTION_DAYS={PAYLOAD_RETENTION_DAYS} exceeds RETENTION_DAYS={RETENTION_DAYS}: "
        "a payload is removed with its event at the latest; set it to RETENTION_DAYS or less."
    )
# Rows per DELETE/UPDATE statement (each its own short transaction) and seconds per sweep.
RETENTION_BATCH_SIZE = env_int("RETENTION_BATCH_SIZE", 2000, minimum=1, maximum=50_000)
RETENTION_SWEEP_SECONDS = env_float("RETENTION_SWEEP_SECONDS", 5.0, minimum=0.1)
# PostgreSQL: events, deliveries and attempts live in one partition per day (UTC); the
# sweep makes this many days ahead (delivery.upkeep.partitions), and drops a day whole once it is
# past RETENTION_DAYS. Days not made in time still take rows (the default partition).
PARTITION_DAYS_AHEAD = env_int("PARTITION_DAYS_AHEAD", 7, minimum=1, maximum=90)
# Backlog-age thresholds (seconds) for webhook_tenants_over_threshold.
METRICS_AGE_THRESHOLDS = env_float_list("METRICS_AGE_THRESHOLDS", [60, 300, 900])

# The management API (/api/v1/, api/): Django REST Framework, its schema by drf-spectacular.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["api.auth.TokenAccess"],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.TokenRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.problems.handle",
    "UNAUTHENTICATED_USER": None,
    "DATETIME_FORMAT": "iso-8601",
    "COERCE_DECIMAL_TO_STRING": False,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Fair webhooks management API",
    "DESCRIPTION": "Onboard and run tenants, their endpoints, messages, resends and replays. "
    "docs/API.md walks through it with curl.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.problems_as_problem_json",
    ],
    "SECURITY": [{"bearerAuth": []}],
    "APPEND_COMPONENTS": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
}
# Requests per minute per API token (0: no limit); past it, 429 with Retry-After.
API_RATE_LIMIT_PER_MINUTE = env_int("API_RATE_LIMIT_PER_MINUTE", 1200, minimum=0)
# A POST's answer is kept this long for its Idempotency-Key.
API_IDEMPOTENCY_HOURS = env_int("API_IDEMPOTENCY_HOURS", 24, minimum=1)
# What a tenant's own token may set on its endpoints; operator tokens go to the model's bounds.
API_TENANT_MAX_IN_FLIGHT = env_int("API_TENANT_MAX_IN_FLIGHT", 10, minimum=1, maximum=1000)
API_TENANT_MAX_RATE_PER_SECOND = env_float("API_TENANT_MAX_RATE_PER_SECOND", 100.0)
API_TENANT_MAX_TIMEOUT_SECONDS = env_int(
    "API_TENANT_MAX_TIMEOUT_SECONDS", 30, minimum=1, maximum=120
)
# Portal links (POST /api/v1/tenants/{key}/portal-links): how long one may wait to be used.
PORTAL_LINK_SECONDS = env_int("PORTAL_LINK_SECONDS", 300, minimum=10, maximum=86_400)
# Origins allowed to frame the tenant portal (CSP frame-ancestors); empty: none may.
PORTAL_FRAME_ANCESTORS = env_list("PORTAL_FRAME_ANCESTORS", [])
# A framed portal is a third-party context: its cookies must be sent cross-site, which
# browsers allow only for SameSite=None cookies that are also Secure. Django's CSRF
# token still guards every form.
if PORTAL_FRAME_ANCESTORS:
    SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "None"
# True: publishing a type not in the catalogue (or archived) is a 422 naming "event_type".
EVENT_TYPES_REQUIRE_CATALOGUE = env_bool("EVENT_TYPES_REQUIRE_CATALOGUE", False)

# Login throttling (django-axes) on every sign-in: the admin's and the tenant portal's
# password forms, and the portal links' landing. After LOGIN_FAILURE_LIMIT failures for
# one username, or from one client address, logins from there are refused (429, the
# lockout page) for LOGIN_LOCKOUT_MINUTES, even with the right password; a success clears
# the count. Portal links count by address (dashboards/sign_in_limits.py).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=10)
# Bad portal links (used, expired, unknown) from one address before its landing pauses.
PORTAL_LINK_FAILURE_LIMIT = env_int("PORTAL_LINK_FAILURE_LIMIT", 20, minimum=1, maximum=1000)
AXES_FAILURE_LIMIT = "dashboards.sign_in_limits.failure_limit"
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = "dashboards.sign_in_limits.lockout_parameters"
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_LOCKOUT_CALLABLE = "project.lockout.locked_out"
AXES_VERBOSE = False  # its start-up banner would print with every manage.py command
# The client's address is REMOTE_ADDR: a header a client sets itself would let it pick a
# fresh address per guess. Behind a proxy, LOGIN_CLIENT_IP_HEADER names the header it
# sets (e.g. HTTP_X_FORWARDED_FOR) and LOGIN_PROXY_COUNT how many proxies add to it.
AXES_IPWARE_META_PRECEDENCE_ORDER = [
    *([env_str("LOGIN_CLIENT_IP_HEADER")] if env_str("LOGIN_CLIENT_IP_HEADER") else []),
    "REMOTE_ADDR",
]
AXES_IPWARE_PROXY_COUNT = env_int("LOGIN_PROXY_COUNT", 0, minimum=0) or None

# Operators' second factor (django-otp, project/two_factor/): on, staff reach nothing past
# the password until they type a code from their authenticator app (set up at the first
# sign-in) or a recovery code. On by default outside DEBUG; `make run`'s demo turns it off.
ADMIN_REQUIRE_2FA = env_bool("ADMIN_REQUIRE_2FA", not DEBUG)
OTP_TOTP_ISSUER = env_str("OTP_TOTP_ISSUER", "Fair webhooks")
