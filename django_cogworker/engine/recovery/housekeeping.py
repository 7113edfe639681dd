"""The poller's housekeeping: the key guard, orphan recovery and unsettled jobs, each round.

Each timed round of the poller runs, before its due sweep, the steps here, each
on its own (only a lost connection fails the round):

1. the key guard, at boot and every KEY_GUARD_INTERVAL (not every round);
2. the orphan check: the in-progress lists of dead processes back to their
   queues. ``first_orphan_check_done`` is set once a check has really
   completed (not merely been tried) and left no dead process's list being
   recovered by another process: the periodic ticker waits for it, so an
   interrupted ``until_executed`` run is requeued before its next slot can fire;
3. unsettled jobs: records that some process handed over at its shutdown
   (jobs that ran but whose retry/dead filing failed) filed where they belong;
4. the features' own steps (``Feature.housekeeping``, engine/run/hooks.py): the batches' closings,
   every 15 s (callbacks fired by a jobs() block's close whose pusher died before it delivered
   them: features/batches/delivery.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ..loops import Step
from ..settle.retry import RetryPolicy
from ..settle.settling import file_unsettled
from .key_guard import KeyGuard
from .orphans import OrphanRecovery

logger = logging.getLogger(__name__)


class Housekeeping:
    """The steps of the poller's round that look after the fleet rather than move due jobs.

    Created by the Poller with the Launcher's key guard and orphan recovery; its
    ``steps`` run on the poller's thread (cogworker-poller), in each timed round.
    No thread of its own, nothing to start or stop; ``first_orphan_check_done``
    is read by the Launcher (the ticker's ``ready``) from the main thread.
    """

    def __init__(self, redis: RedisClient, keys: Keys, retry: RetryPolicy, key_guard: KeyGuard, orphans: OrphanRecovery,
                 key_guard_interval: float, features: Sequence[Step] = (),
                 monotonic: Callable[[], float] = time.monotonic):
        self.redis = redis
        self.keys = keys
        self.retry = retry
        self.key_guard = key_guard
        self.orphans = orphans
        self.key_guard_interval = key_guard_interval
        self.features = tuple(features)  # (the features' own steps, each timed by its feature)
        self.monotonic = monotonic
        self.first_orphan_check_done = threading.Event()
        self._next_guard = 0.0  # (monotonic) the first round checks at once

    def steps(self) -> tuple[Step, ...]:
        """The round's housekeeping steps, in order, named for the log."""
        return (("key guard", self.guard), ("orphan check", self.orphan_check),
                ("unsettled filing", self.file_unsettled), *self.features)

    def guard(self) -> None:
        """Run the key guard if KEY_GUARD_INTERVAL has passed since it last ran."""
        if self.monotonic() >= self._next_guard:
            self.key_guard.check()
            self._next_guard = self.monotonic() + self.key_guard_interval

    def orphan_check(self) -> None:
        self.orphans.check()
        if self.orphans.settled:  # only once a check really completed, no recovery left under way
            self.first_orphan_check_done.set()

    @property
    def deferred_for(self) -> float | None:
        """Seconds until a verdict on a dead process, put off only for this process's grace, can
        be given (None: none is)."""
        return self.orphans.deferred_for

    def file_unsettled(self) -> int:
        return file_unsettled(self.redis, self.keys, self.retry)
