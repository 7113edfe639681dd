"""The poller: due scheduled and retry entries to their queues, plus the fleet's housekeeping.

Created by the Launcher, run on its own thread. Every round (at boot, then
every ``poll_interval``): the key guard when due (boot and every
KEY_GUARD_INTERVAL), orphan recovery, filing of handed-over ``unsettled``
jobs, then a sweep of ``schedule`` and ``retry``: their due entries to their
queues, noting the earliest entry not yet due (the peek).

The interval: POLL_INTERVAL_AVERAGE is the fleet-wide average gap between two
rounds, so each process waits that times the live process count, randomised
(x0.5 to x1.5) so processes started together don't poll together.

Between rounds the poller also wakes when an entry falls due, and then only
sweeps (the housekeeping keeps its interval). It learns due times from:

* the peek of every sweep (it rides on the sweep's own reads of the sets);
* the ``schedule:wake`` channel, on which every scheduled push publishes its
  due time: the poller waits on its subscription (its own connection), which
  costs Redis nothing while no message comes (it checks it with one PING a
  round; redis-py's health check adds one after 30 s without traffic);
* :meth:`Poller.expect`, for retries filed by this process.

Sweeps woken by due times are at least DUE_FLOOR apart (a stream of scheduled
jobs can't make a process spin) and come up to DUE_JITTER after the due time,
at random, so the fleet's processes don't all sweep in the same millisecond.
A subscription that is lost (Redis restarting, a connection cut, no answer to
a PING) only costs precision: the timed rounds go on, the loss is logged
once, and once subscribed again the poller sweeps (messages were missed).

``first_orphan_check_done`` is set once an orphan check has really completed
(not merely been tried) and left no dead process's list being recovered by
another process: the periodic ticker waits for it, so an interrupted
``until_executed`` run is requeued before its next slot can fire.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib

from .. import payload as payloads
from .. import scripts
from ..conf import Config
from ..errors import is_unavailable
from ..keys import Keys
from .key_guard import KeyGuard
from .orphans import OrphanRecovery
from .retry import RetryPolicy
from .watchdog import LoopThread, Watchdog

logger = logging.getLogger(__name__)

BATCH = 100
# What became of one due entry (_requeue).
MOVED, GONE, STUCK = 1, 0, -1
# Due entries a sweep reads past when they can't be moved, before it leaves the rest to the next.
MAX_STUCK = 10 * BATCH
# Longest single wait on the subscription: stop() is never kept waiting longer.
WAIT_SLICE = 0.5
# Shortest gap between a sweep and a sweep woken by a due time.
DUE_FLOOR = 0.2
# A sweep woken by a due time comes up to this long after it, at random.
DUE_JITTER = 0.1
# Seconds of listening without the answer to our PING before the subscription is taken for dead.
PONG_TIMEOUT = 5.0
PING_TOKEN = b"cogworker-poller"
# Pause before subscribing again after a failed attempt: doubling from the first to the second.
RESUBSCRIBE_PAUSE = (1.0, 30.0)
# Due times heard of and not yet swept, kept in memory (the earliest; the peeks find the rest).
MAX_HINTS = 64
# Seconds between two ERROR lines about entries stuck on one key (the others go to DEBUG): an
# entry that can't move is met again at every sweep, and a queue key of the wrong type wrote
# one line per entry per sweep, 7,165 lines in 57 s.
STUCK_LOG_EVERY = 60.0


class Poller(LoopThread):
    def __init__(self, config: Config, redis: Any, keys: Keys, retry: RetryPolicy, key_guard: KeyGuard,
                 orphans: OrphanRecovery, process_count: Callable[[], int], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.retry = retry
        self.key_guard = key_guard
        self.orphans = orphans
        self.process_count = process_count
        self.rng = rng or random.Random()
        self.clock = clock
        self.first_orphan_check_done = threading.Event()
        self._init_thread("cogworker-poller")
        self._next_guard = 0.0
        self._next_round = 0.0  # (monotonic) the first round at once
        # Due times (epoch seconds, sorted) heard of by message or expect(), not yet swept.
        self._hints: list[float] = []
        self._hints_lock = threading.Lock()
        # The earliest entry after the last sweep's cut-off, as its peek found it.
        self._peeked: float | None = None
        # key -> the time up to which the last sweep read it (its cut-off)
        self._cutoffs: dict[str, float] = {}
        self._last_sweep = -math.inf  # (monotonic) end of the last sweep
        self._jitter = 0.0
        self._pubsub: Any = None
        self._ping_waited: float | None = None  # seconds listened since our PING, None: none outstanding
        self._resubscribe_at = 0.0
        self._resubscribe_pause = RESUBSCRIBE_PAUSE[0]
        self._subscribed = False  # the subscription in use has been confirmed
        self._subscription_down = False  # logged as down, not yet back
        # key -> (monotonic time of its last ERROR line, lines sent to DEBUG since)
        self._stuck_logged: dict[str, tuple[float, int]] = {}

    @property
    def subscribed(self) -> bool:
        """Whether the poller hears due times published now (False: it relies on its timed rounds)."""
        return self._pubsub is not None and self._subscribed

    def poll_interval(self) -> float:
        return self.config.poll_interval_average * max(self.process_count(), 1) * self.rng.uniform(0.5, 1.5)

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        watchdog = Watchdog("poller", self.stop_event)
        try:
            while not self.stop_event.is_set():
                if time.monotonic() >= self._next_round:
                    if not watchdog.run_step(self.round):
                        continue
                    self._next_round = time.monotonic() + self.poll_interval()
                    deferred = self.orphans.deferred_for
                    if deferred is not None:
                        # A dead process's list waits only for this process's grace to end (just
                        # started, or Redis just back): come back then, not a poll interval later.
                        self._next_round = min(self._next_round, time.monotonic() + deferred + 0.05)
                    self._after_round()
                elif time.monotonic() >= self.due_wake():
                    if not watchdog.run_step(self._due_sweep):
                        continue
                self._wait()
        finally:
            self._close_subscription()

    def round(self) -> None:
        """Run each step on its own: one that fails never skips the ones after it.

        A step failing on every round (a bug, a value that can't be read) used
        to stop the rest: one unreadable stamp in ``last_beat`` kept every
        process of the fleet from moving due scheduled and retry jobs. A lost
        connection still fails the round as a whole (the watchdog backs it off).
        """
        for name, step in (("key guard", self._guard), ("orphan check", self._orphan_check),
                           ("unsettled filing", self.file_unsettled), ("due entries", self.sweep)):
            try:
                step()
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                logger.exception("poller: %s failed", name)

    def _due_sweep(self) -> None:
        """A sweep woken by a due time. One failing for a bug is logged, and the wake dropped: the
        timed rounds go on (rather than this sweep being retried every few seconds)."""
        try:
            self.sweep()
        except Exception as exc:
            if is_unavailable(exc):
                raise
            logger.exception("poller: due entries failed")
            self._peeked = None
            self._forget_due(self.clock())
            self._last_sweep = time.monotonic()

    def _guard(self) -> None:
        if time.monotonic() >= self._next_guard:
            self.key_guard.check()
            self._next_guard = time.monotonic() + self.config.key_guard_interval

    def _orphan_check(self) -> None:
        self.orphans.check()
        if self.orphans.settled:  # only once a check really completed, no recovery left under way
            self.first_orphan_check_done.set()

    # -- due entries ------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Move every due entry to its queue, noting what falls due next; return how many moved."""
        started = self.clock()
        moved = self.enqueue_due()
        self._forget_due(min(self._cutoffs.get(k, started) for k in (self.keys.schedule, self.keys.retry)))
        self._last_sweep = time.monotonic()
        self._jitter = self.rng.uniform(0.0, DUE_JITTER)
        return moved

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
            outcomes = [self._requeue(key, raw) for raw, _score in due]
            moved += outcomes.count(MOVED)
            stuck += outcomes.count(STUCK)
            if len(due) < BATCH or stuck >= MAX_STUCK or self.stop_event.is_set():
                return moved  # (the timed rounds retry what stayed; no spinning on it)
            now = self.clock()
            pipe = self.redis.pipeline(transaction=False)
            _read_head(pipe, key, now, stuck)
            due, after = pipe.execute()

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

    def _forget_due(self, cutoff: float) -> None:
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

    # -- waiting, and the subscription ------------------------------------------------------------

    def _wait(self) -> None:
        """Until the next round or due sweep, reading the subscription in slices of WAIT_SLICE."""
        self._subscribe_if_due()
        while not self.stop_event.is_set():
            left = min(self._next_round, self.due_wake()) - time.monotonic()
            if left <= 0:
                return
            if self._pubsub is None:
                self.stop_event.wait(min(left, WAIT_SLICE))
                self._subscribe_if_due()
            else:
                self._listen(min(left, WAIT_SLICE))

    def _listen(self, timeout: float) -> None:
        started = time.monotonic()
        try:
            message = self._pubsub.get_message(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the timed rounds go on
            self._lose_subscription(f"{type(exc).__name__}: {exc}")
            return
        if message is not None:
            self._on_message(message)
        if self._ping_waited is not None:
            self._ping_waited += time.monotonic() - started
            if self._ping_waited > PONG_TIMEOUT:
                self._lose_subscription(f"no answer to a PING in {PONG_TIMEOUT:.0f}s")

    def _on_message(self, message: dict) -> None:
        kind, data = message.get("type"), message.get("data")
        if kind == "message":
            try:
                at = float(data)
                if not math.isfinite(at):
                    raise ValueError("not finite")
            except (TypeError, ValueError):
                logger.debug("ignored a message on %s that is not a due time: %.100r", self.keys.schedule_wake, data)
                return
            self.expect(at)
        elif kind == "subscribe":
            self._subscribed = True
            self._resubscribe_pause = RESUBSCRIBE_PAUSE[0]
            if self._subscription_down:
                logger.warning("poller: subscribed to %s again", self.keys.schedule_wake)
                self._subscription_down = False
            # Due times published while we weren't subscribed were missed: sweep now.
            self.expect(self.clock())
        elif kind == "pong" and data in (PING_TOKEN, PING_TOKEN.decode()):
            self._ping_waited = None

    def _after_round(self) -> None:
        """After each timed round: subscribe if we aren't (Redis just answered), else check the
        subscription with a PING (one per round: a dead connection that never said so is noticed
        within a round or two, and one a firewall would drop for idleness is kept alive)."""
        if self._pubsub is None:
            self._resubscribe_at = 0.0
        elif self._ping_waited is None:
            try:
                self._pubsub.ping(PING_TOKEN)
            except Exception as exc:  # noqa: BLE001
                self._lose_subscription(f"{type(exc).__name__}: {exc}")
                return
            self._ping_waited = 0.0

    def _subscribe_if_due(self) -> None:
        if self._pubsub is not None or time.monotonic() < self._resubscribe_at:
            return
        pubsub = self.redis.pubsub()
        try:
            pubsub.subscribe(self.keys.schedule_wake)
        except Exception as exc:  # noqa: BLE001 - Redis away, or an ACL without this channel
            _close_quietly(pubsub)
            self._back_off()
            self._report_down(f"could not subscribe to {self.keys.schedule_wake} ({type(exc).__name__}: {exc})")
            return
        self._pubsub = pubsub
        self._subscribed = False
        self._ping_waited = None

    def _lose_subscription(self, why: str) -> None:
        _close_quietly(self._pubsub)
        self._pubsub = None
        self._ping_waited = None
        if self._subscribed:
            self._resubscribe_at = 0.0  # at once: a connection cut with Redis still up comes straight back
        else:
            self._back_off()  # never confirmed (refused by an ACL, say): don't retry it in a loop
        self._report_down(f"lost its subscription to {self.keys.schedule_wake} ({why})")

    def _back_off(self) -> None:
        self._resubscribe_at = time.monotonic() + self._resubscribe_pause
        self._resubscribe_pause = min(self._resubscribe_pause * 2, RESUBSCRIBE_PAUSE[1])

    def _report_down(self, what: str) -> None:
        if self._subscription_down:
            logger.debug("poller: %s", what)
            return
        self._subscription_down = True
        logger.warning("poller: %s; due jobs wait for the timed rounds (every %.0fs or so) until it is back",
                       what, self.config.poll_interval_average * max(self.process_count(), 1))

    def _close_subscription(self) -> None:
        _close_quietly(self._pubsub)
        self._pubsub = None

    # -- moving one entry -------------------------------------------------------------------------

    def _requeue(self, source: str, raw: bytes) -> int:
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
            dead = payloads.encode(payloads.dead_letter(raw, str(exc), self.clock()))
            return self._bury(source, raw, dead, f"unreadable entry in {source}", exc)
        payload["enqueued_at"] = self.clock()
        payload.pop("at", None)
        try:
            # Built here, not by Lua's cjson, which would round large integers in args.
            new_raw = payloads.encode(payload)
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
            fields = {"dead_reason": reason}
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

    def file_unsettled(self) -> int:
        """File jobs handed over at some process's shutdown (they ran; never requeued)."""
        filed = 0
        below, cap = self.retry.dead_trim()
        for record in self.redis.lrange(self.keys.unsettled, 0, BATCH - 1):
            try:
                entry = json.loads(record)
                target = self.keys.dead if entry["target"] == "dead" else self.keys.retry
                trim = (below, cap) if target == self.keys.dead else ("", "")
                filed += int(scripts.FILE_UNSETTLED(self.redis, [self.keys.unsettled, target],
                                                    [record, entry["score"], entry["payload"], *trim]))
            except (ValueError, KeyError, TypeError) as exc:
                logger.error("unreadable unsettled record left in place: %s: %.200r", exc, record)
        return filed


def _read_head(pipe: Any, key: str, now: float, skip: int) -> None:
    """Queue on ``pipe`` the reads of ``key``'s due entries (after the first ``skip``, up to BATCH)
    and of its first entry not yet due, with their scores."""
    pipe.zrangebyscore(key, "-inf", repr(now), start=skip, num=BATCH, withscores=True)
    pipe.zrangebyscore(key, f"({now!r}", "+inf", start=0, num=1, withscores=True)


def _close_quietly(pubsub: Any) -> None:
    if pubsub is None:
        return
    try:
        pubsub.close()
    except Exception as exc:  # noqa: BLE001 - closing a broken connection may fail too; it is dropped anyway
        logger.debug("closing the poller's subscription: %s", exc)
