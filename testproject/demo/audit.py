"""An audit trail of every job's outcome: a feature of the project's own (docs/extending.md).

Named in ``COGWORKER["FEATURES"]`` as ``"testproject.demo.audit.audit"``; every worker then adds
one entry per job it settles to the Redis stream ``<prefix>audit`` (capped near 10,000 entries):
its jid, class, outcome (success, retry, dead, rescheduled), error class and run time.
"""

from __future__ import annotations

import logging

from django_cogworker.features import Feature, JobRun, WorkerParts

logger = logging.getLogger(__name__)


class Audit(Feature):
    name = "audit"

    def __init__(self, redis, stream: str):
        self.redis = redis
        self.stream = stream

    def after(self, run: JobRun) -> None:
        # After: the job is settled whatever this does (an exception here is logged, never the job's).
        decision = run.decision
        if decision is None:
            return
        self.redis.xadd(self.stream, {
            "jid": str(run.payload.get("jid")), "class": str(run.payload.get("class")),
            "outcome": decision.outcome.value, "error": type(decision.error).__name__ if decision.error else "",
            "ran": "1" if run.ran else "0", "seconds": f"{run.elapsed:.6f}",
        }, maxlen=10_000, approximate=True)


def audit(parts: WorkerParts) -> Audit:
    """The factory COGWORKER["FEATURES"] names: called once per worker process with its parts."""
    return Audit(parts.redis, parts.keys.prefix + "audit")
