"""Cancellation on the job's path (requests: engine/run/cancels.py; the API: flow/cancel.py).

* A job with a cancel request is dropped before it runs: acknowledged, counted in
  ``stat:cancelled``, logged, never run; dead for its batch, FAILED for its result.
* A run is told of a request made while it runs (``Job.cancelled``; an interrupt for one that
  asked for it), and one that ends cancelled (it stopped when asked, or ran on) is dead, never
  retried, whatever it returned or raised.

Only for a class that can be cancelled (``Job.cancellable``), or one this worker doesn't know: a
class that can't ignores a request (one written while ``cancel`` looked for the job, before it
found what it was and withdrew it).
"""

from __future__ import annotations

import logging
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.cancels import Cancels
from ...engine.run.hooks import Call, Decision, Feature, JobRun, Outcome
from ...engine.settle.settlement import ACK
from ...engine.settle.stats import count
from ...errors import Cancelled
from ...push import payload as payloads

logger = logging.getLogger(__name__)


class Cancellation(Feature):
    name = "cancellation"

    def __init__(self, redis: RedisClient, keys: Keys, cancels: Cancels):
        self.redis = redis
        self.keys = keys
        self.cancels = cancels

    def applies(self, job_class: Any) -> bool:
        return job_class is None or bool(job_class.cancellable)

    def before(self, run: JobRun) -> Decision | None:
        if not self.cancels.requested(run.payload.get("jid")):
            return None
        error = Cancelled("cancelled before it ran")
        logger.warning("cancelled jid=%s class=%s: dropped, never run (%s)", run.jid, run.shown_class,
                       payloads.printable(error))
        count(self.redis, self.keys.stat_cancelled)
        return Decision(Outcome.DEAD, ACK, error)

    def around(self, run: JobRun, call: Call) -> Any:
        jid = str(run.payload.get("jid"))
        self.cancels.started(jid, run.scope)  # type: ignore[arg-type]  # (set before any around hook)
        try:
            value = call()
            self.cancels.finished(jid)  # (in the try: an interrupt sent as the job returned lands below)
        except BaseException:
            self.cancels.finished(jid)  # (first: an interrupt sent late must not land further out)
            raise
        return value

    def decide(self, run: JobRun) -> Decision | None:
        cancelled = run.scope is not None and run.scope.cancelled
        if not (cancelled or isinstance(run.error, Cancelled)):
            return None
        # (It stopped when asked, or ran on: either way not a success, and never retried.)
        error = run.error if run.error is not None else Cancelled("cancelled while it ran")
        logger.warning("cancelled jid=%s class=%s after %.3fs: %s", run.jid, run.shown_class, run.elapsed,
                       payloads.printable(error))
        count(self.redis, self.keys.stat_cancelled)
        return Decision(Outcome.DEAD, ACK, error)
