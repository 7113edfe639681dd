"""Processed and failed counters: counted in memory, flushed to Redis every beat.

Not a round trip per job: the heartbeat flushes totals, per-UTC-day counters and the per-class
hashes (runs, failures, seconds spent; what the metrics view shows by class) in one pipeline. A
failed flush keeps the counts for the next one.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from ...errors import error_code

DAY_TTL = 366 * 24 * 3600


def _uncountable(error: Exception) -> bool:
    """INCRBY refused for what the key holds (not for Redis being unable to write)."""
    text = str(error)
    return (error_code(error) == "WRONGTYPE" or "not an integer" in text or "not a float" in text
            or "would overflow" in text)


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
        # class -> [runs, failures, seconds] since the last flush. The processor names a class
        # only once it found it registered (an unknown one counts in the totals only), so the
        # hashes grow with the project's code, not with whatever names anyone pushes.
        self._classes: dict[str, list[float]] = {}
        # (key, hash field or "") -> count a failed flush didn't write; the next flush adds it.
        self._unwritten: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(float)

    def job_done(self, failed: bool, job_class: str | None = None, seconds: float = 0.0) -> None:
        """Count one run (of ``job_class``, which took ``seconds``): memory only, under one lock.

        The per-class part costs about 100 ns a job (bench: 258 ns a call without it, 360 with);
        it is written by the flush's existing pipeline, never by a round trip of its own.
        """
        with self._lock:
            self._processed += 1
            if failed:
                self._failed += 1
            if job_class is not None:
                counts = self._classes.get(job_class)
                if counts is None:
                    counts = self._classes[job_class] = [0, 0, 0.0]
                counts[0] += 1
                counts[1] += failed
                counts[2] += seconds

    def flush(self, redis: RedisClient, now: float | None = None) -> None:
        """Write the counts (totals, per-day, per-class) in one pipeline; keep what wasn't written.

        Kept per key: a pipeline is no transaction, so one failing increment (its
        key of the wrong type) leaves the others applied, and carrying all the
        counts over used to count those twice. Raises the first error.
        """
        with self._lock:
            processed, failed = self._processed, self._failed
            self._processed = self._failed = 0
            classes, self._classes = self._classes, {}
            increments, self._unwritten = self._unwritten, collections.defaultdict(float)
        day = day_of(time.time() if now is None else now)
        for name, count in (("processed", processed), ("failed", failed)):
            if count:
                increments[self.keys.stat(name), ""] += count
                increments[self.keys.stat(name, day), ""] += count
        k = self.keys
        for job_class, (runs, failed_runs, seconds) in classes.items():
            increments[k.stat_class_processed, job_class] += runs
            if failed_runs:
                increments[k.stat_class_failed, job_class] += failed_runs
            increments[k.stat_class_seconds, job_class] += seconds
        if not increments:
            return
        # Totals before the per-class fields (a scrape reads them in the other order, so it never
        # shows class runs the totals don't count yet), even when a failed flush left classes first.
        items = sorted(increments.items(), key=lambda item: bool(item[0][1]))
        try:
            pipe = redis.pipeline(transaction=False)
            for (key, field), amount in items:
                if not field:
                    pipe.incrby(key, int(amount))
                elif key == k.stat_class_seconds:
                    pipe.hincrbyfloat(key, field, amount)
                else:
                    pipe.hincrby(key, field, int(amount))
            for (key, field), _count in items:
                if not field and key not in (k.stat_processed, k.stat_failed):
                    pipe.expire(key, DAY_TTL)  # (a per-day counter)
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
            for ((key, _field), _count), error in failures:
                if _uncountable(error) and quarantine_key(redis, self.keys, key, "", f"can't be counted on ({error})"):
                    continue
                unfixable = unfixable or error
            if unfixable is not None:
                raise unfixable

    def _keep(self, items: list[tuple[tuple[str, str], float]]) -> None:
        with self._lock:
            for key, count in items:
                self._unwritten[key] += count


def count(redis: RedisClient, key: str) -> None:
    """One more in counter ``key`` (rare events, a command of their own: a job dropped expired or
    cancelled); a failure is only logged."""
    try:
        redis.incr(key)
    except Exception as exc:
        logging.getLogger(__name__).error("counter %s not written: %s: %s", key, type(exc).__name__, exc)
