"""The slot claim and the ``until_executed`` running lock of periodic entries.

The running lock (``periodic:running:<pjid>``, holding the run's jid) is taken
by the claim for CLAIM_TTL, and held for QUEUED_TTL once the push went through:
long, since the job may wait in a deep queue. Only once the job exists: a claim
whose push failed and whose rollback was lost (the process restarted before it
could retry it) held the lock for QUEUED_TTL, 24 h of skipped slots, for a run
that never existed; now it lapses within CLAIM_TTL. While the job runs, every
heartbeat of the process running it sets it to
``active_ttl(ORPHAN_THRESHOLD)``, from the process's in-memory record of running
jobs, not from Redis (a failover that lost the workers hash would otherwise let
a long run's lock lapse mid-run). It is released when the run ends. A process
that dies mid-run leaves it held: the TTL outlives orphan detection, and orphan
recovery takes it again (renewed to QUEUED_TTL) for the requeued run, so no
slot fires in between.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .. import scripts
from ..keys import Keys

SLOT_LOCK_TTL = 3600
CLAIM_TTL = 300  # from the claim to the end of its push (which takes a round trip or two)
QUEUED_TTL = 24 * 3600
ACTIVE_TTL = 180  # the least a running lock is renewed to


def active_ttl(orphan_threshold: float) -> int:
    """The TTL a running lock is renewed to while its run runs: longer than orphan detection takes.

    A lock that lapsed before orphan recovery had requeued the interrupted run
    (ORPHAN_THRESHOLD, 300 s by default, plus a poll) let the next slot start a
    second run beside it.
    """
    return int(max(ACTIVE_TTL, 2 * orphan_threshold + 60))

ROLLBACK = scripts.PERIODIC_ROLLBACK


def claim_slot(redis: Any, keys: Keys, entry: Any, slot: int, jid: str,
               claim_ttl: int = CLAIM_TTL) -> tuple[bool, str]:
    """Claim ``slot`` of ``entry`` fleet-wide; return (claimed, previous last_slot).

    An ``until_executed`` claim takes the running lock for ``claim_ttl``: :func:`hold_queued`
    extends it once the run is pushed."""
    result = scripts.PERIODIC_CLAIM(
        redis, [keys.periodic_last_slot(entry.pjid), keys.periodic_lock(entry.pjid, slot),
                keys.periodic_running(entry.pjid)],
        [slot, SLOT_LOCK_TTL, jid, "1" if entry.until_executed else "0", claim_ttl])
    code = int(result[0])
    previous = result[1].decode() if code == 1 and isinstance(result[1], bytes) else (
        result[1] if code == 1 else "")
    return code == 1, previous


def touch_running(redis: Any, keys: Keys, running_raws: Iterable[bytes], ttl: int = ACTIVE_TTL) -> None:
    """Keep alive the running locks of the periodic runs in ``running_raws`` (this process's record)."""
    for raw in running_raws:
        try:
            job = json.loads(raw)
        except ValueError:
            continue
        if isinstance(job, dict) and job.get("periodic_pjid") and job.get("jid"):
            scripts.HELD_LOCK(redis, [keys.periodic_running(job["periodic_pjid"])], [job["jid"], ttl])


def hold_queued(redis: Any, keys: Keys, pjid: str, jid: str) -> bool:
    """The run ``jid`` was pushed: hold its lock for its wait in the queue (QUEUED_TTL). False if
    the lock is no longer its own (it ran and released it already)."""
    return bool(scripts.HELD_LOCK(redis, [keys.periodic_running(pjid)], [jid, QUEUED_TTL]))


def release_running(redis: Any, keys: Keys, payload: dict) -> None:
    """Release the run's lock when it ends (only if it still holds it)."""
    if payload.get("periodic_pjid") and payload.get("jid"):
        scripts.HELD_LOCK(redis, [keys.periodic_running(payload["periodic_pjid"])], [payload["jid"], ""])


def retake_running(redis: Any, keys: Keys, payload: dict) -> None:
    """Orphan recovery requeued an interrupted run: hold its lock again until it runs."""
    if payload.get("periodic_pjid") and payload.get("jid"):
        key = keys.periodic_running(payload["periodic_pjid"])
        if not redis.set(key, payload["jid"], nx=True, ex=QUEUED_TTL):
            # Still held by this run (its process died within the lock's TTL):
            # renew it for the wait in the queue, or it could lapse there.
            scripts.HELD_LOCK(redis, [key], [payload["jid"], QUEUED_TTL])
