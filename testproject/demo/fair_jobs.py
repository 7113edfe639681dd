"""Jobs of the fairness tests (tests/workers/test_fairness_workers.py): grouped and prioritized jobs
that record, in Redis, when they start and end, so that a test reads the order they ran in, how often
each ran, and how many of one group ran at once. On the default queue."""

from __future__ import annotations

import os
import time

from django_cogworker import Job, Limiter
from django_cogworker.push.runtime import get_redis


class TurnJob(Job):
    """Job ``n`` of group ``group`` (the class's ``group = "arg:0"``): RPUSH ``<group>:<n>`` onto ``key``
    as it starts and HINCRBY ``<key>:starts`` <jid>; sleep ``seconds``; RPUSH its jid onto ``<key>:ends``."""

    group = "arg:0"

    def perform(self, group: str, n: int, key: str, seconds: float = 0.0) -> None:
        redis = get_redis()
        pipe = redis.pipeline(transaction=False)
        pipe.rpush(key, f"{group}:{n}")
        pipe.hincrby(f"{key}:starts", self.jid, 1)
        pipe.execute()
        if seconds:
            time.sleep(seconds)
        redis.rpush(f"{key}:ends", self.jid)


class RankJob(Job):
    """RPUSH ``tag`` onto ``key`` (pushed with ``set(priority=...)``: the order tags land in is the run order)."""

    def perform(self, key: str, tag: str) -> None:
        get_redis().rpush(key, tag)


class PairedJob(Job):
    """At most two of a group at once (``group_limits``), fleet-wide: while it runs, ``<key>:<group>``
    and ``<key>:all`` count the runs under way (INCR at the start, DECR at the end), and each value seen
    at a start is RPUSHed onto ``<key>:seen:<group>`` and ``<key>:seen:all``; its pid is added to ``<key>:pids``."""

    group = "arg:0"
    group_limits = [Limiter.concurrent("fair-pairs", 2)]

    def perform(self, group: str, key: str, seconds: float = 0.1) -> None:
        redis = get_redis()
        pipe = redis.pipeline(transaction=True)
        pipe.incr(f"{key}:{group}")
        pipe.incr(f"{key}:all")
        mine, everyone = pipe.execute()
        pipe = redis.pipeline(transaction=False)
        pipe.rpush(f"{key}:seen:{group}", mine)
        pipe.rpush(f"{key}:seen:all", everyone)
        pipe.sadd(f"{key}:pids", os.getpid())
        pipe.execute()
        time.sleep(seconds)
        pipe = redis.pipeline(transaction=True)
        pipe.decr(f"{key}:{group}")
        pipe.decr(f"{key}:all")
        pipe.execute()
