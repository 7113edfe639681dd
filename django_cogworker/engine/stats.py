"""Processed and failed counters: counted in memory, flushed to Redis every beat.

Not a round trip per job: the heartbeat flushes totals and per-UTC-day
counters in one pipeline. A failed flush keeps the counts for the next one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..keys import Keys

DAY_TTL = 366 * 24 * 3600


def day_of(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


class Stats:
    def __init__(self, keys: Keys):
        self.keys = keys
        self._lock = threading.Lock()
        self._processed = 0
        self._failed = 0

    def job_done(self, failed: bool) -> None:
        with self._lock:
            self._processed += 1
            if failed:
                self._failed += 1

    def flush(self, redis: Any, now: float | None = None) -> None:
        with self._lock:
            processed, failed = self._processed, self._failed
            self._processed = self._failed = 0
        if not processed and not failed:
            return
        day = day_of(time.time() if now is None else now)
        try:
            pipe = redis.pipeline(transaction=False)
            for name, count in (("processed", processed), ("failed", failed)):
                if count:
                    pipe.incrby(self.keys.stat(name), count)
                    pipe.incrby(self.keys.stat(name, day), count)
                    pipe.expire(self.keys.stat(name, day), DAY_TTL)
            pipe.execute()
        except Exception:
            with self._lock:
                self._processed += processed
                self._failed += failed
            raise
