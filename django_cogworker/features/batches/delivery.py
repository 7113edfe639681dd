"""Delivering fired callbacks from a batch's outbox to their queues, each once.

A step that fires an event writes its callbacks to the batch's outbox in the same script
(features/batches/scripts.py). Whoever ran that step delivers them next: each by BATCH_DELIVER,
which pushes it only if its delivery mark is not set yet (and sets it), then takes it off the
outbox. On a cluster the mark and the queue are in the queue's slot and the outbox in the
batch's, so these are two steps; one that dies between them leaves the callback on the outbox
with its mark set, and the next delivery (the job's step run again: its ack waits for this)
only takes it off. Pushed once either way.

The one deliverer that no job stands behind is the pusher whose jobs() block fires the events as
it closes (an empty batch; a batch whose jobs all ran while its block was open). It enters the
batch in ``batch_closing`` before the close, and takes it off once it delivered: a closer that died
in between leaves it there, and :func:`sweep_closing` (the workers' housekeeping) delivers it.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from ...broker.keys import BatchKeys, Keys, Want
from ...broker.quarantine import guarded, run_script
from . import scripts

# A closing older than this is taken for its closer's death: its own delivery takes milliseconds.
CLOSING_GRACE = 30.0
SWEEP_BATCH = 100  # closings looked at per sweep at most

logger = logging.getLogger(__name__)


def deliver(redis: Any, keys: Keys, bid: str, ttl: float) -> int:
    """Push every callback waiting on batch ``bid``'s outbox; return how many were pushed here.
    A key of the wrong type met on the way (the outbox, a callback's queue or mark) is moved to
    quarantine and the step made again (broker/quarantine.py).

    Under the test helpers (testing.fake/inline) each goes to their stand-in instead of its queue,
    once all the same (its delivery mark): collected by fake, run by inline."""
    bk = keys.batch(bid)
    pushed = 0
    stand_in = _stand_in()
    for entry in guarded(redis, keys, lambda: {bk.outbox: bk.expected(ttl)[bk.outbox]},
                         lambda: redis.lrange(bk.outbox, 0, -1)):
        queue, jid, payload = json.loads(entry)
        if stand_in is not None:
            first = redis.set(keys.batch_delivered(queue, jid), "1", nx=True, ex=max(1, int(ttl)))
            redis.lrem(bk.outbox, 1, entry)  # (first: the stand-in may run it now, and that may deliver again)
            if first:
                stand_in.deliver(json.loads(payload))
                pushed += 1
            continue
        queue_keys = [keys.batch_delivered(queue, jid), keys.queue(queue)]
        if not keys.spread:
            queue_keys.append(keys.queues)
        types = dict(zip(queue_keys, (Want("string"), Want("list"), Want("set")), strict=False))
        if int(run_script(scripts.BATCH_DELIVER, redis, keys, queue_keys, [payload, str(max(1, int(ttl))), queue],
                          types)):
            pushed += 1
            logger.info("batch %s: callback jid=%s pushed to %s", bid, jid, queue)
            if keys.spread:
                redis.sadd(keys.queues, queue)
        redis.lrem(bk.outbox, 1, entry)
    return pushed


def _stand_in() -> Any:
    """The test helpers' client when one is installed (push/runtime.py), else None."""
    from ...push import runtime

    return runtime.get_override()


def closing(redis: Any, keys: Keys, bid: str, now: float) -> float:
    """Enter ``bid`` in ``batch_closing`` before its block's close; return its score, for :func:`closed`.
    (One of the wrong type is moved aside at once: failing here, the block's close never came,
    and the batch stayed open, its callbacks never fired.)"""
    guarded(redis, keys, _closing_type(keys), lambda: redis.zadd(keys.batch_closing, {bid: now}))
    return now


def closed(redis: Any, keys: Keys, bid: str, score: float) -> None:
    """Its callbacks are delivered: forget the closing (unless another began since)."""
    run_script(scripts.BATCH_CLOSED, redis, keys, [keys.batch_closing], [bid, repr(score)], _closing_type(keys))


def _closed_and_delivered(redis: Any, bk: BatchKeys) -> bool:
    return redis.scard(bk.open) == 0 and redis.llen(bk.outbox) == 0


def _closing_type(keys: Keys) -> dict[str, Want]:
    return {keys.batch_closing: Want("zset")}


def sweep_closing(redis: Any, keys: Keys, ttl: float, now: float) -> int:
    """Deliver the callbacks of closings older than CLOSING_GRACE (their closer died between the
    close and its delivery); return how many were pushed. A closing whose block never closed
    (its closer died inside it) waits while the batch lives: it may still close; once the batch
    expired, it goes."""
    pushed = 0
    for raw, score in guarded(redis, keys, _closing_type(keys), lambda: redis.zrangebyscore(
            keys.batch_closing, "-inf", now - CLOSING_GRACE, start=0, num=SWEEP_BATCH, withscores=True)):
        bid = raw.decode() if isinstance(raw, bytes) else raw
        bk = keys.batch(bid)
        if not redis.exists(bk.meta):
            closed(redis, keys, bid, score)
            continue
        pushed += deliver(redis, keys, bid, ttl)
        settled = functools.partial(_closed_and_delivered, redis, bk)
        if guarded(redis, keys, functools.partial(bk.expected, ttl), settled):
            closed(redis, keys, bid, score)
        else:
            redis.zadd(keys.batch_closing, {bid: now}, xx=True)  # (looked at again a grace later)
    if pushed:
        logger.warning("delivered %d batch callback(s) whose pusher died as it closed their batch", pushed)
    return pushed
