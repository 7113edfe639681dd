"""A process's runs counted in memory by minute, queue and class, and written once a beat.

Which minute a run belongs to: the minute (Redis's clock) it finished in, read as this host's
monotonic clock plus an offset taken from Redis's TIME (at start, then once a minute). Not the
host's wall clock: one stepped by NTP or by hand (an hour back, a day ahead) would file a run in
another minute or hour; the monotonic clock never jumps, and Redis's is the one every process of
the fleet shares (a process on a skewed host files its runs where the others do). Not the time
of the flush either: a flush held back by an outage would file minutes of runs in the minute
Redis came back.

A key's TTL is counted from its own minute (72 h after it ends; an hour's, 30 days), never from
the write: a minute written late lives no longer than its neighbours, and counts kept longer
than that (an outage of days) are dropped, not written with a TTL that would delete the key
(EXPIRE with a time gone deletes it), nor kept: the in-memory counts stay bounded.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable

from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from ...engine.loops import redis_time
from ...errors import error_code
from .buckets import B0, MS, NAMES, WIDTH, F, P, bucket_of, encode, field

logger = logging.getLogger(__name__)

MINUTE_KEEP = 72 * 3600  # seconds a minute's hash lives past the minute's end
HOUR_KEEP = 30 * 24 * 3600  # an hour's, past the hour's end
ANCHOR_EVERY = 60.0  # seconds between two reads of Redis's TIME (the monotonic clock drifts ~ppm)


def minute_stamp(epoch: float) -> str:
    return time.strftime("%Y%m%d%H%M", time.gmtime(epoch))


def hour_stamp(epoch: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(epoch))


def _uncountable(error: Exception) -> bool:
    text = str(error)
    return error_code(error) == "WRONGTYPE" or "not an integer" in text or "not a float" in text


class Recorder:
    """What this process ran since its last flush, by (minute, queue, class).

    Made by the History feature (hook.py), one per worker process. Processor threads call
    ``record`` (one lock, no I/O); the feature-chores thread calls ``flush`` after each beat, and
    the feature's ``stop`` once more at shutdown (two flushes at once each write what they took).
    ``anchor`` sets the clock from Redis's TIME. No thread of its own.
    """

    def __init__(self, keys: Keys, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 redis_now: Callable[[RedisClient], float] = redis_time):
        self.keys = keys
        self._monotonic = monotonic
        self.redis_now = redis_now
        self._offset = wall() - monotonic()  # (until Redis's TIME is read: this host's clock)
        self._anchored_at: float | None = None
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str, str], list[float]] = {}
        # (key, field) -> amount a failed flush didn't write, and key -> when it may expire.
        self._unwritten: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(float)
        self._until: dict[str, float] = {}

    def now(self) -> float:
        """Redis's time as this process reckons it (epoch seconds)."""
        return self._monotonic() + self._offset

    def anchor(self, redis_now: float) -> None:
        self._offset = redis_now - self._monotonic()
        self._anchored_at = self._monotonic()

    def record(self, queue: str, job_class: str, seconds: float, failed: bool) -> None:
        """Count one run that just ended: memory only, under one lock."""
        minute = int(self.now() // 60)
        ms = seconds * 1000.0
        slot = B0 + bucket_of(ms)
        with self._lock:
            counts = self._counts.get((minute, queue, job_class))
            if counts is None:
                counts = self._counts[minute, queue, job_class] = [0.0] * WIDTH
            counts[P] += 1
            counts[F] += failed
            counts[MS] += ms
            counts[slot] += 1

    def flush(self, redis: RedisClient) -> None:
        """Write what was counted (and what a failed flush kept) in one pipeline; raise the first
        error that isn't a key of the wrong type (that one is moved aside, its counts kept)."""
        if self._anchored_at is None or self._monotonic() - self._anchored_at >= ANCHOR_EVERY:
            try:
                self.anchor(self.redis_now(redis))
            except Exception as exc:  # (the counts are written all the same, on the clock it had)
                logger.warning("metrics history: Redis's TIME not read (%s: %s)", type(exc).__name__, exc)
        with self._lock:
            counts, self._counts = self._counts, {}
            increments, self._unwritten = self._unwritten, collections.defaultdict(float)
            until, self._until = self._until, {}
        now = self.now()
        totals = self.keys.history_totals
        for (minute, queue, job_class), row in counts.items():
            start = float(minute * 60)
            hour = start - start % 3600
            for key, ends in ((self.keys.history("m:" + minute_stamp(start)), start + 60 + MINUTE_KEEP),
                              (self.keys.history("h:" + hour_stamp(start)), hour + 3600 + HOUR_KEEP)):
                until[key] = ends
                for i, amount in enumerate(row):
                    if amount:
                        increments[key, field(queue, job_class, NAMES[i])] += amount
            for i in range(MS, WIDTH):
                if row[i]:
                    increments[totals, f"{encode(job_class)}|{NAMES[i]}"] += row[i]
        gone = {key for key, ends in until.items() if ends <= now + 1}
        if gone:
            logger.warning("metrics history: counts for %d key(s) past their retention dropped (kept through an "
                           "outage that long)", len(gone))
        items = [(kf, amount) for kf, amount in increments.items() if kf[0] not in gone]
        if not items:
            return
        expiring = {key: ends for key, ends in until.items() if key not in gone}
        try:
            pipe = redis.pipeline(transaction=False)
            for (key, name), amount in items:
                if name.endswith("|ms"):
                    pipe.hincrbyfloat(key, name, round(amount, 3))
                else:
                    pipe.hincrby(key, name, int(amount))
            for key, ends in expiring.items():
                pipe.expire(key, math.ceil(ends - now))
            results = pipe.execute(raise_on_error=False)
        except Exception:
            self._keep(items, expiring)
            raise
        failures = [(item, result) for item, result in zip(items, results, strict=False)
                    if isinstance(result, Exception)]
        if failures:
            self._keep([item for item, _ in failures], expiring)
            unfixable: Exception | None = None
            moved: set[str] = set()
            for ((key, _name), _amount), error in failures:
                # (each of the key's fields failed alike: it is moved once, a fresh one counts them all)
                if key in moved or (_uncountable(error) and quarantine_key(redis, self.keys, key, "",
                                                                           f"can't be counted on ({error})")):
                    moved.add(key)
                    continue
                unfixable = unfixable or error
            if unfixable is not None:
                raise unfixable

    def _keep(self, items: list[tuple[tuple[str, str], float]], until: dict[str, float]) -> None:
        with self._lock:
            for kf, amount in items:
                self._unwritten[kf] += amount
                if kf[0] in until:
                    self._until[kf[0]] = until[kf[0]]
