"""A job's unique and periodic locks on the job's path: released when its rule says so (at its
start, its success, its death), through an outage (engine/run/run_locks.py keeps a release Redis
refused and tries it again with each heartbeat)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...broker.types import RedisClient
from ...engine.run.hooks import AsyncCall, Call, Feature, JobRun, Outcome
from ...engine.run.run_locks import RunLocks
from ...push import payload as payloads

logger = logging.getLogger(__name__)


class RunLockRelease(Feature):
    """Every class: whether a job holds a lock is its payload's to say."""

    name = "locks"
    fields = ("unique_digest", "periodic_pjid")

    def __init__(self, run_locks: RunLocks):
        self.run_locks = run_locks

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        return (self.run_locks.retry_pending,)  # (releases Redis refused, tried again after each beat)

    def stop(self) -> None:
        try:
            self.run_locks.retry_pending(self.run_locks.redis)
        except Exception as exc:  # (Redis away at shutdown: they expire at their TTL)
            logger.warning("at shutdown, lock releases kept through an outage not written: %s: %s",
                           type(exc).__name__, payloads.printable(exc))

    def requeued(self, payload: dict[str, Any]) -> None:
        if _locked(payload):
            self.run_locks(payload, "requeued")  # (a periodic run waits in its queue again: others kept out)

    def around(self, run: JobRun, call: Call) -> Any:
        self._started(run)
        return call()

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        self._started(run)
        return await call()

    def _started(self, run: JobRun) -> None:
        if _locked(run.payload):
            try:
                self.run_locks(run.payload, "start")
            except Exception as exc:  # (the job runs all the same; its locks go at their TTL)
                logger.error("run lock (start) failed for jid=%s: %s: %s", run.jid, type(exc).__name__,
                             payloads.printable(exc))

    def after(self, run: JobRun) -> None:
        decision = run.decision
        if decision is None or not _locked(run.payload):
            return
        if decision.outcome is Outcome.RESCHEDULED:
            if not run.ran:
                return  # (it never started: its locks stay as they are, for the run to come)
            # (It waits to run again, the same jid: its unique lock stays, and its periodic run's is held
            # for the wait, as for a run handed back at shutdown; released, as for a retry, the next slot
            # of an ``until_executed`` entry started beside an iterable job waiting between two runs.)
            moment = "requeued"
        else:
            moment = decision.outcome.value
        self.run_locks(run.payload, moment)


def _locked(payload: dict[str, Any]) -> bool:
    return bool(payload.get("unique_digest") or payload.get("periodic_pjid"))
