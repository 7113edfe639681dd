"""Settings of the bench project: a typical small Django project (admin, auth, sessions...) so the
idle worker's memory is that of a real one, with cogworker at its defaults except where the bench
says otherwise through the environment:

* COGWORKER_REDIS_URL: the bench's private redis-server (read by django-cogworker itself);
* BENCH_STATE_DIR: where the (never queried) sqlite file lives;
* BENCH_POLL_INTERVAL_AVERAGE: only set by `run.py --quick`, to keep the scheduled test short;
* BENCH_CPU_AFFINITY: CPU_AFFINITY ("auto", "none" or CPU numbers, "0,1"), for the pinning rows.

Logging is at WARNING: at INFO the worker writes two lines per job, which would dominate a no-op job.
"""

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

STATE_DIR = Path(os.environ.get("BENCH_STATE_DIR") or tempfile.gettempdir())

SECRET_KEY = "django-insecure-bench-only"
DEBUG = False
ALLOWED_HOSTS = ["localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_cogworker",
    "benchproject",
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

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(STATE_DIR / "bench.sqlite3")}}
# The outbox section's PostgreSQL (bench/sections/outbox.py makes the database and drops it): the server of
# BENCH_POSTGRES_URL, default the local one; connected to only by that section.
_pg = urlsplit(os.environ.get("BENCH_POSTGRES_URL") or "postgres://postgres@127.0.0.1:5432/postgres")
# (A name of this process's own: two runs at once, the test-suite's quick one say, don't meet.)
DATABASES["pg"] = {"ENGINE": "django.db.backends.postgresql", "NAME": f"cogworker_bench_outbox_{os.getpid()}",
                   "USER": unquote(_pg.username or ""), "PASSWORD": unquote(_pg.password or ""),
                   "HOST": _pg.hostname or "", "PORT": str(_pg.port or "")}
# The iteration section's (bench/sections/iteration.py makes the database, fills its one table and drops it):
# the same server, a database of its own (this process's, too).
DATABASES["iter"] = {**DATABASES["pg"], "NAME": f"cogworker_bench_iter_{os.getpid()}"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

COGWORKER = {"QUEUES": ["default"]}
if os.environ.get("BENCH_POLL_INTERVAL_AVERAGE"):
    COGWORKER["POLL_INTERVAL_AVERAGE"] = float(os.environ["BENCH_POLL_INTERVAL_AVERAGE"])
if os.environ.get("BENCH_PREFETCH"):
    COGWORKER["PREFETCH"] = int(os.environ["BENCH_PREFETCH"])
if os.environ.get("BENCH_METRICS_HISTORY"):  # (the history section: "0" turns the metrics history off)
    COGWORKER["METRICS_HISTORY"] = os.environ["BENCH_METRICS_HISTORY"] == "1"
# Tracing only where the tracing section turns it on ("1": the SDK, its spans dropped): the dev venv
# has opentelemetry installed, and with TRACING's default every other drain paid a no-op span per push
# and per run that a project without OpenTelemetry never pays, beside peers that pay none.
# "bare": TRACING off, the SDK installed and one bare span per run by a server middleware (the floor).
COGWORKER["TRACING"] = os.environ.get("BENCH_TRACING") == "1"
if os.environ.get("BENCH_TRACING") in ("1", "bare"):
    from benchproject.dropped_spans import install

    install()
if os.environ.get("BENCH_TRACING") == "bare":
    COGWORKER["SERVER_MIDDLEWARE"] = ["benchproject.dropped_spans.BareSpan"]
if os.environ.get("BENCH_CPU_AFFINITY"):
    _affinity = os.environ["BENCH_CPU_AFFINITY"]
    COGWORKER["CPU_AFFINITY"] = _affinity if _affinity in ("auto", "none") else [int(c) for c in _affinity.split(",")]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "loggers": {"django_cogworker": {"handlers": ["console"], "level": "WARNING", "propagate": False}},
}
