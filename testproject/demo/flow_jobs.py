"""Demo jobs of flow control (django_cogworker.features.limits): limited jobs that record how they ran, an
expiring one and a cancellable one. Used by `make demo` and by the fleet tests (test_flow_fleet.py).

The leases read DEMO_LIMIT_LEASE (seconds, default 10): a lease must be at least twice
HEARTBEAT_INTERVAL (5 s by default; the tests' workers beat every 0.5 s and use 2).
"""

from __future__ import annotations

import os
import time

from django_cogworker import Job, Limiter
from django_cogworker.push.runtime import get_redis

LEASE = float(os.environ.get("DEMO_LIMIT_LEASE", "10"))

partner = Limiter.concurrent("demo:partner", 3, lease=LEASE)  # a partner allowing 3 connections
solo = Limiter.concurrent("demo:solo", 1, lease=LEASE)
mail = Limiter.bucket("demo:mail", 50, per=1)  # 50 starts a second
pair = Limiter.concurrent("demo:pair", 1, lease=LEASE)
per_customer = Limiter.concurrent(lambda customer, *_: f"demo:customer:{customer}", 1, lease=LEASE,
                                  family="demo:customer")

# Counts the holders of a run at once, and keeps the highest count seen (one script: no race).
_ENTER = "local n = redis.call('INCR', KEYS[1]) if n > tonumber(redis.call('GET', KEYS[2]) or '0') then " \
         "redis.call('SET', KEYS[2], n) end return n"


def run_counted(key: str, seconds: float) -> None:
    """Sleep ``seconds`` as one of those running at once, counted in ``<key>:now``; the highest
    count seen is kept in ``<key>:max``."""
    redis = get_redis()
    redis.eval(_ENTER, 2, f"{key}:now", f"{key}:max")
    try:
        time.sleep(seconds)
    finally:
        redis.decr(f"{key}:now")


class PartnerCallJob(Job):
    """At most 3 at once, fleet-wide: records how many ran at once (``<key>:max``) and its jid when done."""

    limits = [partner]

    def perform(self, key: str, seconds: float) -> None:
        run_counted(key, seconds)
        get_redis().rpush(f"{key}:done", self.jid or "")


class PairJob(Job):
    """Two limits: one at a time (``demo:pair``) and 50 starts a second (``demo:mail``). Records how
    many ran at once (``<key>:max``) and its jid when done."""

    limits = [pair, mail]

    def perform(self, key: str, seconds: float) -> None:
        run_counted(key, seconds)
        get_redis().rpush(f"{key}:done", self.jid or "")


class SoloJob(Job):
    """One at a time: records its start, then sleeps ``seconds`` on its first run only (a holder to
    kill: its run again after the kill ends at once)."""

    limits = [solo]

    def perform(self, key: str, seconds: float) -> None:
        if get_redis().rpush(f"{key}:started", self.jid or "") == 1:
            time.sleep(seconds)
        get_redis().rpush(f"{key}:done", self.jid or "")


class MailJob(Job):
    """At most 50 starts a second: records when it started (epoch seconds)."""

    limits = [mail]

    def perform(self, key: str) -> None:
        get_redis().rpush(f"{key}:starts", repr(time.time()))


class CustomerJob(Job):
    """One at a time per customer (a limit keyed on the job's first argument)."""

    limits = [per_customer]

    def perform(self, customer: object, key: str, seconds: float = 0.0) -> None:
        get_redis().rpush(f"{key}:ran", str(customer))
        time.sleep(seconds)


class ExpiringJob(Job):
    """Dropped unrun when still waiting 30 s after it was due (``expires_in``)."""

    expires_in = 30

    def perform(self, key: str) -> None:
        get_redis().rpush(f"{key}:ran", self.jid or "")


class CancellableJob(Job):
    """Works in steps of ``step`` seconds and stops between two when cancelled (``self.cancelled``)."""

    def perform(self, key: str, steps: int, step: float = 0.05) -> None:
        redis = get_redis()
        redis.rpush(f"{key}:started", self.jid or "")
        for _ in range(steps):
            if self.cancelled:
                redis.rpush(f"{key}:stopped", self.jid or "")
                return
            time.sleep(step)
        redis.rpush(f"{key}:finished", self.jid or "")
