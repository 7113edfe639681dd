"""Moving a key of the wrong type aside: ``quarantine:<key>:<unix time>:<random>``.

Only a manual write or data corruption puts the wrong type in one of our keys,
but then every command on it fails, deterministically. The key is renamed
(kept QUARANTINE_TTL for a human to look at, listed in the admin) and work
carries on with a fresh key. Used by the key guard's round, by the stats flush
(a counter that isn't a number) and by :func:`django_cogworker.broker.locks.take` (a
lock key that can't be a lock): outside ``engine/`` because pushing a unique
job takes a lock, and pushing imports no worker code.
"""

from __future__ import annotations

import logging
import secrets
import time

from . import scripts
from .keys import Keys
from .types import RedisClient

logger = logging.getLogger(__name__)

QUARANTINE_TTL = 30 * 24 * 3600


def quarantine_key(redis: RedisClient, keys: Keys, key: str, expected: str, why: str) -> bool:
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
