"""The fairness feature in a worker: the rings of the queues it serves repaired now and then.

A group takes turns only while it is in its queue's ring (broker/scripts/lanes.py). Every write
keeps that so; a ring that is lost (deleted by hand, evicted under an ``allkeys-*`` policy, moved to
quarantine by the key guard for holding the wrong type) would leave its groups' jobs waiting for
ever. A housekeeping step finds the groups' lists with SCAN and puts back those that hold jobs, are
not paused and are missing from the ring (REPAIR_RING). SCAN walks the whole keyspace, so the step
runs once shortly after start and then every REPAIR_EVERY: a lost ring is rare, and its groups wait
at most that long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ...broker.keys import Keys, glob_escape
from ...broker.types import RedisClient
from ...engine.run.hooks import Feature
from .scripts import REPAIR_RING

logger = logging.getLogger(__name__)

REPAIR_EVERY = 600.0  # seconds between two repairs of the rings
FIRST_REPAIR = 30.0  # seconds after start of the first
SCAN_COUNT = 1000


class Lanes(Feature):
    """No hook on a job's path (``applies`` is False for every class): a housekeeping step only."""

    name = "fairness"

    def __init__(self, redis: RedisClient, keys: Keys, queues: Sequence[str],
                 monotonic: Callable[[], float] = time.monotonic):
        self.redis = redis
        self.keys = keys
        self.queues = tuple(queues)
        self.monotonic = monotonic
        self._next = monotonic() + FIRST_REPAIR

    def applies(self, job_class: object) -> bool:
        return False

    def housekeeping(self) -> Sequence[tuple[str, Callable[[], object]]]:
        return (("lane rings", self.repair_when_due),)

    def repair_when_due(self) -> int:
        if self.monotonic() < self._next:
            return 0
        self._next = self.monotonic() + REPAIR_EVERY
        return self.repair()

    def repair(self) -> int:
        """Put back in its ring every group of the served queues whose list holds jobs, that isn't
        paused and isn't in the ring; return how many."""
        back = 0
        for queue in self.queues:
            lanes = self.keys.lanes(queue)
            prefix = lanes.group_prefix.encode()
            found = [key[len(prefix):] for key in self.redis.scan_iter(
                match=glob_escape(lanes.group_prefix) + "*", count=SCAN_COUNT)
                if isinstance(key, bytes) and key.startswith(prefix)]
            for first in range(0, len(found), SCAN_COUNT):
                moved = int(REPAIR_RING(self.redis, [lanes.ring, lanes.paused],
                                        [lanes.group_prefix, *found[first:first + SCAN_COUNT]]))
                if moved:
                    logger.warning("queue %r: %d group(s) with jobs waiting were missing from its ring "
                                   "(lost, or moved aside by the key guard): put back", queue, moved)
                back += moved
        return back
