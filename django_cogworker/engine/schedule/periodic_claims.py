"""The slot claim of periodic entries: each slot runs once fleet-wide.

A claim takes, in one script (``PERIODIC_CLAIM``), the slot's lock
(``periodic:lock:<pjid>:<slot>``, SLOT_LOCK_TTL), advances
``periodic:last_slot:<pjid>``, and for an ``until_executed`` entry takes the
run's running lock for CLAIM_TTL: long enough for the push, which then holds
it for the run's wait in the queue (:func:`django_cogworker.broker.locks.hold_queued`).
A push that fails rolls the claim back (``ROLLBACK``). The running lock
itself, like every lock, lives in :mod:`django_cogworker.broker.locks`.
"""

from __future__ import annotations

from typing import Any

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.types import RedisClient

SLOT_LOCK_TTL = 3600
CLAIM_TTL = 300  # from the claim to the end of its push (which takes a round trip or two)

ROLLBACK = scripts.PERIODIC_ROLLBACK


def claim_slot(redis: RedisClient, keys: Keys, entry: Any, slot: int, jid: str,
               claim_ttl: int = CLAIM_TTL) -> tuple[bool, str]:
    """Claim ``slot`` of ``entry`` fleet-wide; return (claimed, previous last_slot).

    An ``until_executed`` claim takes the running lock for ``claim_ttl``:
    :func:`django_cogworker.broker.locks.hold_queued` extends it once the run is pushed."""
    result = scripts.PERIODIC_CLAIM(
        redis, [keys.periodic_last_slot(entry.pjid), keys.periodic_lock(entry.pjid, slot),
                keys.periodic_running(entry.pjid)],
        [slot, SLOT_LOCK_TTL, jid, "1" if entry.until_executed else "0", claim_ttl])
    code = int(result[0])
    previous = result[1].decode() if code == 1 and isinstance(result[1], bytes) else (
        result[1] if code == 1 else "")
    return code == 1, previous
