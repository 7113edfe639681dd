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
(EXPIRE with a time gone deletes it), nor kept.

Through an outage the counts wait in memory, bounded: at most UNWRITTEN_MINUTES minutes per queue
and class (those counted and not yet flushed, and again those a failed flush kept). Past that, the
oldest minute's counts are kept only in its hour (and the all-time totals): the minutes of a long
outage are lost, its hours whole. The flush that next writes says, in one WARNING, how many minutes
were dropped.
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
# Minutes of counts a process keeps per queue and class while Redis takes none (the oldest folded
# into their hours past that): 60 rows of WIDTH counts a class, where a day's outage held 1,440.
UNWRITTEN_MINUTES = 60


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
        # The minutes each (queue, class) has rows for in _counts, and the counts of minutes folded
        # out of it past UNWRITTEN_MINUTES, by (the hour's first minute, queue, class): written to
        # their hour (and the totals) only.
        self._minutes: dict[tuple[str, str], list[int]] = {}
        self._hourly: dict[tuple[int, str, str], list[float]] = {}
        self._dropped = 0  # minute buckets dropped since a flush last wrote (said by the next that does)
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
                counts = self._new_row(minute, queue, job_class)
            counts[P] += 1
            counts[F] += failed
            counts[MS] += ms
            counts[slot] += 1

    def _new_row(self, minute: int, queue: str, job_class: str) -> list[float]:
        """(Under the lock, once a minute per queue and class.) The minute's row; when its class holds
        more than UNWRITTEN_MINUTES (Redis away: no flush took them), the oldest folded into its hour."""
        row = self._counts[minute, queue, job_class] = [0.0] * WIDTH
        held = self._minutes.setdefault((queue, job_class), [])
        held.append(minute)
        if len(held) > UNWRITTEN_MINUTES:
            oldest = min(held)  # (the new one, after a clock read back: its run counted in its hour)
            held.remove(oldest)
            folded = self._counts.pop((oldest, queue, job_class))
            hour = (oldest - oldest % 60, queue, job_class)
            into = self._hourly.get(hour)
            if into is None:
                into = self._hourly[hour] = [0.0] * WIDTH
            for i, amount in enumerate(folded):
                into[i] += amount
            self._dropped += 1
        return row

    def flush(self, redis: RedisClient) -> None:
        """Write what was counted (and what a failed flush kept) in one pipeline; raise the first
        error that isn't a key of the wrong type (that one is moved aside, its counts kept)."""
        if self._anchored_at is None or self._monotonic() - self._anchored_at >= ANCHOR_EVERY:
            try:
                self.anchor(self.redis_now(redis))
            except Exception as exc:  # (the counts are written all the same, on the clock it had)
                logger.warning("metrics history: Redis's TIME not read (%s: %s)", type(exc).__name__, exc)
        with self._lock:
            counts, self._counts, self._minutes = self._counts, {}, {}
            hourly, self._hourly = self._hourly, {}
            increments, self._unwritten = self._unwritten, collections.defaultdict(float)
            until, self._until = self._until, {}
        now = self.now()
        totals = self.keys.history_totals
        rows = [(slot, row, True) for slot, row in counts.items()]
        rows += [(slot, row, False) for slot, row in hourly.items()]  # (their minutes dropped: the hour only)
        for (minute, queue, job_class), row, by_minute in rows:
            start = float(minute * 60)
            hour = start - start % 3600
            slots = [(self.keys.history("m:" + minute_stamp(start)), start + 60 + MINUTE_KEEP)] if by_minute else []
            slots.append((self.keys.history("h:" + hour_stamp(start)), hour + 3600 + HOUR_KEEP))
            for key, ends in slots:
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
            self._said()
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
        if len(failures) < len(items):
            self._said()
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

    def _said(self) -> None:
        """A flush wrote: say how many minutes were dropped since one last did (once, not a line each)."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            logger.warning("metrics history: %d minute bucket(s) dropped while Redis took no counts (a queue and "
                           "class keeps its last %d minutes in memory; the counts of the older ones are in "
                           "their hours)", dropped, UNWRITTEN_MINUTES)

    def _keep(self, items: list[tuple[tuple[str, str], float]], until: dict[str, float]) -> None:
        with self._lock:
            for kf, amount in items:
                self._unwritten[kf] += amount
                if kf[0] in until:
                    self._until[kf[0]] = until[kf[0]]
            self._dropped += self._bound()

    def _bound(self) -> int:
        """(Under the lock.) Drop from what failed flushes kept the minutes of each queue and class
        past its last UNWRITTEN_MINUTES (their hours and totals, kept apart, stay whole); how many."""
        minutes = self.keys.history("m:")
        held: dict[str, set[str]] = {}
        for key, name in self._unwritten:
            if key.startswith(minutes):
                held.setdefault(name.rpartition("|")[0], set()).add(key)
        gone = {(key, series) for series, keys in held.items() if len(keys) > UNWRITTEN_MINUTES
                for key in sorted(keys)[:len(keys) - UNWRITTEN_MINUTES]}  # (stamps sort oldest first)
        if gone:
            for kf in [kf for kf in self._unwritten if (kf[0], kf[1].rpartition("|")[0]) in gone]:
                del self._unwritten[kf]
            live = {key for key, _ in self._unwritten}
            self._until = {key: ends for key, ends in self._until.items() if key in live}
        return len(gone)
