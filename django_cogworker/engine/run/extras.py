"""What a processor does around a job that opts in to a result record or a timeout.

The processor reads two attributes of the job's class (``result_ttl``, ``timeout``: all a plain
job pays) and, for one that sets either, runs it through :meth:`JobExtras.run` and tells
:meth:`JobExtras.succeeded` or :meth:`JobExtras.failed` how it ended. Kept out of
``processor.py``: results (:mod:`.results`) and timeouts (:mod:`.timeouts`) live here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...push import payload as payloads
from .results import ResultWriter, encode_return

if TYPE_CHECKING:
    from ..settle.retry import Filing
    from .timeouts import Timeouts

logger = logging.getLogger(__name__)


class JobExtras:
    """Result records and timeouts around a job's run.

    Created by the Launcher with the process's ResultWriter and Timeouts; shared by the
    processor threads (what it keeps per job lives on the job and the payload).
    """

    def __init__(self, results: ResultWriter, timeouts: Timeouts | None):
        self.results = results
        self.timeouts = timeouts

    def run(self, job: Any, payload: dict, chain: Callable[[Any, dict], Any]) -> str | None:
        """Run ``job`` through ``chain``, its record marked RUNNING first, under its timeout;
        return its return value as JSON when it keeps a result (a value JSON can't hold fails it)."""
        cls = type(job)
        ttl = cls.result_ttl
        if ttl is not None:
            # (A task's context reads its attempt number and record here; a name of our own, as
            # a job's own `result` attribute must not be overwritten.)
            job._cogworker_result = self.results.started(payload, ttl)
        timeout, token = cls.timeout, None
        if timeout is not None and self.timeouts is not None:
            token = self.timeouts.arm(timeout, str(payload.get("jid")))
        try:
            value = chain(job, payload)
        finally:
            if token is not None:
                self.timeouts.disarm(token)  # type: ignore[union-attr]
        return encode_return(value) if ttl is not None else None

    def succeeded(self, job_class: Any, payload: dict, value: str | None) -> None:
        """Record a success; never raises (the job is acked next, whatever happens here)."""
        try:
            if job_class.result_ttl is not None:
                self.results.finished(payload, job_class.result_ttl, value=value)
        except Exception:
            logger.exception("jid=%s: recording its success failed", payloads.printable(payload.get("jid")))

    def failed(self, job_class: Any, payload: dict, exc: BaseException, filing: Filing | None,
               job: Any = None) -> None:
        """Record a failure and where it went, then tell a task (``job``, None if it could not be made);
        never raises (the job is filed next, whatever happens here).

        Called inside the processor's handler of ``exc``: what a task tells django.tasks is logged
        there with its traceback.
        """
        try:
            if self.timeouts is not None and job_class.timeout is not None:
                # (Again, from the processor's frame: on CPython 3.13 a JobTimeout landing in run's
                # own frame can skip its finally, and a job still armed would be taken for stuck.)
                self.timeouts.disarm(None)
            if job_class.result_ttl is not None:
                self.results.finished(payload, job_class.result_ttl, error=exc,
                                      target=filing.target if filing is not None else None)
        except Exception:
            logger.exception("jid=%s: recording its failure failed", payloads.printable(payload.get("jid")))
        # A task's task_finished waits for this: whether it runs again is known only once filed (tasks.py).
        failed = getattr(job, "_cogworker_failed", None)
        if failed is not None:
            try:
                failed(retried=filing is not None and filing.target in ("retry", "schedule"))
            except Exception:
                logger.exception("jid=%s: telling its task's failure failed", payloads.printable(payload.get("jid")))
