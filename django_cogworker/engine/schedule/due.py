"""The due sweep: due entries of ``schedule`` and ``retry`` to their queues, poison to dead.

A sweep reads both sets in one round trip: of each, its first BATCH entries
scored up to now, and the first entry scored after now (the peek: the next
due time). Each due entry is moved to the back of its queue by
CLAIM_AND_REQUEUE (push first, then remove; a process that loses the race
moves nothing); a full batch is followed by another read. An entry that can't
be read, names no queue, or reads but can't be written back goes to dead with
the reason (MOVE_BETWEEN_ZSETS). One that stays (its queue key of the wrong
type) is read past, up to MAX_STUCK per sweep, so it doesn't hold up those
behind it.

The sweep also keeps what is known of the next due times: the peeks, and the
due times heard of (``expect``: messages on ``schedule:wake``, retries filed
by this process). ``due_wake`` turns them into the moment of the next sweep.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib

from ...broker import crossings, scripts
from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...errors import is_unavailable
from ...push import payload as payloads
from ..settle.retry import RetryPolicy

logger = logging.getLogger(__name__)

BATCH = 100
# What became of one due entry (_requeue).
MOVED, GONE, STUCK = 1, 0, -1
# Due entries a sweep reads past when they can't be moved, before it leaves the rest to the next.
MAX_STUCK = 10 * BATCH
# Shortest gap between a sweep and a sweep woken by a due time.
DUE_FLOOR = 0.2
# A sweep woken by a due time comes up to this long after it, at random.
DUE_JITTER = 0.1
# Due times heard of and not yet swept, kept in memory (the earliest; the peeks find the rest).
MAX_HINTS = 64
# Seconds between two ERROR lines about entries stuck on one key (the others go to DEBUG): an
# entry that can't move is met again at every sweep, and a queue key of the wrong type wrote
# one line per entry per sweep, 7,165 lines in 57 s.
STUCK_LOG_EVERY = 60.0


class DueSweep:
    """Move due entries to their queues, and know when the next ones fall due.

    Created by the Poller, which calls ``sweep`` on its thread (cogworker-poller)
    in every timed round and whenever ``due_wake`` comes. ``expect`` may be
    called from any thread (the subscription's messages, the retry policy).
    No thread of its own; ``stopped`` (the poller's stop event) ends a long
    sweep between two batches.
    """

    def __init__(self, redis: RedisClient, keys: Keys, retry: RetryPolicy, rng: random.Random,
                 clock: Callable[[], float], stopped: threading.Event):
        self.redis = redis
        self.keys = keys
        self.retry = retry
        self.rng = rng
        self.clock = clock
        self.stopped = stopped
        # Due times (epoch seconds, sorted) heard of by message or expect(), not yet swept.
        self._hints: list[float] = []
        self._hints_lock = threading.Lock()
        # The earliest entry after the last sweep's cut-off, as its peek found it.
        self._peeked: float | None = None
        # key -> the time up to which the last sweep read it (its cut-off)
        self._cutoffs: dict[str, float] = {}
        self._last_sweep = -math.inf  # (monotonic) end of the last sweep
        self._jitter = 0.0
        # key -> (monotonic time of its last ERROR line, lines sent to DEBUG since)
        self._stuck_logged: dict[str, tuple[float, int]] = {}

    def sweep(self) -> int:
        """Move every due entry to its queue, noting what falls due next; return how many moved."""
        started = self.clock()
        moved = self.enqueue_due()
        self.forget_due(min(self._cutoffs.get(k, started) for k in (self.keys.schedule, self.keys.retry)))
        self._last_sweep = time.monotonic()
        self._jitter = self.rng.uniform(0.0, DUE_JITTER)
        return moved

    def drop_wake(self) -> None:
        """A sweep woken by a due time failed for a bug: forget what woke it, so the timed rounds
        retry it (rather than this sweep being retried every few seconds)."""
        self._peeked = None
        self.forget_due(self.clock())
        self._last_sweep = time.monotonic()

    def enqueue_due(self) -> int:
        """Move every due entry of ``schedule`` and ``retry`` to its queue; return how many.

        Both sets are read in one round trip: of each, its first BATCH due
        entries, and the first entry not yet due with its score (the peek,
        ``_peeked``: the next wake-up). A sweep that finds nothing due reads
        one entry per set.
        """
        keys = (self.keys.schedule, self.keys.retry)
        self._cutoffs = {}
        self._peeked = None
        now = self.clock()
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            _read_head(pipe, key, now, 0)
        replies = pipe.execute(raise_on_error=False)
        moved = 0
        for index, key in enumerate(keys):
            due, after = replies[2 * index:2 * index + 2]
            error = next((reply for reply in (due, after) if isinstance(reply, Exception)), None)
            if isinstance(error, redis_lib.exceptions.ResponseError):
                # (schedule of the wrong type must not hold up retry; the key guard moves it aside)
                self._report_stuck(key, "due entries of %s not moved: %s", key, error)
                continue
            if error is not None:
                raise error
            moved += self._enqueue_due_from(key, due, after, now)
        return moved

    def _enqueue_due_from(self, key: str, due: list[tuple[bytes, float]], after: list[tuple[bytes, float]],
                          now: float) -> int:
        """Move ``due`` (the first due entries of ``key`` at ``now``; ``after``: the first entry not
        yet due, if any), then read on while batches come back full."""
        moved = 0
        stuck = 0  # due entries that stayed (their queue key holds the wrong type, say): read past them
        while True:
            self._cutoffs[key] = now
            if after:
                self._note_next(after[0][1])
            outcomes = [self._requeue(key, raw, score) for raw, score in due]
            moved += outcomes.count(MOVED)
            stuck += outcomes.count(STUCK)
            if len(due) < BATCH or stuck >= MAX_STUCK or self.stopped.is_set():
                return moved  # (the timed rounds retry what stayed; no spinning on it)
            now = self.clock()
            pipe = self.redis.pipeline(transaction=False)
            _read_head(pipe, key, now, stuck)
            due, after = pipe.execute()

    # -- when the next sweep comes ----------------------------------------------------------------

    def _note_next(self, score: float) -> None:
        if self._peeked is None or score < self._peeked:
            self._peeked = score

    def expect(self, at: float) -> None:
        """Sweep at ``at`` (epoch seconds): an entry falls due then. Any thread may call it."""
        if not math.isfinite(at):
            return
        with self._hints_lock:
            bisect.insort(self._hints, at)
            del self._hints[MAX_HINTS:]

    def forget_due(self, cutoff: float) -> None:
        """A sweep read the sets up to ``cutoff``: due times up to it are dealt with."""
        with self._hints_lock:
            del self._hints[:bisect.bisect_right(self._hints, cutoff)]

    def next_due(self) -> float | None:
        """The earliest due time known (epoch seconds), or None."""
        with self._hints_lock:
            hint = self._hints[0] if self._hints else None
        known = [t for t in (hint, self._peeked) if t is not None]
        return min(known) if known else None

    def due_wake(self) -> float:
        """When (monotonic) the next sweep woken by a due time is to run; inf if none is known."""
        due = self.next_due()
        if due is None:
            return math.inf
        return max(time.monotonic() + (due - self.clock()) + self._jitter, self._last_sweep + DUE_FLOOR)

    # -- moving one entry -------------------------------------------------------------------------

    def _requeue(self, source: str, raw: bytes, score: float) -> int:
        """Push one due entry to its queue, then remove it (one script); poison goes to dead.

        Returns MOVED, GONE (another process moved it first) or STUCK (it stays: its queue
        key holds the wrong type, say). Poison, an entry that can't be read, or that reads
        but can't be written back, goes to dead with the reason: one such entry used to
        raise out of the sweep at every round, and hold back every due entry after it, in
        ``schedule`` and ``retry`` alike, on every process.
        """
        try:
            payload = payloads.decode(raw)
            queue = payload.get("queue")
            if not isinstance(queue, str) or not queue:
                raise payloads.PayloadError(f"payload names no queue: {queue!r}")
        except payloads.PayloadError as exc:
            dead: bytes | str = payloads.encode(payloads.dead_letter(raw, str(exc), self.clock()))
            return self._bury(source, raw, dead, f"unreadable entry in {source}", exc)
        payload["enqueued_at"] = self.clock()
        payload.pop("at", None)
        try:
            # Built here, not by Lua's cjson, which would round large integers in args.
            new_raw = payloads.encode(payload)
            if self.keys.spread:  # (a cluster: the queue is in another slot; leased, pushed, removed)
                outcome = crossings.zset_to_queues(self.redis, self.keys, source, [(raw, score, queue, new_raw)],
                                                   self.clock())[0]
                if isinstance(outcome, Exception):
                    raise outcome
                return MOVED if outcome == crossings.MOVED else GONE
            return int(scripts.CLAIM_AND_REQUEUE(
                self.redis, [source, self.keys.queues, self.keys.queue(queue)], [raw, queue, new_raw]))
        except Exception as exc:
            if is_unavailable(exc):
                raise  # (Redis away or refusing writes: the round fails, logged once by its watchdog)
            if isinstance(exc, redis_lib.exceptions.ResponseError):  # (the key guard moves that key aside)
                self._report_stuck(self.keys.queue(queue), "could not move jid=%s to queue %r: %s (left in %s)",
                                   payloads.printable(payload.get("jid")), queue, exc, source)
                return STUCK
            # It reads, but can't be written back (1e309 reads as inf, which JSON can't hold; a queue
            # name Redis can't be sent): kept as it is, with the reason appended.
            reason = f"could not be moved to its queue ({payloads.error_class(exc)}: {payloads.error_message(exc)})"
            fields: dict[str, Any] = {"dead_reason": reason}
            if "failed_at" not in payload:
                fields["failed_at"] = self.clock()
            dead = payloads.append_fields(raw, fields)
            return self._bury(source, raw, dead, f"jid={payloads.printable(payload.get('jid'))} in {source}", reason)

    def _bury(self, source: str, raw: bytes, dead: bytes | str, what: str, reason: Any) -> int:
        """Move ``raw`` from ``source`` to dead as ``dead``, in one script; MOVED, GONE or STUCK."""
        below, cap = self.retry.dead_trim()
        try:
            moved = int(scripts.MOVE_BETWEEN_ZSETS(self.redis, [source, self.keys.dead],
                                                   [raw, self.clock(), dead, below, cap]))
        except Exception as error:
            if is_unavailable(error):
                raise  # (Redis refusing writes: the round fails, logged once by its watchdog)
            self._report_stuck(source, "%s (%s) not moved to dead: %s", what, payloads.printable(reason, 1000),
                               error)
            return STUCK
        if moved:
            logger.error("%s moved to dead: %s", what, payloads.printable(reason, payloads.ERROR_MESSAGE_LIMIT))
        return MOVED if moved else GONE

    def _report_stuck(self, key: str, message: str, *args: Any) -> None:
        """Log at ERROR an entry stuck on ``key``, once per STUCK_LOG_EVERY per key; the rest at DEBUG."""
        now = time.monotonic()
        last, quiet = self._stuck_logged.get(key, (-math.inf, 0))
        if now - last < STUCK_LOG_EVERY:
            self._stuck_logged[key] = (last, quiet + 1)
            logger.debug(message, *args)
            return
        self._stuck_logged[key] = (now, 0)
        if quiet:
            message += "; %d more like it since the last report"
            args = (*args, quiet)
        logger.error(message + " (logged once a minute for %s)", *args, key)


def _read_head(pipe: Any, key: str, now: float, skip: int) -> None:
    """Queue on ``pipe`` the reads of ``key``'s due entries (after the first ``skip``, up to BATCH)
    and of its first entry not yet due, with their scores."""
    pipe.zrangebyscore(key, "-inf", repr(now), start=skip, num=BATCH, withscores=True)
    pipe.zrangebyscore(key, f"({now!r}", "+inf", start=0, num=1, withscores=True)
