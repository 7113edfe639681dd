"""Results and timeouts on the job's path, for the job classes that opt in (tasks; Job classes
with ``result_ttl`` or ``timeout``): only they have this hook in their Plan.

Around the run: the result record marked RUNNING first (a task's context reads its attempt and
record there), the job armed with its timeout (engine/run/timeouts.py), its return value kept as
JSON (a value JSON can't hold fails the job). Once its Decision is made, before it settles: the
record written (SUCCESSFUL; READY again when a retry or a reschedule is filed; FAILED when it goes
to dead, is dropped or discarded), and a task told of its failure (django.tasks' task_finished),
inside the core's handler of the error so that Django's receiver logs its traceback.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from ...engine.run.hooks import AsyncCall, Call, Decision, Feature, JobRun, Outcome
from ...engine.settle.retry import Filing
from ...push import payload as payloads
from .writer import ResultWriter, encode_return

if TYPE_CHECKING:
    from ...engine.run.timeouts import Timeouts

logger = logging.getLogger(__name__)


class Results(Feature):
    """Made by features/standard.py with the process's ResultWriter and Timeouts (the watcher's
    thread, started and stopped with the worker: ``start``, ``stop``); shared by the processor
    threads (what it keeps per job lives on the job)."""

    name = "results"

    def __init__(self, results: ResultWriter, timeouts: Timeouts | None):
        self.results = results
        self.timeouts = timeouts

    def start(self) -> None:
        if self.timeouts is not None:
            self.timeouts.start()

    def stop(self) -> None:
        if self.timeouts is not None:
            self.timeouts.stop()

    def applies(self, job_class: Any) -> bool:
        return job_class is not None and (job_class.result_ttl is not None or job_class.timeout is not None)

    def around(self, run: JobRun, call: Call) -> Any:
        token = self._begin(run)
        try:
            value = call()
        finally:
            if token is not None:
                self.timeouts.disarm(token)  # type: ignore[union-attr]
        return encode_return(value) if run.job_class.result_ttl is not None else value

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        """``around`` for a job on the event loop: its timeout cancels its task (run.interrupt), which
        raises JobTimeout from the await it was in."""
        token = self._begin(run)
        try:
            value = await call()
        finally:
            if token is not None:
                self.timeouts.disarm(token)  # type: ignore[union-attr]
        return encode_return(value) if run.job_class.result_ttl is not None else value

    def _begin(self, run: JobRun) -> int | None:
        """Record the start (a class keeping results) and arm the timeout; return its token."""
        cls, payload = run.job_class, run.payload
        ttl = cls.result_ttl
        if ttl is not None:
            # (A task's context reads its attempt number and record here; a name of our own, as
            # a job's own `result` attribute must not be overwritten.)
            run.job._cogworker_result = self.results.started(payload, ttl)
        timeout, token = cls.timeout, None
        if timeout is not None and self.timeouts is not None:
            token = self.timeouts.arm(timeout, str(payload.get("jid")), run.interrupt)
            if run.scope is not None:  # (an iterable job arms it anew before each item: a timeout bounds one)
                run.scope.extras["timeout"] = functools.partial(self.timeouts.rearm, token)
        return token

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        cls = run.job_class
        if decision.outcome is Outcome.RESCHEDULED and not run.ran:
            return decision  # (it never started: its record still reads READY)
        try:
            if decision.error is not None and self.timeouts is not None and cls.timeout is not None:
                # (Again, from the processor's frame: on CPython 3.13 a JobTimeout landing in run's
                # own frame can skip its finally, and a job still armed would be taken for stuck.)
                self.timeouts.disarm(None)
            if cls.result_ttl is not None:
                if decision.outcome is Outcome.SUCCESS:
                    self.results.finished(run.payload, cls.result_ttl, value=run.value)
                else:
                    end = decision.settlement.end
                    filing = end if isinstance(end, Filing) else None
                    self.results.finished(run.payload, cls.result_ttl, error=decision.error or RuntimeError("?"),
                                          target=filing.target if filing is not None else None)
        except Exception:
            logger.exception("jid=%s: recording its result failed", run.jid)
        if decision.outcome is not Outcome.SUCCESS:
            # A task's task_finished waits for this: whether it runs again is known only once filed.
            failed = getattr(run.job, "_cogworker_failed", None)
            if failed is not None:
                end = decision.settlement.end
                filing = end if isinstance(end, Filing) else None
                try:
                    failed(retried=filing is not None and filing.target in ("retry", "schedule"))
                except Exception:
                    logger.exception("jid=%s: telling its task's failure failed", payloads.printable(run.jid))
        return decision
