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

import logging
import secrets
import time
from collections.abc import Iterable
from typing import Any

import redis as redis_lib

from .. import scripts
from ..errors import error_code
from ..keys import Keys

logger = logging.getLogger(__name__)

QUARANTINE_TTL = 30 * 24 * 3600


class KeyGuard:
    def __init__(self, redis: Any, keys: Keys, queues: Iterable[str], periodic: Iterable[str] = ()):
        self.redis = redis
        self.keys = keys
        self.queues = list(queues)
        self.periodic = list(periodic)  # the names (pjids) of this process's periodic entries

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
        for queue in dict.fromkeys(self.queues + self._members(k.queues) + self._members(k.paused_queues)):
            types[k.queue(queue)] = "list"
        for identity in self._members(k.in_progress_identities):
            types[k.in_progress(identity)] = "list"
        for identity in self._members(k.processes):
            types[k.process(identity)] = "hash"
            types[k.workers(identity)] = "hash"
            types[k.signals(identity)] = "list"
        for pjid in self.periodic:
            # (one of the wrong type failed every claim of its entry, for good)
            types[k.periodic_last_slot(pjid)] = "string"
            types[k.periodic_running(pjid)] = "string"
        return types

    def _members(self, key: str) -> list[str]:
        try:
            return [m.decode() for m in self.redis.smembers(key)]
        except redis_lib.exceptions.ResponseError:
            return []  # itself of the wrong type: quarantined this round, listed again next

    def quarantine(self, key: str, expected: str, actual: str) -> bool:
        return quarantine_key(self.redis, self.keys, key, expected, f"held a {actual}, not a {expected}")


def quarantine_key(redis: Any, keys: Keys, key: str, expected: str, why: str) -> bool:
    """Move ``key`` aside to ``quarantine:<key>:<time>:<random>`` unless it holds ``expected``
    (re-checked atomically with the move); ``expected`` "" moves it whatever it holds (a counter
    that isn't a number). Logs ``why`` at ERROR; returns whether it moved."""
    # Unique per move: a second quarantine of the same key within the same
    # second must not overwrite (RENAME) the first one's copy.
    target = keys.quarantine(key, int(time.time()), secrets.token_hex(4))
    if scripts.QUARANTINE(redis, [key, target], [expected, QUARANTINE_TTL]) != 1:
        return False
    logger.error("%s %s: moved to %s (kept %d days)", key, why, target, QUARANTINE_TTL // 86400)
    return True


def take_lock(redis: Any, keys: Keys, key: str, value: str, ttl: int) -> tuple[bool, Any]:
    """SET ``key`` ``value`` NX EX ``ttl``: (True, None) when taken, else (False, the holder's value).

    A lock key that can't be a lock no longer holds for ever (every push of a unique job refused,
    a dead process's list never recovered): one of the wrong type is quarantined and the lock
    taken; one without an expiry (a manual write) is given ``ttl``.
    """
    holder = None
    for _attempt in range(2):
        if redis.set(key, value, nx=True, ex=ttl):
            return True, None
        pipe = redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.ttl(key)
        holder, left = pipe.execute(raise_on_error=False)
        if isinstance(holder, redis_lib.exceptions.ResponseError) and error_code(holder) == "WRONGTYPE":
            quarantine_key(redis, keys, key, "string", "is no lock (the wrong type)")
            continue
        if isinstance(holder, Exception):
            raise holder
        if left == -1:
            redis.expire(key, ttl)
            logger.error("%s held no expiry (a lock can't hold for ever): given %ds", key, ttl)
        break
    return False, holder
