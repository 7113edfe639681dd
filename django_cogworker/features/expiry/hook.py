"""Expiry on the job's path: a job past its ``expires_at`` (``expires_in`` at its push) is dropped
before it runs: acknowledged, counted in ``stat:expired``, logged with its jid and class, never run.

Dropped, it counts as dead for its batch (it will never succeed), and a task's result reads FAILED
(the batches and results features see the Decision like any other).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.hooks import Decision, Feature, JobRun, Outcome
from ...engine.settle.settlement import ACK
from ...engine.settle.stats import count
from ...errors import JobExpired
from ...push import payload as payloads

logger = logging.getLogger(__name__)


class Expiry(Feature):
    """Drops a job fetched after its ``expires_at`` (a field any push may set: every class)."""

    name = "expiry"
    fields = ("expires_at",)

    def __init__(self, redis: RedisClient, keys: Keys, clock: Any = time.time):
        self.redis = redis
        self.keys = keys
        self.clock = clock

    def before(self, run: JobRun) -> Decision | None:
        expires_at = run.payload.get("expires_at")
        if expires_at is None or type(expires_at) not in (int, float) or not math.isfinite(expires_at):
            return None
        now = self.clock()
        if now < expires_at:
            return None
        error = JobExpired(f"expired {now - expires_at:.1f}s before it could run")
        logger.warning("expired jid=%s class=%s: dropped, never run (%s)", run.jid, run.shown_class,
                       payloads.printable(error))
        count(self.redis, self.keys.stat_expired)
        return Decision(Outcome.DEAD, ACK, error)
