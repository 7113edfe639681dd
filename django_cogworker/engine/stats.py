"""Processed and failed counters: counted in memory, flushed to Redis every beat.

Not a round trip per job: the heartbeat flushes totals and per-UTC-day
counters in one pipeline. A failed flush keeps the counts for the next one.
"""

from __future__ import annotations

import collections
import threading
import time

from .._types import RedisClient
from ..errors import error_code
from ..keys import Keys
from ..quarantine import quarantine_key

DAY_TTL = 366 * 24 * 3600


def _uncountable(error: Exception) -> bool:
    """INCRBY refused for what the key holds (not for Redis being unable to write)."""
    text = str(error)
    return error_code(error) == "WRONGTYPE" or "not an integer" in text or "would overflow" in text


def day_of(epoch: float) -> str:
    """The UTC day of ``epoch``, as in the per-day counters' keys."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


class Stats:
    """This process's processed and failed counts, kept in memory until the next flush.

    Created by the Launcher. Processor threads call ``job_done`` (one lock,
    no I/O); the heartbeat thread calls ``flush`` each beat, and the
    main thread once more at shutdown. No thread, start or stop of its own.
    """

    def __init__(self, keys: Keys):
        self.keys = keys
        self._lock = threading.Lock()
        self._processed = 0
        self._failed = 0
        # key -> count a failed flush didn't write; the next flush adds it.
        self._unwritten: collections.Counter[str] = collections.Counter()

    def job_done(self, failed: bool) -> None:
        with self._lock:
            self._processed += 1
            if failed:
                self._failed += 1

    def flush(self, redis: RedisClient, now: float | None = None) -> None:
        """Write the counts (totals and per-day) in one pipeline; keep what wasn't written.

        Kept per key: a pipeline is no transaction, so one failing increment (its
        key of the wrong type) leaves the others applied, and carrying all the
        counts over used to count those twice. Raises the first error.
        """
        with self._lock:
            processed, failed = self._processed, self._failed
            self._processed = self._failed = 0
            increments, self._unwritten = self._unwritten, collections.Counter()
        day = day_of(time.time() if now is None else now)
        for name, count in (("processed", processed), ("failed", failed)):
            if count:
                increments[self.keys.stat(name)] += count
                increments[self.keys.stat(name, day)] += count
        if not increments:
            return
        items = list(increments.items())
        totals = {self.keys.stat_processed, self.keys.stat_failed}
        try:
            pipe = redis.pipeline(transaction=False)
            for key, count in items:
                pipe.incrby(key, count)
            for key, _count in items:
                if key not in totals:
                    pipe.expire(key, DAY_TTL)
            results = pipe.execute(raise_on_error=False)
        except Exception:
            self._keep(items)
            raise
        failures = [(item, result) for item, result in zip(items, results, strict=False)
                    if isinstance(result, Exception)]
        if failures:
            self._keep([item for item, _ in failures])
            # A counter that can't be counted on (a list, or a string that isn't a number: a
            # manual write) failed every beat for good; moved aside, its count goes to a fresh one
            # at the next flush.
            unfixable = None
            for (key, _count), error in failures:
                if _uncountable(error) and quarantine_key(redis, self.keys, key, "", f"can't be counted on ({error})"):
                    continue
                unfixable = unfixable or error
            if unfixable is not None:
                raise unfixable

    def _keep(self, items: list[tuple[str, int]]) -> None:
        with self._lock:
            for key, count in items:
                self._unwritten[key] += count
