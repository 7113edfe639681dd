"""Unique jobs: at most one job with the same class, arguments and queue pushed at a time.

    class RebuildIndex(Job):
        unique_for = 600            # seconds (True: UNIQUE_LOCK_TTL); a crash can't hold a lock forever
        unique_until = "success"    # or "start"

A push takes ``unique:<digest>`` (holding the jid, TTL ``unique_for`` plus the
delay of a scheduled push) in the same script that writes the job (PUSH: a lock
is never there without its job); a duplicate push returns None and logs which
jid holds the lock. The lock goes when the job succeeds ("success", the
default: a job waiting in retry keeps it), when it starts ("start"), or when it
dies; otherwise at its TTL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..broker import locks
from ..broker.keys import Keys
from ..broker.types import RedisClient

UNTIL = ("success", "start")


def digest(payload: dict[str, Any]) -> str:
    """Hash of job, args, kwargs and queue (key order of kwargs doesn't matter)."""
    basis = json.dumps([payload["class"], payload["args"], payload["kwargs"], payload["queue"]],
                       sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(basis.encode()).hexdigest()


def lock_ttl(payload: dict[str, Any], now: float, default: float) -> int:
    """``unique_for`` (True: ``default``, UNIQUE_LOCK_TTL) plus the delay of a scheduled push."""
    delay = max(float(payload.get("at") or now) - now, 0.0)
    ttl = default if payload["unique_for"] is True else payload["unique_for"]
    return max(int(ttl + delay + 0.999), 1)


def release(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """Release the lock if this payload's jid still holds it."""
    locks.release(redis, keys.unique(payload["unique_digest"]), payload["jid"])


def release_at(redis: RedisClient, keys: Keys, payload: dict[str, Any], moment: str) -> None:
    """Release at ``moment`` ("start", "success", "dead") when the job's rule says so."""
    if not payload.get("unique_digest"):
        return
    until = payload.get("unique_until", "success")
    if moment == "dead" or moment == until:
        release(redis, keys, payload)
