"""Every lock the fleet holds in Redis: one key, a holder's value, a TTL.

============================  ==============  ===================================================
key                           holder          taken / kept / released by
============================  ==============  ===================================================
``unique:<digest>``           the job's jid   the push, in the script that writes the job (PUSH);
                                              released when the job starts, succeeds or dies as
                                              its rule says (:mod:`unique`); its TTL
                                              is ``unique_for`` (plus a scheduled push's delay)
``periodic:running:<pjid>``   the run's jid   the slot claim (``PERIODIC_CLAIM``, CLAIM_TTL);
                                              :func:`hold_queued` once pushed; every heartbeat
                                              while it runs (:func:`touch_running`); released
                                              when the run ends; retaken by orphan recovery
``orphan_lock:<identity>``    the recovering  orphan recovery, for the time it requeues a dead
                              identity        process's list
============================  ==============  ===================================================

A lock is only ever renewed or released by its holder (``HELD_LOCK`` checks
the value in the same step): a lock that lapsed and was taken by another
holder is left to that one.

The running lock of an ``until_executed`` periodic entry is held for
QUEUED_TTL once the push went through: long, since the job may wait in a deep
queue. Only once the job exists: a claim whose push failed and whose rollback
was lost (the process restarted before it could retry it) held the lock for
QUEUED_TTL, 24 h of skipped slots, for a run that never existed; now it lapses
within the claim's TTL. While the job runs, every heartbeat of the process
running it sets it to ``active_ttl(ORPHAN_THRESHOLD)``, from the process's
in-memory record of running jobs, not from Redis (a failover that lost the
workers hash would otherwise let a long run's lock lapse mid-run). A process
that dies mid-run leaves it held: the TTL outlives orphan detection, and
orphan recovery takes it again (renewed to QUEUED_TTL) for the requeued run,
so no slot fires in between.

Outside ``engine/``: pushing a unique job takes a lock, and pushing imports
no worker code.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import redis as redis_lib

from ..errors import error_code
from . import scripts
from .keys import Keys
from .quarantine import quarantine_key
from .types import RedisClient

logger = logging.getLogger(__name__)

QUEUED_TTL = 24 * 3600
ACTIVE_TTL = 180  # the least a running lock is renewed to


# -- any lock ---------------------------------------------------------------------------------------

def take(redis: RedisClient, keys: Keys, key: str, holder: str, ttl: int) -> tuple[bool, Any]:
    """SET ``key`` ``holder`` NX EX ``ttl``: (True, None) when taken, else (False, the holder's value).

    A lock key that can't be a lock no longer holds for ever (a dead process's list never
    recovered): one of the wrong type is quarantined and the lock taken; one without an expiry (a
    manual write) is given ``ttl``. (A unique job's lock is taken by PUSH, which does the same.)
    """
    held_by = None
    for _attempt in range(2):
        if redis.set(key, holder, nx=True, ex=ttl):
            return True, None
        pipe = redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.ttl(key)
        held_by, left = pipe.execute(raise_on_error=False)
        if isinstance(held_by, redis_lib.exceptions.ResponseError) and error_code(held_by) == "WRONGTYPE":
            quarantine_key(redis, keys, key, "string", "is no lock (the wrong type)")
            continue
        if isinstance(held_by, Exception):
            raise held_by
        if left == -1:
            redis.expire(key, ttl)
            logger.error("%s held no expiry (a lock can't hold for ever): given %ds", key, ttl)
        break
    return False, held_by


def touch(redis: RedisClient, key: str, holder: str, ttl: int) -> bool:
    """Set the lock's TTL to ``ttl`` if ``holder`` still holds it; return whether it did."""
    return bool(scripts.HELD_LOCK(redis, [key], [holder, ttl]))


def release(redis: RedisClient, key: str, holder: str) -> bool:
    """Delete the lock if ``holder`` still holds it (had it lapsed, it may be another's now)."""
    return bool(scripts.HELD_LOCK(redis, [key], [holder, ""]))


# -- periodic running locks -------------------------------------------------------------------------

def active_ttl(orphan_threshold: float) -> int:
    """The TTL a running lock is renewed to while its run runs: longer than orphan detection takes.

    A lock that lapsed before orphan recovery had requeued the interrupted run
    (ORPHAN_THRESHOLD, 300 s by default, plus a poll) let the next slot start a
    second run beside it.
    """
    return int(max(ACTIVE_TTL, 2 * orphan_threshold + 60))


def touch_running(redis: RedisClient, keys: Keys, running_raws: Iterable[bytes], ttl: int = ACTIVE_TTL) -> None:
    """Keep alive the running locks of the periodic runs in ``running_raws`` (this process's record)."""
    for raw in running_raws:
        try:
            job = json.loads(raw)
        except ValueError:
            continue
        if isinstance(job, dict) and job.get("periodic_pjid") and job.get("jid"):
            touch(redis, keys.periodic_running(job["periodic_pjid"]), job["jid"], ttl)


def hold_queued(redis: RedisClient, keys: Keys, pjid: str, jid: str) -> bool:
    """The run ``jid`` was pushed: hold its lock for its wait in the queue (QUEUED_TTL). False if
    the lock is no longer its own (it ran and released it already)."""
    return touch(redis, keys.periodic_running(pjid), jid, QUEUED_TTL)


def release_running(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """Release the run's lock when it ends (only if it still holds it)."""
    if payload.get("periodic_pjid") and payload.get("jid"):
        release(redis, keys.periodic_running(payload["periodic_pjid"]), payload["jid"])


def retake_running(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """Orphan recovery requeued an interrupted run: hold its lock again until it runs."""
    if payload.get("periodic_pjid") and payload.get("jid"):
        key = keys.periodic_running(payload["periodic_pjid"])
        if not redis.set(key, payload["jid"], nx=True, ex=QUEUED_TTL):
            # Still held by this run (its process died within the lock's TTL):
            # renew it for the wait in the queue, or it could lapse there.
            touch(redis, key, payload["jid"], QUEUED_TTL)
