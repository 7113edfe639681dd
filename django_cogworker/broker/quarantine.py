"""Moving a key of the wrong type aside: ``quarantine:<key>:<unix time>:<random>``.

Only a manual write or data corruption puts the wrong type in one of our keys,
but then every command on it fails, deterministically. The key is renamed
(kept QUARANTINE_TTL for a human to look at, listed in the admin) and work
carries on with a fresh key. Used by the key guard's round, by the stats flush
(a counter that isn't a number) and by :func:`django_cogworker.broker.locks.take` (a
lock key that can't be a lock): outside ``engine/`` because pushing a unique
job takes a lock, and pushing imports no worker code.

The features' keys (a batch's, a limiter key's, a job's result, the cancel requests) are made
per batch, per limiter key, per job: no guard round knows them. Whoever meets one of the wrong
type moves it aside at once: :func:`guarded` runs a call (a script, a command) and, when Redis
answers WRONGTYPE (which names no key), asks the TYPE of each key the call was given against
the type it must hold (:class:`Want`, declared once per family: ``BatchKeys.expected()``,
``LimitKeys.expected()``), quarantines the wrong ones, and runs the call again. A key of the
right type costs nothing: the types are read only after a WRONGTYPE. A move can be noted in a
hash of the same family (a batch's ``meta``, a limiter key's ``stats``: field ``lost:<name>``,
the time), in the same script as the move, so what was lost stays visible (the admin, the
CLI) and a batch knows which of its counts it can no longer vouch for (docs/batches.md).

So a script run again after such an error must be safe to run again: the writes it made before
the failing command are kept (Redis has no rollback). The feature scripts are written for that
(each says how).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis as redis_lib

from ..errors import error_code
from . import scripts
from .keys import Keys, Want
from .types import RedisClient

logger = logging.getLogger(__name__)

QUARANTINE_TTL = 30 * 24 * 3600
T = TypeVar("T")
Expected = Mapping[str, Want] | Callable[[], Mapping[str, Want]]

__all__ = ["QUARANTINE_TTL", "Want", "guarded", "is_wrong_type", "quarantine_key", "quarantine_wrong", "run_script"]


def quarantine_key(redis: RedisClient, keys: Keys, key: str, expected: str, why: str,
                   note: tuple[str, str] | None = None, note_ttl: int | None = None) -> bool:
    """Move ``key`` aside to ``quarantine:<key>:<time>:<random>`` unless it holds ``expected``
    (re-checked atomically with the move); ``expected`` "" moves it whatever it holds (a counter
    that isn't a number). ``note``: (hash, field) set to the time in the same step (a hash made by
    it lives ``note_ttl`` seconds). Logs ``why`` at ERROR; returns whether it moved."""
    # Unique per move: a second quarantine of the same key within the same
    # second must not overwrite (RENAME) the first one's copy.
    now = int(time.time())
    target = keys.quarantine(key, now, secrets.token_hex(4))
    noted = [note[0]] if note else []
    args = [expected, QUARANTINE_TTL, *([note[1], now, note_ttl or ""] if note else [])]
    if scripts.QUARANTINE(redis, [key, target, *noted], args) != 1:
        return False
    logger.error("%s %s: moved to %s (kept %d days)", key, why, target, QUARANTINE_TTL // 86400)
    return True


def quarantine_wrong(redis: RedisClient, keys: Keys, expected: Mapping[str, Want]) -> list[str]:
    """Quarantine each key of ``expected`` holding another type than its own (one TYPE each, in
    one round trip); return those moved. The hashes notes go to are moved first: a note can't
    be written into a hash of the wrong type."""
    pipe = redis.pipeline(transaction=False)
    for key in expected:
        pipe.type(key)
    found = {key: got.decode() if isinstance(got, bytes) else got
             for key, got in zip(expected, pipe.execute(), strict=True)}
    wrong = [key for key, got in found.items() if got not in ("none", expected[key].type)]
    notes = {want.note[0] for want in expected.values() if want.note}
    moved = []
    for key in sorted(wrong, key=lambda k: k not in notes):
        want = expected[key]
        if quarantine_key(redis, keys, key, want.type, f"held a {found[key]}, not a {want.type}",
                          want.note, want.ttl):
            moved.append(key)
    return moved


def guarded(redis: RedisClient, keys: Keys, expected: Expected, call: Callable[[], T]) -> T:
    """``call()``; when Redis answers WRONGTYPE, quarantine the keys of ``expected`` of the wrong
    type and call again. ``expected``: the keys the call touches with their :class:`Want`, or a
    function that returns them (built only after a WRONGTYPE: a call that meets none pays nothing
    for it). When none is left of the wrong type, it is called once more (another thread or
    process met the same key and moved it first); a second such WRONGTYPE (from a key the call
    doesn't declare) is raised."""
    wanted: Mapping[str, Want] | None = None
    moves = spares = 0
    while True:
        try:
            return call()
        except redis_lib.exceptions.ResponseError as exc:
            if error_code(exc) != "WRONGTYPE":
                raise
            if wanted is None:
                wanted = expected() if callable(expected) else expected
            if quarantine_wrong(redis, keys, wanted):
                moves += 1
                if moves > len(wanted):  # (each key moved at most once: a key that keeps coming back)
                    raise
            else:
                spares += 1
                if spares > 1:
                    raise


def run_script(script: Any, redis: RedisClient, keys: Keys, key_names: Sequence[Any], args: Sequence[Any],
               expected: Expected) -> Any:
    """Run ``script`` on ``key_names`` with ``args``, :func:`guarded` by ``expected``."""
    return guarded(redis, keys, expected, lambda: script(redis, key_names, args))


def is_wrong_type(error: Any) -> bool:
    """Whether ``error`` (an exception, or a pipeline's reply) is Redis's WRONGTYPE."""
    return isinstance(error, redis_lib.exceptions.ResponseError) and error_code(error) == "WRONGTYPE"
