"""The poller: due scheduled and retry entries to their queues, plus the fleet's housekeeping.

Its parts, each in a module of its own:

* :mod:`.housekeeping`: the key guard, orphan recovery and unsettled jobs;
* :mod:`.due`: the due sweep of ``schedule`` and ``retry`` (poison to dead), and
  the plan of when the next entry falls due;
* :mod:`.wakeups`: the subscription to ``schedule:wake``, which hears due
  times as scheduled pushes publish them.

This module is the loop that runs them. A timed round (at boot, then every
``poll_interval``) runs the housekeeping steps then a sweep, each step on its
own (only a lost connection fails the round). POLL_INTERVAL_AVERAGE is the
fleet-wide average gap between two rounds, so each process waits that times
the live process count, randomised (x0.5 to x1.5) so processes started
together don't poll together.

Between rounds the poller waits on its subscription, and also wakes when an
entry falls due, and then only sweeps (the housekeeping keeps its interval).
It learns due times from the peek of every sweep, from the ``schedule:wake``
channel, and from :meth:`Poller.expect`, for retries filed by this process.
Sweeps woken by due times are at least DUE_FLOOR apart (a stream of scheduled
jobs can't make a process spin) and come up to DUE_JITTER after the due time,
at random, so the fleet's processes don't all sweep in the same millisecond.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import is_unavailable
from ..loops import LoopThread, Step, Watchdog, run_each
from ..recovery.housekeeping import Housekeeping
from ..recovery.key_guard import KeyGuard
from ..recovery.orphans import OrphanRecovery
from ..settle.retry import RetryPolicy
from .due import BATCH, DUE_FLOOR, DueSweep
from .wakeups import Wakeups

__all__ = ["BATCH", "DUE_FLOOR", "Poller"]

logger = logging.getLogger(__name__)


class Poller(LoopThread):
    """Run the timed rounds and the sweeps woken by due times, on thread cogworker-poller.

    Created by the Launcher (with its key guard and orphan recovery); ``start``
    starts the thread, which runs a round at once, then waits on the
    subscription between rounds and due sweeps, each step under a Watchdog.
    ``stop`` sets the stop event (a wait ends within WAIT_SLICE, a sweep
    between two batches) and joins the thread, which closes its subscription.
    ``expect`` may be called from any thread; tests call ``round`` and
    ``enqueue_due`` directly, without the thread.
    """

    def __init__(self, config: Config, redis: RedisClient, keys: Keys, retry: RetryPolicy, key_guard: KeyGuard,
                 orphans: OrphanRecovery, process_count: Callable[[], int], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time, housekeeping: Sequence[Step] = ()):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.retry = retry
        self.key_guard = key_guard
        self.orphans = orphans
        self.process_count = process_count
        self.rng = rng or random.Random()
        self.clock = clock
        self._init_thread("cogworker-poller")
        # (``housekeeping``: the features' own steps of each round: Feature.housekeeping)
        self.housekeeping = Housekeeping(redis, keys, retry, key_guard, orphans, config.key_guard_interval,
                                         housekeeping)
        self.due = DueSweep(redis, keys, retry, self.rng, clock, self.stop_event)
        self.wakeups = Wakeups(redis, keys, self.due.expect, clock, self.stop_event,
                               timed_every=lambda: config.poll_interval_average * max(self.process_count(), 1))
        self._next_round = 0.0  # (monotonic) the first round at once

    @property
    def first_orphan_check_done(self) -> threading.Event:
        """Set once an orphan check really completed with no recovery left under way (see housekeeping)."""
        return self.housekeeping.first_orphan_check_done

    @property
    def subscribed(self) -> bool:
        """Whether the poller hears due times published now (False: it relies on its timed rounds)."""
        return self.wakeups.subscribed

    def poll_interval(self) -> float:
        return self.config.poll_interval_average * max(self.process_count(), 1) * self.rng.uniform(0.5, 1.5)

    def expect(self, at: float) -> None:
        """Sweep at ``at`` (epoch seconds): an entry falls due then. Any thread may call it."""
        self.due.expect(at)

    def next_due(self) -> float | None:
        """The earliest due time known (epoch seconds), or None."""
        return self.due.next_due()

    def sweep(self) -> int:
        """Move every due entry to its queue, noting what falls due next; return how many moved."""
        return self.due.sweep()

    def enqueue_due(self) -> int:
        """Move every due entry of ``schedule`` and ``retry`` to its queue; return how many."""
        return self.due.enqueue_due()

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        watchdog = Watchdog("poller", self.stop_event)
        try:
            while not self.stop_event.is_set():
                if time.monotonic() >= self._next_round:
                    if not watchdog.run_step(self.round):
                        continue
                    self._next_round = time.monotonic() + self.poll_interval()
                    deferred = self.housekeeping.deferred_for
                    if deferred is not None:
                        # A dead process's list waits only for this process's grace to end (just
                        # started, or Redis just back): come back then, not a poll interval later.
                        self._next_round = min(self._next_round, time.monotonic() + deferred + 0.05)
                    self.wakeups.after_round()
                elif time.monotonic() >= self.due.due_wake():
                    if not watchdog.run_step(self._due_sweep):
                        continue
                self.wakeups.wait(lambda: min(self._next_round, self.due.due_wake()))
        finally:
            self.wakeups.close()

    def round(self) -> None:
        """Run the housekeeping steps and a sweep, each on its own (see loops.run_each)."""
        run_each((*self.housekeeping.steps(), ("due entries", self.due.sweep)), "poller: %s failed", log=logger)

    def _due_sweep(self) -> None:
        """A sweep woken by a due time. One failing for a bug is logged, and the wake dropped: the
        timed rounds go on (rather than this sweep being retried every few seconds)."""
        try:
            self.due.sweep()
        except Exception as exc:
            if is_unavailable(exc):
                raise
            logger.exception("poller: due entries failed")
            self.due.drop_wake()
