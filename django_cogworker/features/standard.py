"""The package's own features, as a worker builds them: the first entry of its features, always
(engine/run/factories.py's STANDARD_FEATURES names :func:`build`), before a project's own
(``COGWORKER["FEATURES"]``, docs/extending.md).
"""

from __future__ import annotations

import logging

from ..engine.run.hooks import Feature, WorkerParts
from ..push.job import registry
from .batches.hook import Batches
from .cancellation.hook import Cancellation
from .encryption.hook import Encryption
from .encryption.keys import ring_for
from .expiry.hook import Expiry
from .limits import upkeep
from .limits.gate import LimitGate
from .limits.hook import ClassLimits, InlineLimits
from .locks.hook import RunLockRelease
from .results.hook import Results
from .results.writer import ResultWriter

logger = logging.getLogger(__name__)


def build(parts: WorkerParts) -> list[Feature]:
    """The package's features, in the order their hooks run (``around``: the first outermost;
    ``after``: the last first)."""
    redis, keys, config = parts.redis, parts.keys, parts.config
    # (runcogworker's system checks refuse to start with these: cogworker.E004, checks.py)
    for problem in upkeep.problems(config.heartbeat_interval, registry()):
        logger.error("%s", problem)
    gate = LimitGate(redis, keys, over_limit_max=config.over_limit_max, retry=parts.retry)
    ring = ring_for(config.encryption_keys) if config.encryption_keys else None
    return [Expiry(redis, keys), Cancellation(redis, keys, parts.cancels), ClassLimits(gate), InlineLimits(gate),
            RunLockRelease(parts.run_locks), Results(ResultWriter(redis, keys, parts.identity), parts.timeouts),
            Batches(redis, keys, config.batch_ttl), Encryption(ring)]
