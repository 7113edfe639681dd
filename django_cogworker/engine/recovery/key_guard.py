"""The key guard: move keys holding the wrong type out of the way.

Only a manual write or data corruption puts the wrong type in one of our keys,
but then every command on it fails, deterministically: a queue that can't be
pushed to, a dead set nothing can be filed in, a registry that fails every
beat. Each such key is renamed to ``quarantine:<key>:<unix time>:<random>``
(kept 30 days for a human to look at, listed in the admin), with an ERROR log;
work carries on with a fresh, empty key of the right type. Run by every
process's poller thread at boot and every KEY_GUARD_INTERVAL.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis as redis_lib

from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from .registry import readable

# Group lists checked per queue a round, at most (of its ring, then of its paused set): a queue of
# 100,000 tenants would be 100,000 TYPE calls a minute; a group past these is checked when it is
# among them (a group leaves the ring when its list empties, and the ring turns).
GROUP_CHECK_LIMIT = 1_000


class KeyGuard:
    """Check the types of every key the fleet relies on, and quarantine the wrong ones.

    Created by the Launcher with this process's queues and periodic entries;
    run by the poller's housekeeping round (cogworker-poller thread), whose
    ``check`` calls come at boot and every KEY_GUARD_INTERVAL. No thread or
    state of its own: nothing to start or stop.
    """

    def __init__(self, redis: RedisClient, keys: Keys, queues: Iterable[str], periodic: Iterable[str] = ()):
        self.redis = redis
        self.keys = keys
        self.queues = list(queues)
        self.periodic = list(periodic)  # the names (pjids) of this process's periodic entries
        self._unreadable: set[bytes] = set()  # members not UTF-8, logged once each

    def check(self) -> list[str]:
        """Quarantine every wrong-typed key found now; return their names."""
        expected = self.expected_types()
        pipe = self.redis.pipeline(transaction=False)
        for key in expected:
            pipe.type(key)
        actual = [t.decode() if isinstance(t, bytes) else t for t in pipe.execute()]
        moved = []
        for (key, want), got in zip(expected.items(), actual, strict=True):
            if got not in ("none", want) and self.quarantine(key, want, got):
                moved.append(key)
        return moved

    def expected_types(self) -> dict[str, str]:
        """The fixed keys, plus the per-queue and per-process keys listed in them (where readable),
        and the per-entry keys of this process's periodic entries."""
        k = self.keys
        types = k.fixed_types()
        queues = list(dict.fromkeys(self.queues + self._members(k.queues) + self._members(k.paused_queues)))
        for queue in queues:
            types[k.queue(queue)] = "list"
        types.update(self._lane_types(queues))
        for identity in self._members(k.in_progress_identities):
            # A cluster: one list per queue, in the queue's slot. Each process checks those of its
            # own queues (every listed queue times every identity was thousands of TYPE calls a
            # round); a list exists only for a queue some process fetches from.
            for listed in (self.queues if k.spread else [None]):
                types[k.in_progress(identity, listed)] = "list"
        for identity in self._members(k.processes):
            types[k.process(identity)] = "hash"
            types[k.workers(identity)] = "hash"
            types[k.signals(identity)] = "list"
        for pjid in self.periodic:
            # (one of the wrong type failed every claim of its entry, for good)
            types[k.periodic_last_slot(pjid)] = "string"
            types[k.periodic_running(pjid)] = "string"
        return types

    def _lane_types(self, queues: list[str]) -> dict[str, str]:
        """Each queue's lanes (broker/keys/families.py's LaneKeys): its ring, paused groups and
        priorities, and the list of each group its ring or paused set names (read in one round trip;
        a ring or set of the wrong type names none, and is moved this round). A ring holding a
        string stopped every fetch of its queue; a group's list holding one, every turn of it."""
        k = self.keys
        lanes = [k.lanes(queue) for queue in queues]
        pipe = self.redis.pipeline(transaction=False)
        for lane in lanes:
            pipe.lrange(lane.ring, 0, GROUP_CHECK_LIMIT - 1)
            pipe.srandmember(lane.paused, GROUP_CHECK_LIMIT)
        replies = pipe.execute(raise_on_error=False) if lanes else []
        types: dict[str, str] = {}
        for i, lane in enumerate(lanes):
            types.update({lane.ring: "list", lane.paused: "set", lane.prio: "zset"})
            for reply in replies[2 * i:2 * i + 2]:
                for member in reply if isinstance(reply, list) else ():
                    group = readable(member, lane.ring, self._unreadable) if member else None
                    if group:
                        types[lane.group(group)] = "list"
        return types

    def _members(self, key: str) -> list[str]:
        try:
            members = self.redis.smembers(key)
        except redis_lib.exceptions.ResponseError:
            return []  # itself of the wrong type: quarantined this round, listed again next
        # A member that is not UTF-8 (no name the package writes) names no key this guard can
        # build: skipped, and said once. It failed every round (UnicodeDecodeError), so no key of
        # the wrong type was moved aside any more, anywhere.
        return [name for name in (readable(m, key, self._unreadable) for m in members) if name is not None]

    def quarantine(self, key: str, expected: str, actual: str) -> bool:
        return quarantine_key(self.redis, self.keys, key, expected, f"held a {actual}, not a {expected}")
