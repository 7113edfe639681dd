"""Suite-wide fixtures: every test runs against a private redis-server, never a shared Redis.

The server is started when this module is imported, and COGWORKER_REDIS_URL is pointed at it.
pytest-django sets Django up (settings + app registry, so AppConfig.ready()) in its
pytest_load_initial_conftests hook, *before* this conftest is imported; hence the call to
django_cogworker.push.runtime.reset() below, which drops config/clients built from the earlier env.
Worker subprocesses (helpers.Worker) inherit the variable with os.environ.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os

import pytest
import redis
from helpers import RedisServer, kill_started

# Never skip for want of Redis: a suite that silently skips proves nothing. RedisServer raises
# a clear error when redis-server is missing.
_redis = RedisServer().start()
atexit.register(_redis.cleanup)  # pytest_unconfigure is the normal path; this covers crashes
os.environ["COGWORKER_REDIS_URL"] = _redis.url


def _reset_runtime() -> None:
    # The package is optional here only while runtime.py does not exist yet; a runtime module
    # that exists but fails to import must fail the run.
    if importlib.util.find_spec("django_cogworker") and importlib.util.find_spec("django_cogworker.push.runtime"):
        reset = getattr(importlib.import_module("django_cogworker.push.runtime"), "reset", None)
        if reset is not None:
            reset()


_reset_runtime()


def pytest_report_header(config):
    return f"cogworker test redis: {_redis.url} (pid {_redis.pid}, dir {_redis.dir})"


def pytest_unconfigure(config):
    _redis.cleanup()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the suite's private Redis (db 0)."""
    return _redis.url


@pytest.fixture(autouse=True)
def clean_redis(redis_url):
    """Every test starts from an empty db. FLUSHDB, never FLUSHALL: only our db is ours to wipe.
    And ends with every worker process it started killed, with their children: one left running
    wrote into the next test's db after its FLUSHDB (helpers.STARTED)."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
    finally:
        client.close()
    yield
    kill_started()


@pytest.fixture
def r(redis_url):
    """A decoded (str) client on the suite's Redis."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def rb(redis_url):
    """A bytes client on the suite's Redis, as the engine uses."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
