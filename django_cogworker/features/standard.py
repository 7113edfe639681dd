"""The package's own features, as a worker builds them: the first entry of its features, always
(engine/run/factories.py's STANDARD_FEATURES names :func:`build`), before a project's own
(``COGWORKER["FEATURES"]``, docs/extending.md).
"""

from __future__ import annotations

import logging

from ..engine.run.cancels import Cancels
from ..engine.run.hooks import Feature, WorkerParts
from ..engine.run.run_locks import RunLocks
from ..engine.run.timeouts import Timeouts
from ..push.job import registry
from .batches.hook import Batches
from .cancellation.hook import Cancellation
from .collapse.hook import KeepLast
from .encryption.hook import Encryption
from .encryption.keys import ring_for
from .expiry.hook import Expiry
from .fairness.hook import Lanes
from .fairness.limits import GROUP_LIMITS
from .history.hook import History
from .iteration.hook import Iteration
from .limits import upkeep
from .limits.gate import LimitGate
from .limits.hook import ClassLimits, InlineLimits, RefusalCount
from .locks.hook import RunLockRelease
from .profiling.hook import Profiling
from .progress.hook import Progress
from .results.hook import Results
from .results.writer import ResultWriter
from .tracing import features as tracing

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
    # A job past its timeout under a supervisor (--processes) that ignores it: this process exits and
    # is replaced; alone, it can only log it (see engine/run/timeouts.py).
    timeouts = Timeouts(grace=config.timeout_grace, replace_when_stuck=parts.supervised)
    # (Tracing first, when on: its span is the outermost around, holding the others' work and the run;
    # profiling last, the innermost around: it measures the job's run, not the others' work.)
    return [*tracing(config),
            Expiry(redis, keys), Cancellation(redis, keys, Cancels()),
            ClassLimits(gate, GROUP_LIMITS), InlineLimits(gate), RefusalCount(),
            RunLockRelease(RunLocks(redis, keys)),
            KeepLast(redis, keys, config.unique_lock_ttl), Results(ResultWriter(redis, keys, parts.identity), timeouts),
            Batches(redis, keys, config.batch_ttl), Encryption(ring), Progress(redis, keys),
            Iteration(redis, keys, config, parts.retry, ring),
            *([History(redis, keys)] if config.metrics_history else []), Profiling(redis, keys, parts.identity),
            Lanes(redis, keys, config.queue_names)]
