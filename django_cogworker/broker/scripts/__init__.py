"""Every Lua script, each with its KEYS/ARGV header.

All keys come in KEYS (never built inside Lua), so the scripts stay cluster
safe; the one exception, a queue's lanes, named by the fetch scripts from the queue key they are
given, share its slot (:mod:`.lanes`). Run through :class:`Script`: EVALSHA, reloaded on NOSCRIPT (a Redis
restart or SCRIPT FLUSH forgets them).

The rule from cogworker 0.5.0 for every script that moves a job: write the
destination first, remove the source second. A script stopped by an error keeps
the writes made before it, so a remove followed by a failing push (the
destination holding the wrong type) lost the job.

One module per area: :mod:`.push` (a push), :mod:`.jobs` (a job's life after it), :mod:`.periodic` (periodic
entries and locks), :mod:`.admin` (the api's scripts), :mod:`.slots` (the steps of a cluster's
crossings between slots); :mod:`._base` runs them and lists them all (``_base.EVERY``). Every name is
re-exported here: callers write ``scripts.PUSH``.

A feature's scripts live in its folder (``features/<feature>/scripts.py``: batches, limits, result
records) and its modules import them from there: broker/ imports nothing above it.
"""

from __future__ import annotations

from ._base import Script
from .admin import (
    ENTRIES_AFTER,
    PREVIEW,
    PRUNE_QUEUES,
    REQUEUE_FROM_ZSET_BATCH,
    RESTORE_QUARANTINED,
    SCAN_PREVIEW,
    requeue_from_zset_batch_args,
)
from .jobs import (
    CLAIM_AND_REQUEUE,
    CONFIRM_HELD,
    FETCH_BASIC,
    FETCH_RELIABLE,
    FILE_FAILURE,
    FILE_UNSETTLED,
    FORGET_IDENTITY,
    MOVE_BETWEEN_ZSETS,
    ORPHAN_TO_DEAD,
    PARK_UNSETTLED,
    QUARANTINE,
    REQUEUE,
    UNTAKE,
    requeue_args,
)
from .lanes import STRICT_STEP
from .periodic import HELD_LOCK, PERIODIC_CLAIM, PERIODIC_ENABLE, PERIODIC_ROLLBACK
from .push import PUSH, RECEIPT_TTL, push_args
from .slots import ADD_TRIMMED, LEASE, UNLEASE

__all__ = [
    "Script",
    "PUSH",
    "push_args",
    "RECEIPT_TTL",
    "CLAIM_AND_REQUEUE",
    "CONFIRM_HELD",
    "MOVE_BETWEEN_ZSETS",
    "FILE_FAILURE",
    "FETCH_RELIABLE",
    "FETCH_BASIC",
    "REQUEUE",
    "UNTAKE",
    "STRICT_STEP",
    "requeue_args",
    "ORPHAN_TO_DEAD",
    "PARK_UNSETTLED",
    "FILE_UNSETTLED",
    "FORGET_IDENTITY",
    "QUARANTINE",
    "PERIODIC_CLAIM",
    "PERIODIC_ROLLBACK",
    "PERIODIC_ENABLE",
    "HELD_LOCK",
    "REQUEUE_FROM_ZSET_BATCH",
    "ENTRIES_AFTER",
    "requeue_from_zset_batch_args",
    "RESTORE_QUARANTINED",
    "PREVIEW",
    "SCAN_PREVIEW",
    "PRUNE_QUEUES",
    "ADD_TRIMMED",
    "LEASE",
    "UNLEASE",
]

