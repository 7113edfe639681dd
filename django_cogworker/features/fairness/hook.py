"""The fairness feature in a worker: the rings of the queues it serves repaired now and then.

A group takes turns only while it is in its queue's ring (broker/scripts/lanes.py). Every write
keeps that so; a ring that is lost (deleted by hand, evicted under an ``allkeys-*`` policy, moved to
quarantine by the key guard for holding the wrong type) would leave its groups' jobs waiting for
ever. A housekeeping step finds the groups' lists with SCAN and puts back those that hold jobs, are
not paused and are missing from the ring (REPAIR_RING).

The bound: SCAN walks the whole keyspace, so one walk serves every queue (a walk per queue took 46 s
over 1M keys for 10 queues, holding back the poller's sweep of due jobs), and it is spread over the
poller's housekeeping rounds: a round makes at most ROUND_SCANS calls of SCAN COUNT SCAN_COUNT (5,000
keys looked at, a few milliseconds of Redis's time and the round's), keeping the cursor for the next
round. A walk starts FIRST_REPAIR after start, then REPAIR_EVERY after the last one began (or at its
end, if it took longer): over 1M keys a walk takes 200 rounds (a round every POLL_INTERVAL_AVERAGE x
the live processes, on average), so a lost ring's groups wait at most REPAIR_EVERY plus one walk.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from ...broker.keys import Keys, LaneKeys, glob_escape
from ...broker.types import RedisClient
from ...engine.run.hooks import Feature
from .scripts import REPAIR_RING

logger = logging.getLogger(__name__)

REPAIR_EVERY = 600.0  # seconds between the starts of two walks of the keyspace
FIRST_REPAIR = 30.0  # seconds after start of the first
SCAN_COUNT = 1000
ROUND_SCANS = 5  # SCAN calls a housekeeping round makes at most
GROUP_INFIX = b" lane:g:"  # (a queue's key holds no space: the first one starts its lanes' suffix)


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
        self._cursor: int | None = None  # a walk under way: where it is (None: no walk)
        # Each served queue by its key, and MATCH: the group lists' common prefix, literal.
        self._lanes: dict[bytes, tuple[str, LaneKeys]] = {keys.queue(q).encode(): (q, keys.lanes(q)) for q in queues}
        prefixes = [lanes.group_prefix for _, lanes in self._lanes.values()]
        self._match = glob_escape(os.path.commonprefix(prefixes)) + "*" if prefixes else None

    def applies(self, job_class: object) -> bool:
        return False

    def housekeeping(self) -> Sequence[tuple[str, Callable[[], object]]]:
        return (("lane rings", self.repair_when_due),)

    def repair_when_due(self) -> int:
        """A round's part of the walk (ROUND_SCANS calls of SCAN at most), if one is due or under
        way; how many groups it put back."""
        if self._cursor is None:
            if self.monotonic() < self._next:
                return 0
            self._next = self.monotonic() + REPAIR_EVERY
            self._cursor = 0
        back, self._cursor = self._step(self._cursor, ROUND_SCANS)
        if self._cursor == 0:
            self._cursor = None
            self._next = max(self._next, self.monotonic())
        return back

    def repair(self) -> int:
        """A whole walk at once (tests, a shell): every group of the served queues whose list holds
        jobs, that isn't paused and isn't in its ring is put back; return how many."""
        back, cursor = self._step(0, None)
        while cursor:
            more, cursor = self._step(cursor, None)
            back += more
        return back

    def _step(self, cursor: int, scans: int | None) -> tuple[int, int]:
        """SCAN from ``cursor`` (``scans`` calls at most, None: to the end), repairing the rings of
        the groups found; return how many were put back and the cursor (0: the walk is over)."""
        if self._match is None:
            return 0, 0
        found: dict[bytes, list[bytes]] = {}
        made = 0
        while scans is None or made < scans:
            cursor, keys = self.redis.scan(cursor, match=self._match, count=SCAN_COUNT)
            made += 1
            for key in keys:
                if not isinstance(key, bytes) or GROUP_INFIX not in key:
                    continue
                queue_key, _, group = key.partition(GROUP_INFIX)
                if queue_key in self._lanes and group:
                    found.setdefault(queue_key, []).append(group)
            if not cursor:
                break
        return sum(self._put_back(queue_key, groups) for queue_key, groups in found.items()), int(cursor)

    def _put_back(self, queue_key: bytes, groups: list[bytes]) -> int:
        queue, lanes = self._lanes[queue_key]
        back = 0
        for first in range(0, len(groups), SCAN_COUNT):
            moved = int(REPAIR_RING(self.redis, [lanes.ring, lanes.paused],
                                    [lanes.group_prefix, *groups[first:first + SCAN_COUNT]]))
            if moved:
                logger.warning("queue %r: %d group(s) with jobs waiting were missing from its ring "
                               "(lost, or moved aside by the key guard): put back", queue, moved)
            back += moved
        return back
