"""The features: each plugs into the job's path through the core's hooks (engine/run/hooks.py).

    batches       batches and workflows: a job's batch step settled before its ack
    limits        concurrency and rate limits: places taken before a run, given back after
    cancellation  a job cancelled before it runs, or told to stop while it runs
    expiry        a job fetched past its expires_at dropped unrun
    results       result records and timeouts, for the classes that keep them
    locks         a job's unique and periodic locks released when its rule says

Features depend on the core; the core names no feature (tests/test_layout.py). A worker builds
them with :func:`standard` (the first entry of ``COGWORKER["FEATURES"]``, always), then a
project's own (docs/extending.md).
"""

from __future__ import annotations

from ..engine.run.hooks import Feature, WorkerParts
from ..engine.run.results import ResultWriter
from .batches.hook import Batches
from .cancellation.hook import Cancellation
from .expiry.hook import Expiry
from .limits.gate import LimitGate
from .limits.hook import ClassLimits, InlineLimits
from .locks.hook import RunLockRelease
from .results.hook import Results


def standard(parts: WorkerParts) -> list[Feature]:
    """The package's features, in the order their hooks run (``around``: the first outermost;
    ``after``: the last first)."""
    redis, keys, config = parts.redis, parts.keys, parts.config
    gate = LimitGate(redis, keys, over_limit_max=config.over_limit_max, retry=parts.retry)
    return [Expiry(redis, keys), Cancellation(redis, keys, parts.cancels), ClassLimits(gate), InlineLimits(gate),
            RunLockRelease(parts.run_locks), Results(ResultWriter(redis, keys, parts.identity), parts.timeouts),
            Batches(redis, keys, config.batch_ttl)]
