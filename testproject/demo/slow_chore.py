"""A feature whose heartbeat chore is slow, as a slow Redis call or a lock held elsewhere makes one.

Named in ``COGWORKER["FEATURES"]`` (``COGWORKER_FEATURES`` in the tests: test_health_workers.py) as
``"testproject.demo.slow_chore.slow_chore"``. Each round of its chore counts itself in the Redis
key ``<prefix>slow-chore:started``, sleeps ``COGWORKER_SLOW_CHORE_SECONDS`` (20 by default), then
counts itself in ``<prefix>slow-chore:done``: a test reads there whether a round is under way.
"""

from __future__ import annotations

import os
import time

from django_cogworker.features import Feature, WorkerParts


class SlowChore(Feature):
    name = "slow-chore"

    def __init__(self, prefix: str, seconds: float):
        self.prefix = prefix
        self.seconds = seconds

    def chores(self):
        return (self.dawdle,)

    def dawdle(self, redis) -> None:
        redis.incr(self.prefix + "slow-chore:started")
        time.sleep(self.seconds)
        redis.incr(self.prefix + "slow-chore:done")


def slow_chore(parts: WorkerParts) -> SlowChore:
    return SlowChore(parts.keys.prefix, float(os.environ.get("COGWORKER_SLOW_CHORE_SECONDS", "20")))
