"""Delivering fired callbacks from a batch's outbox to their queues, each once.

A step that fires an event writes its callbacks to the batch's outbox in the same script
(broker/scripts/batches.py). Whoever ran that step delivers them next: each by BATCH_DELIVER,
which pushes it only if its delivery mark is not set yet (and sets it), then takes it off the
outbox. On a cluster the mark and the queue are in the queue's slot and the outbox in the
batch's, so these are two steps; one that dies between them leaves the callback on the outbox
with its mark set, and the next delivery (the job's step run again: its ack waits for this)
only takes it off. Pushed once either way.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..broker import scripts
from ..broker.keys import Keys

logger = logging.getLogger(__name__)


def deliver(redis: Any, keys: Keys, bid: str, ttl: float) -> int:
    """Push every callback waiting on batch ``bid``'s outbox; return how many were pushed here."""
    bk = keys.batch(bid)
    pushed = 0
    for entry in redis.lrange(bk.outbox, 0, -1):
        queue, jid, payload = json.loads(entry)
        queue_keys = [keys.batch_delivered(queue, jid), keys.queue(queue)]
        if not keys.spread:
            queue_keys.append(keys.queues)
        if int(scripts.BATCH_DELIVER(redis, queue_keys, [payload, str(max(1, int(ttl))), queue])):
            pushed += 1
            logger.info("batch %s: callback jid=%s pushed to %s", bid, jid, queue)
            if keys.spread:
                redis.sadd(keys.queues, queue)
        redis.lrem(bk.outbox, 1, entry)
    return pushed
