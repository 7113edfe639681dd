"""Moves between a queue's slot and the home slot on a Redis Cluster, each in two steps.

On a cluster (``Keys.spread``) a queue's list and its in-progress lists live in the queue's
own slot, and retry, dead, schedule, unsettled and the registries in the home slot (keys.py).
No script or transaction can span two slots, so a job crossing between them moves in two
commands, always **destination first, source second**: a crash (or a lost connection) between
the two leaves the job in both places, and at worst runs it twice, never loses it
(docs/guarantees.md names each window). Without a cluster none of this runs: the one-script
moves of scripts/jobs.py do the same atomically.

Who calls what: the fetch (``file_from_list``: a failure filed), orphan recovery
(``file_from_list`` to dead, ``requeue_in_slot``), settling (``park_from_list``), the due poller
and the admin (``zset_to_queues``: schedule, retry or dead to their queues, under a lease).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import scripts
from ._types import RedisClient
from .errors import is_unavailable
from .keys import Keys

# How far ahead a leased entry is re-scored: its mover has this long to push it and remove
# it; one that dies in between leaves it to come due again then (and be moved once more).
LEASE_SECONDS = 60.0

MOVED, GONE = 1, 0


def file_from_list(redis: RedisClient, list_key: str, target: str, raw: bytes, score: Any, payload: Any,
                   below: Any = "", cap: Any = "") -> None:
    """File ``payload`` in ``target`` (retry or dead, trimmed as FILE_FAILURE trims), then take
    ``raw`` off ``list_key`` (an in-progress list, in its queue's slot)."""
    scripts.ADD_TRIMMED(redis, [target], [score, payload, below, cap])
    redis.lrem(list_key, 1, raw)  # type: ignore[arg-type]  # (redis-py takes bytes)


def park_from_list(redis: RedisClient, list_key: str, unsettled: str, raw: bytes, record: str) -> None:
    """Hand a job over to ``unsettled`` (home), then take it off ``list_key``: PARK_UNSETTLED in two steps."""
    redis.lpush(unsettled, record)
    redis.lrem(list_key, 1, raw)  # type: ignore[arg-type]


def requeue_in_slot(redis: RedisClient, keys: Keys, list_key: str, queue: str, acks: Sequence[bytes],
                    moves: Sequence[tuple[bytes, Any]]) -> int:
    """Drop ``acks`` from ``list_key`` and push each ``(raw on it, payload to push)`` back to the
    head of ``queue`` (the list's own queue: one slot, one script); then list the queue (best-effort,
    a name pruned while its job ran). Return how many went back."""
    queue_key = keys.queue(queue)
    moved = int(scripts.REQUEUE(redis, *scripts.requeue_args(
        list_key, None, acks, [(raw, payload, queue_key, queue) for raw, payload in moves])))
    if moved:
        try:
            redis.sadd(keys.queues, queue)
        except Exception as exc:
            if is_unavailable(exc):
                raise
    return moved


def zset_to_queues(redis: RedisClient, keys: Keys, source: str,
                   moves: Sequence[tuple[bytes, float, str, Any]], now: float) -> list[Any]:
    """Move entries of ``source`` to their queues: each ``(raw, score read, queue, payload to push)``.

    Lease them all (one script: each still scored as read is re-scored LEASE_SECONDS ahead),
    push the leased ones and list their queues (one pipeline), then remove the pushed ones.
    Two movers that read the same entry: only one leases it. Return per move MOVED, GONE (not
    leased: moved or changed by another), or the exception its push raised (it stays, leased:
    it comes due again at the lease). Redis away or refusing writes raises, after the removals
    of what was pushed.
    """
    if not moves:
        return []
    args: list[Any] = []
    for raw, score, _queue, _payload in moves:
        args += [raw, repr(float(score))]
    leased = scripts.LEASE(redis, [source], [*args, repr(now + LEASE_SECONDS)])
    taken = [move for move, ok in zip(moves, leased, strict=True) if int(ok)]
    outcomes: dict[int, Any] = {}
    if taken:
        pipe = redis.pipeline(transaction=False)
        for _raw, _score, queue, payload in taken:
            pipe.lpush(keys.queue(queue), payload)
        listed = sorted({queue for _raw, _score, queue, _payload in taken})
        for queue in listed:
            pipe.sadd(keys.queues, queue)
        replies = pipe.execute(raise_on_error=False)
        pushed = [move[0] for move, reply in zip(taken, replies, strict=False) if not isinstance(reply, Exception)]
        if pushed:
            redis.zrem(source, *pushed)
        for move, reply in zip(taken, replies, strict=False):
            outcomes[id(move)] = reply if isinstance(reply, Exception) else MOVED
        refused = next((r for r in replies[:len(taken)] if isinstance(r, Exception) and is_unavailable(r)), None)
        if refused is not None:
            raise refused
    return [outcomes.get(id(move), GONE) for move in moves]
