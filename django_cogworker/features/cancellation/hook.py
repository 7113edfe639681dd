"""Cancellation on the job's path (requests: engine/run/cancels.py, read after each heartbeat by this
feature's chore; the API: cancel.py).

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
from collections.abc import Callable, Sequence
from typing import Any

from ...broker.keys import Keys, Want
from ...broker.quarantine import is_wrong_type, quarantine_wrong
from ...broker.types import RedisClient
from ...engine.run.cancels import Cancels
from ...engine.run.hooks import AsyncCall, Call, Decision, Feature, JobRun, Outcome
from ...engine.settle.settlement import ACK
from ...engine.settle.stats import count
from ...errors import Cancelled
from ...push import payload as payloads

logger = logging.getLogger(__name__)


class Cancellation(Feature):
    """Made by features/standard.py with the process's :class:`Cancels`, which its chore fills from
    the ``cancels`` hash after each heartbeat (one HGETALL: an empty reply while nobody cancels)."""

    name = "cancellation"

    def __init__(self, redis: RedisClient, keys: Keys, cancels: Cancels):
        self.redis = redis
        self.keys = keys
        self.cancels = cancels

    def applies(self, job_class: Any) -> bool:
        return job_class is None or bool(job_class.cancellable)

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        return (self.read_requests,)

    def read_requests(self, redis: RedisClient) -> None:
        """Read the cancel requests; tell the runs concerned; delete those older than REQUEST_TTL."""
        try:
            stored = redis.hgetall(self.keys.cancels)
        except Exception as exc:
            if not is_wrong_type(exc):
                raise
            # (a feature's key, which the key guard checks only every KEY_GUARD_INTERVAL: moved aside
            # now, once; read afresh after the next beat)
            quarantine_wrong(redis, self.keys, {self.keys.cancels: Want("hash")})
            return
        stale = self.cancels.update(stored)
        if stale:
            redis.hdel(self.keys.cancels, *stale)

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

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        """``around`` for a job on the event loop: an interrupt cancels its task (run.interrupt)."""
        jid = str(run.payload.get("jid"))
        self.cancels.started(jid, run.scope, run.interrupt)  # type: ignore[arg-type]
        try:
            return await call()
        finally:
            self.cancels.finished(jid)  # (on the loop's thread, as the interrupt's cancel: no race)

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
