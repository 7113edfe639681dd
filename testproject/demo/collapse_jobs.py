"""Demo jobs whose pushes collapse (debounce, throttle, keep_last_if_active): what
tests/workers/test_collapse_workers.py runs through real workers. Each RPUSHes its ``n`` onto
``key`` as it runs, so a test reads which pushes ran, in order, and how many times. On the default
queue: a queue of their own that the settings' QUEUES doesn't list is a check warning (W001)."""

from __future__ import annotations

import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis


class DebouncedJob(Job):
    debounce = 1.0

    def perform(self, key: str, n: int) -> None:
        get_redis().rpush(key, n)


class ThrottledJob(Job):
    throttle = 60

    def perform(self, key: str, n: int) -> None:
        get_redis().rpush(key, n)


class KeepLastJob(Job):
    """Runs until ``<key>:go`` is set when ``hold`` (so that a test pushes while it runs)."""

    keep_last_if_active = True
    dedup_key = "keep-last-demo"

    def perform(self, key: str, n: int, hold: bool = False) -> None:
        redis = get_redis()
        redis.rpush(key, n)
        while hold and not redis.exists(f"{key}:go"):
            time.sleep(0.02)
