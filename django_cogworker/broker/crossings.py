"""Moves between a queue's slot and the home slot on a Redis Cluster, each in two steps.

On a cluster (``Keys.spread``) a queue's list and its in-progress lists live in the queue's
own slot, and retry, dead, schedule, unsettled and the registries in the home slot (keys/).
No script or transaction can span two slots, so a job crossing between them moves in two
commands, always **destination first, source second**: a crash (or a lost connection) between
the two leaves the job in both places, and at worst runs it twice, never loses it
(docs/guarantees.md names each window). Without a cluster none of this runs: the one-script
moves of broker/scripts/jobs.py do the same atomically.

Who calls what: the fetch (``file_from_list``: a failure filed), orphan recovery
(``file_from_list`` to dead, ``requeue_in_slot``), settling (``park_from_list``), the due poller
and the admin (``zset_to_queues``: schedule, retry or dead to their queues, under a lease).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import is_unavailable
from . import scripts
from .keys import Keys
from .scripts.lanes import in_lane
from .types import RedisClient

# How far ahead a leased entry is re-scored: its mover has this long to push it and remove
# it; one that dies in between leaves it to come due again then (and be moved once more).
LEASE_SECONDS = 60.0

MOVED, GONE = 1, 0


def file_from_list(redis: RedisClient, list_key: str | bytes, target: str, raw: bytes, score: Any, payload: Any,
                   below: Any = "", cap: Any = "") -> None:
    """File ``payload`` in ``target`` (retry or dead, trimmed as FILE_FAILURE trims), then take
    ``raw`` off ``list_key`` (an in-progress list, in its queue's slot)."""
    scripts.ADD_TRIMMED(redis, [target], [score, payload, below, cap])
    redis.lrem(list_key, 1, raw)  # type: ignore[arg-type]  # (redis-py takes bytes)


def park_from_list(redis: RedisClient, list_key: str, unsettled: str, raw: bytes, record: str) -> None:
    """Hand a job over to ``unsettled`` (home), then take it off ``list_key``: PARK_UNSETTLED in two steps."""
    redis.lpush(unsettled, record)
    redis.lrem(list_key, 1, raw)  # type: ignore[arg-type]


def requeue_in_slot(redis: RedisClient, keys: Keys, list_key: str | bytes, queue: str | bytes,
                    acks: Sequence[bytes], moves: Sequence[tuple[bytes, Any]]) -> int:
    """Drop ``acks`` from ``list_key`` and push each ``(raw on it, payload to push)`` back to the
    head of ``queue`` (the list's own queue: one slot, one script; bytes: its name as stored in
    ``queues``, which may not be UTF-8); then list the queue (best-effort, a name pruned while
    its job ran). Return how many went back."""
    queue_key = keys.queue_member_key(queue) if isinstance(queue, bytes) else keys.queue(queue)
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
    push the leased ones and list their queues (one pipeline), then remove the pushed ones and
    put those whose push failed back at the score they had (UNLEASE). Two movers that read the
    same entry: only one leases it. Return per move MOVED, GONE (not leased: moved or changed
    by another), or the exception its push raised (it stays where it was). Redis away or
    refusing writes raises, after the removals of what was pushed; only a mover that dies
    between the lease and the end leaves an entry leased, to come due again at the lease.
    """
    if not moves:
        return []
    lease = repr(now + LEASE_SECONDS)
    leased = scripts.LEASE(redis, [source], [*_as_read(moves), lease])
    taken = [move for move, ok in zip(moves, leased, strict=True) if int(ok)]
    outcomes: dict[int, Any] = {}
    if taken:
        pipe = redis.pipeline(transaction=False)
        for _raw, _score, queue, payload in taken:
            (pipe.rpush if in_lane(payload) else pipe.lpush)(keys.queue(queue), payload)  # (lanes.py's PUSH_END)
        listed = sorted({queue for _raw, _score, queue, _payload in taken})
        for queue in listed:
            pipe.sadd(keys.queues, queue)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception:
            # (Which pushes went through is unknown: one that did is pushed again when it comes
            # due, as it would have been at the lease.)
            scripts.UNLEASE(redis, [source], [*_as_read(taken), lease])
            raise
        pushed = [move[0] for move, reply in zip(taken, replies, strict=False) if not isinstance(reply, Exception)]
        if pushed:
            redis.zrem(source, *pushed)
        failed = [move for move, reply in zip(taken, replies, strict=False) if isinstance(reply, Exception)]
        if failed:
            scripts.UNLEASE(redis, [source], [*_as_read(failed), lease])
        for move, reply in zip(taken, replies, strict=False):
            outcomes[id(move)] = reply if isinstance(reply, Exception) else MOVED
        refused = next((r for r in replies[:len(taken)] if isinstance(r, Exception) and is_unavailable(r)), None)
        if refused is not None:
            raise refused
    return [outcomes.get(id(move), GONE) for move in moves]


def _as_read(moves: Sequence[tuple[bytes, float, str, Any]]) -> list[Any]:
    """LEASE's and UNLEASE's pairs: each entry as stored, and the score it was read with."""
    pairs: list[Any] = []
    for raw, score, _queue, _payload in moves:
        pairs += [raw, repr(float(score))]
    return pairs
