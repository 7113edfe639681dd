"""Settings of the test project: a Django project using cogworker, as a newcomer's would be, which
`make demo` runs. SQLite by default (DATABASE_URL names another database), no server but Redis.
Everything tunable comes from the environment (django-environ).

`pip install '.[testproject]'` is all it needs, on Django 5.2 and 6.x: django-environ for this file,
cryptography for the demo's encrypted jobs (demo/secret_jobs.py). django-environ is not a
dependency of the library: the library reads its own two environment variables
(COGWORKER_REDIS_URL, REDIS_URL) itself.

The test-suite runs on testproject/suite_settings.py, these plus what only the suite needs: its
PostgreSQL and MariaDB databases (the outbox tests) and the switches its workers are started with."""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
# Local state (sqlite db, private redis, demo scratch files); git-ignored. COGWORKER_STATE_DIR moves
# it: `make test` runs the django.tasks tests on Python 3.13 beside the worker tier, and two test
# sessions sharing one SQLite test database (its name is the same in each) wipe each other's.
STATE_DIR = BASE_DIR / os.environ.get("COGWORKER_STATE_DIR", ".cogworker")
STATE_DIR.mkdir(parents=True, exist_ok=True)

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-cogworker-dev-only-do-not-deploy")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_cogworker",
    "testproject.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"

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

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{STATE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The worker and the web process write to one file (the outbox's relays, a view's push): a
    # writer waits up to 20 s for another's lock, not the 5 s default.
    DATABASES["default"].setdefault("OPTIONS", {"timeout": 20})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"

# The Redis URL is deliberately absent: the library reads COGWORKER_REDIS_URL, then REDIS_URL,
# from the environment itself (the test-suite points it at a private server that way).
COGWORKER = {
    "QUEUES": ["default", "mail"],
    "CONCURRENCY": env.int("COGWORKER_CONCURRENCY", 5),
    "SHUTDOWN_TIMEOUT": env.float("COGWORKER_SHUTDOWN_TIMEOUT", 25),
    "POLL_INTERVAL_AVERAGE": env.float("COGWORKER_POLL_INTERVAL_AVERAGE", 5),
    "ORPHAN_THRESHOLD": env.float("COGWORKER_ORPHAN_THRESHOLD", 300),
    "HEARTBEAT_INTERVAL": env.float("COGWORKER_HEARTBEAT_INTERVAL", 5),
    "TIMEOUT_GRACE": env.float("COGWORKER_TIMEOUT_GRACE", 10),
}
# The demo's jobs include some that encrypt their arguments (demo/secret_jobs.py), so the project
# has a key, as it has a SECRET_KEY: this default is public in this repository, for development
# only, never for a deployment, which sets its own in COGWORKER_ENCRYPTION_KEYS (a JSON list: the
# first seals, every one opens; `manage.py cogworker genkey` makes one). Tests give a worker others
# (rotation, a key it lacks) the same way.
COGWORKER["ENCRYPTION_KEYS"] = env.json("COGWORKER_ENCRYPTION_KEYS", ["vNqTyDuuTpNypJIfqoHg4Ykw8jKPm6TjirDDEzuKLvQ="])
# Only when asked, so the library's own default applies otherwise (tests flip reliable/basic).
if "COGWORKER_FETCH" in os.environ:
    COGWORKER["FETCH"] = env.str("COGWORKER_FETCH")
if "COGWORKER_PRIORITY_AGING" in os.environ:  # (tests/workers/test_fairness_workers.py: aging in seconds)
    COGWORKER["PRIORITY_AGING"] = env.float("COGWORKER_PRIORITY_AGING")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # The running job's class and jid on every line logged while it runs (docs/jobs.md).
    "filters": {"job": {"()": "django_cogworker.joblog.JobContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s pid=%(process)d %(threadName)s%(job_context)s %(name)s: "
                            "%(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "level": "INFO", "filters": ["job"]},
    },
    "loggers": {
        "django_cogworker": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "testproject": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
# Optional settings, only when the environment names them (tests set them per worker), so the
# library's own defaults apply otherwise.
if "COGWORKER_PERIODIC" in os.environ:
    COGWORKER["PERIODIC"] = env.json("COGWORKER_PERIODIC")
if "COGWORKER_CPU_AFFINITY" in os.environ:  # "auto", "none" or CPU numbers: "0,1"
    _affinity = env.str("COGWORKER_CPU_AFFINITY")
    COGWORKER["CPU_AFFINITY"] = _affinity if _affinity in ("auto", "none") else [int(c) for c in _affinity.split(",")]
# (KEY_PREFIX: make demo's own, "cogworker-demo:", scripts/demo.sh.)
for _name, _cast in {"KEY_PREFIX": env.str, "OUTBOX": env.bool, "CLOCK": env.str, "PERIODIC_CATCH_UP": env.bool,
                     "PERIODIC_TICK_INTERVAL": env.float, "MAX_ORPHANINGS": env.int, "KEY_GUARD_INTERVAL": env.float,
                     "OVER_LIMIT_MAX": env.int, "ITERATION_CHECKPOINT": env.float,
                     "PREFETCH": env.int, "FEATURES": env.list}.items():
    if f"COGWORKER_{_name}" in os.environ:
        COGWORKER[_name] = _cast(f"COGWORKER_{_name}")

# Django's task API (django.tasks on Django 6, the django-tasks backport on 5.2) run by cogworker:
# testproject/demo/tasks.py. Left out only where neither is installed.
try:
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:
        TASKS_API = None
    else:
        TASKS_API = "django_tasks"
else:
    TASKS_API = "django.tasks"
if TASKS_API == "django_tasks":
    INSTALLED_APPS.append("django_tasks")  # (the backport's system checks and signal wiring)
if TASKS_API:
    TASKS = {
        # No RETRY: the backend's default (none) applies; tests/test_tasks.py relies on it.
        "default": {
            "BACKEND": "django_cogworker.tasks.CogworkerBackend",
            "QUEUES": ["default", "mail"],
            "OPTIONS": {"RESULT_TTL": env.float("COGWORKER_TASKS_RESULT_TTL", 3600)},
        },
        # Retries asked for in OPTIONS (testproject/demo/tasks.py `doomed`).
        "retrying": {
            "BACKEND": "django_cogworker.tasks.CogworkerBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"RESULT_TTL": env.float("COGWORKER_TASKS_RESULT_TTL", 3600), "RETRY": 2},
        },
    }

# The tracing worker test (tests/workers/test_tracing_workers.py): this process's OpenTelemetry spans
# written to the JSON-lines file the variable names (testproject/demo/spans_file.py). Unset: no SDK.
if os.environ.get("COGWORKER_TEST_SPANS_FILE"):
    from testproject.demo.spans_file import install as _install_spans

    _install_spans(os.environ["COGWORKER_TEST_SPANS_FILE"])

# Traces to an OpenTelemetry backend (testproject/demo/otlp.py), only when the exporter's endpoint is
# set: `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:6006 python manage.py runcogworker` (and the
# same for runserver) with opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http installed.
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from testproject.demo.otlp import install as _install_otlp

    _install_otlp(os.environ.get("OTEL_SERVICE_NAME", "testproject"))
