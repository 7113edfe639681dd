"""Data for the admin tests: payloads, users, and a Redis seeded with one of everything the pages show.

Payloads are written the way the engine writes them (``payload.encode``), with
``XSS`` in every field a user can control: args, kwargs, error messages, queue
names, periodic entries, quarantined keys' contents.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis as redis_lib

from django_cogworker import payload as payloads
from django_cogworker.engine.key_guard import KeyGuard
from django_cogworker.engine.stats import day_of
from django_cogworker.keys import Keys
from django_cogworker.periodic.entries import Entry
from django_cogworker.periodic.ticker import Ticker

XSS = "<script>alert('cogworker')</script>"
XSS_ESCAPED = "&lt;script&gt;alert(&#x27;cogworker&#x27;)&lt;/script&gt;"
XSS_QUEUE = f"evil{XSS}"
RECORD_JOB = "testproject.demo.jobs.RecordJob"
FAIL_JOB = "testproject.demo.jobs.FailJob"
KEYS = Keys()


def job(klass: str = RECORD_JOB, args: list | None = None, kwargs: dict | None = None, queue: str = "default",
        **fields: Any) -> dict[str, Any]:
    now = time.time()
    return {"jid": payloads.new_jid(), "class": klass, "args": args if args is not None else ["k"],
            "kwargs": kwargs or {}, "queue": queue, "retry": 2, "created_at": now - 120, **fields}


def failed(klass: str = FAIL_JOB, message: str = "boom", **fields: Any) -> dict[str, Any]:
    now = time.time()
    return job(klass, **{"error_class": "RuntimeError", "error_message": message, "failed_at": now - 60,
                         "retry_count": 1, "retried_at": now - 30, "enqueued_at": now - 61,
                         "error_backtrace": ["Traceback (most recent call last):",
                                             f'  File "jobs.py", line 1, in {XSS}', f"RuntimeError: {message}"],
                         **fields})


def zadd(r: redis_lib.Redis, key: str, payload: dict[str, Any], score: float) -> str:
    """Add ``payload`` to a sorted set; return its admin token."""
    raw = payloads.encode(payload)
    r.zadd(key, {raw: score})
    return f"{float(score)!r}|{payload['jid']}"


def push(r: redis_lib.Redis, payload: dict[str, Any]) -> None:
    payload.setdefault("enqueued_at", time.time() - 5)
    r.sadd(KEYS.queues, payload["queue"])
    r.lpush(KEYS.queue(payload["queue"]), payloads.encode(payload))


def fake_process(r: redis_lib.Redis, identity: str = "host:4242:abc123", *, busy_job: dict | None = None,
                 quiet: bool = False, **extra_info: Any) -> str:
    """A process hash and workers hash as the heartbeat writes them (without a running process)."""
    info = {"hostname": "host", "pid": 4242, "tag": "web", "identity": identity, "started_at": time.time() - 3600,
            "queues": ["default", "mail"], "concurrency": 5, "fetch": "reliable", "version": "0.1.0",
            "rss_kb": 51200, **extra_info}
    r.hset(KEYS.process(identity), mapping={"info": json.dumps(info), "busy": "1" if busy_job else "0",
                                            "quiet": str(quiet).lower(), "beat": repr(time.time())})
    r.expire(KEYS.process(identity), 60)
    r.sadd(KEYS.processes, identity)
    if busy_job:
        r.hset(KEYS.workers(identity), "cogworker-processor-1", json.dumps(
            {"queue": busy_job["queue"], "payload": payloads.encode(busy_job), "run_at": time.time() - 3}))
    return identity


def publish_periodic(redis: Any, *entries: Entry) -> None:
    """Publish entries exactly as a worker's ticker does at start."""
    Ticker(redis, KEYS, entries, push=lambda p: None, ready=lambda: True, catch_up=False,
           catch_up_max=1).publish_schedule()


def quarantine(r: redis_lib.Redis, queue: str = "broken") -> str:
    """Put a hash in ``queue``'s list key and let the key guard move it; return the quarantine name.

    ``r`` must return bytes (as the engine's client does).
    """
    key = KEYS.queue(queue)
    r.delete(key)
    r.hset(key, mapping={"field": XSS, "other": "value"})
    assert KeyGuard(r, KEYS, [queue]).check() == [key]
    (name,) = [n for n in r.scan_iter(match=KEYS.quarantine_prefix + "*") if key.encode() in n]
    return name.decode()


def seed(r: redis_lib.Redis) -> dict[str, Any]:
    """One of everything; returns the tokens, jids and names the tests act on. ``r`` returns bytes."""
    now = time.time()
    seeded: dict[str, Any] = {}
    seeded["quarantined"] = quarantine(r, "broken")
    for i in range(3):
        push(r, job(args=[f"queued-{i}", XSS], kwargs={"note": XSS}))
    push(r, job(queue="mail", args=["m"]))
    push(r, job(queue=XSS_QUEUE, args=["x"]))
    seeded["scheduled"] = zadd(r, KEYS.schedule, job(args=["later", XSS], kwargs={"why": XSS}), now + 3600)
    seeded["scheduled_2"] = zadd(r, KEYS.schedule, job(args=["later-2"]), now + 7200)
    seeded["retry"] = zadd(r, KEYS.retry, failed(message=f"retry {XSS}", args=[XSS]), now + 600)
    seeded["retry_2"] = zadd(r, KEYS.retry, failed(message="second"), now + 900)
    seeded["dead"] = zadd(r, KEYS.dead, failed(klass=RECORD_JOB, message=f"dead {XSS}", args=["seed:dead"],
                                               kwargs={"why": XSS}, dead_reason="retries exhausted"), now - 10)
    seeded["dead_2"] = zadd(r, KEYS.dead, failed(message="dead two", dead_reason="retries exhausted"), now - 20)
    seeded["process"] = fake_process(r, busy_job=job(args=["running", XSS]))
    publish_periodic(r, Entry(name="nightly-report", cron="0 3 * * *", job=RECORD_JOB, args=("periodic:ran", XSS),
                              tz="Europe/Paris"),
                     Entry(name="every-minute", cron="* * * * *", job=RECORD_JOB, args=("periodic:minute",),
                           until_executed=True))
    r.set(KEYS.periodic_last_slot("nightly-report"), int(now - 86400))
    for back in range(30):
        day = day_of(now - 86400 * back)
        r.set(KEYS.stat("processed", day), 1000 + 37 * ((back * 7) % 11))
        r.set(KEYS.stat("failed", day), 20 + 5 * (back % 4))
    r.set(KEYS.stat_processed, 123456)
    r.set(KEYS.stat_failed, 789)
    return seeded
