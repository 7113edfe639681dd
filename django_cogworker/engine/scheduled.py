"""The poller: due scheduled and retry entries to their queues, plus the fleet's housekeeping.

Created by the Launcher, run on its own thread. Every round (at boot, then
every ``poll_interval``): the key guard when due (boot and every
KEY_GUARD_INTERVAL), orphan recovery, filing of handed-over ``unsettled``
jobs, then the due entries of ``schedule`` and ``retry``.

The interval: POLL_INTERVAL_AVERAGE is the fleet-wide average gap between two
polls, so each process waits that times the live process count, randomised
(x0.5 to x1.5) so processes started together don't poll together.

``first_orphan_check_done`` is set once an orphan check has really completed
(not merely been tried): the periodic ticker waits for it, so an interrupted
``until_executed`` run is requeued before its next slot can fire.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib

from .. import payload as payloads
from .. import scripts
from ..conf import Config
from ..errors import is_connection_error
from ..keys import Keys
from .key_guard import KeyGuard
from .orphans import OrphanRecovery
from .retry import RetryPolicy
from .watchdog import LoopThread, Watchdog

logger = logging.getLogger(__name__)

BATCH = 100


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

    def poll_interval(self) -> float:
        return self.config.poll_interval_average * max(self.process_count(), 1) * self.rng.uniform(0.5, 1.5)

    def _run(self) -> None:
        watchdog = Watchdog("poller", self.stop_event)
        while not self.stop_event.is_set():
            if watchdog.run_step(self.round):
                self.stop_event.wait(self.poll_interval())

    def round(self) -> None:
        """Run each step on its own: one that fails never skips the ones after it.

        A step failing on every round (a bug, a value that can't be read) used
        to stop the rest: one unreadable stamp in ``last_beat`` kept every
        process of the fleet from moving due scheduled and retry jobs. A lost
        connection still fails the round as a whole (the watchdog backs it off).
        """
        for name, step in (("key guard", self._guard), ("orphan check", self._orphan_check),
                           ("unsettled filing", self.file_unsettled), ("due entries", self.enqueue_due)):
            try:
                step()
            except Exception as exc:
                if is_connection_error(exc):
                    raise
                logger.exception("poller: %s failed", name)

    def _guard(self) -> None:
        if time.monotonic() >= self._next_guard:
            self.key_guard.check()
            self._next_guard = time.monotonic() + self.config.key_guard_interval

    def _orphan_check(self) -> None:
        self.orphans.check()
        self.first_orphan_check_done.set()  # only once a check really completed

    def enqueue_due(self) -> int:
        """Move every due entry of ``schedule`` and ``retry`` to its queue; return how many."""
        moved = 0
        for key in (self.keys.schedule, self.keys.retry):
            try:
                moved += self._enqueue_due_from(key)
            except redis_lib.exceptions.ResponseError as exc:
                # (schedule of the wrong type must not hold up retry; the key guard moves it aside)
                logger.error("due entries of %s not moved: %s", key, exc)
        return moved

    def _enqueue_due_from(self, key: str) -> int:
        moved = 0
        while not self.stop_event.is_set():
            due = self.redis.zrangebyscore(key, "-inf", self.clock(), start=0, num=BATCH)
            batch_moved = sum(self._requeue(key, raw) for raw in due)
            moved += batch_moved
            if len(due) < BATCH or not batch_moved:
                break  # (nothing moved: the rest can't be, this round; don't spin on them)
        return moved

    def _requeue(self, source: str, raw: bytes) -> int:
        """Push one due entry to its queue, then remove it (one script); poison goes to dead."""
        try:
            payload = payloads.decode(raw)
            queue = payload.get("queue")
            if not isinstance(queue, str) or not queue:
                raise payloads.PayloadError(f"payload names no queue: {queue!r}")
        except payloads.PayloadError as exc:
            dead = payloads.dead_letter(raw, str(exc), self.clock())
            below, cap = self.retry.dead_trim()
            logger.error("unreadable entry in %s moved to dead: %s", source, exc)
            return int(scripts.MOVE_BETWEEN_ZSETS(self.redis, [source, self.keys.dead],
                                                  [raw, self.clock(), payloads.encode(dead), below, cap]))
        payload["enqueued_at"] = self.clock()
        payload.pop("at", None)
        # Built here, not by Lua's cjson, which would round large integers in args.
        new_raw = payloads.encode(payload)
        try:
            return int(scripts.CLAIM_AND_REQUEUE(
                self.redis, [source, self.keys.queues, self.keys.queue(queue)], [raw, queue, new_raw]))
        except redis_lib.exceptions.ResponseError as exc:
            logger.error("could not move jid=%s to queue %r: %s (left in %s)", payload.get("jid"), queue, exc,
                         source)
            return 0

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
