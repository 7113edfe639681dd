"""Tasks of the demo project (django.tasks ``@task`` functions run by cogworker's backend).

Autodiscovered by django_cogworker as ``<app>/tasks.py`` when TASKS names its backend; used by
tests/test_tasks.py, so each must keep the behaviour its docstring describes.
"""

import asyncio
import time

from django_cogworker.push.runtime import get_redis
from django_cogworker.tasks.api import task

from .flow_jobs import partner, run_counted


@task
def add(a, b):
    """Return a + b."""
    return a + b


@task
async def async_add(a, b):
    """Return a + b, after an await."""
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True, retry=3)
def flaky(context, key, fails):
    """RPUSH key the attempt number; raise on the first `fails` attempts, then return the attempt."""
    get_redis().rpush(key, context.attempt)
    if context.attempt <= fails:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "result_id": context.task_result.id}


@task(retry=0)
def hold(key):
    """RPUSH key "started", then wait until the Redis key `key`:go exists (at most 30 s); return "held"."""
    redis = get_redis()
    redis.rpush(key, "started")
    deadline = time.monotonic() + 30
    while not redis.exists(f"{key}:go") and time.monotonic() < deadline:
        time.sleep(0.02)
    return "held"


@task(retry=0, timeout=0.5)
def spin(seconds):
    """Busy-loop `seconds` (Python bytecode: a timeout interrupts it); return "spun"."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


@task(retry=0, queue_name="mail")
def fail(message):
    """Raise ValueError(message)."""
    raise ValueError(message)


@task(unique_for=60)
def unique_add(a, b):
    """Return a + b; unique while queued (a minute)."""
    return a + b


@task
def explode(message):
    """Raise ValueError(message); no retry given, so the default backend's (none)."""
    raise ValueError(message)


@task(backend="retrying", takes_context=True)
def doomed(context, key):
    """RPUSH key the attempt number, then raise: retried as often as the "retrying" backend's OPTIONS["RETRY"]."""
    get_redis().rpush(key, context.attempt)
    raise RuntimeError(f"attempt {context.attempt} of doomed fails")


@task(retry=0, expires_in=0.5)
def perishable(key):
    """RPUSH key "ran"; dropped unrun when still waiting 0.5 s after it was due (expires_in)."""
    get_redis().rpush(key, "ran")
    return "ran"


@task(limits=[partner])
def limited(key, seconds):
    """At most 3 at once fleet-wide (``demo:partner``, a Limiter.concurrent): record how many ran at
    once in `key`:max, sleep `seconds`, return "done"."""
    run_counted(key, seconds)
    return "done"


@task(encrypt=True)
def secret_task(key, secret):
    """RPUSH key the SHA-256 of `secret` (its arguments are stored encrypted: tests/test_encryption_workers.py)."""
    from .secret_jobs import seen

    get_redis().rpush(key, seen(secret))
    return "ok"


@task
def counting(key, total):
    """Report each of `total` steps done (``report_progress``), RPUSH key "done", return `total`."""
    from django_cogworker.tasks import report_progress

    for n in range(1, total + 1):
        report_progress(n, total, note=f"step {n}")
    get_redis().rpush(key, "done")
    return total
