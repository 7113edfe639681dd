"""A processor thread: the core of a job's path (decode, run, settle), with features plugged in.

For each fetched job: decode it, look up its class and that class's Plan (the hooks of the
features it uses, engine/run/hooks.py), let the ``before`` hooks settle it unrun, record it as
running, run it through the ``around`` hooks and the server middleware, decide what becomes of
it (a feature's ``decide``, else the core's: a success is acked, a failure filed by the retry
policy), let the ``settling`` hooks shape the settlement, settle it exactly once, count it, and
run the ``after`` hooks. This module names no feature.

Settling: the job's one Settlement (an ack or a filing, after the features' steps) goes into the
settlement queue (engine/settle/queue.py), which sends it with the fetcher's next round trip or at
once. One Redis refuses is kept by the Settler as a pending settlement and retried by the heartbeat:
the job already ran, so it is never put back to run again by that path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ... import joblog
from ...errors import FeatureError, PayloadError, UnknownJobError
from ...push import payload as payloads
from ...push import scope as _scope
from ...push.job import registered
from ..fetch.contract import Unit
from ..settle.retry import Filing
from ..settle.settlement import ACK, Settlement
from .failures import dead_filing, fate_of, log_safely
from .hooks import DECODED, Decision, JobRun, Outcome, Plan, Plans, feature_error
from .tracebacks import from_user_code, trimmed

if TYPE_CHECKING:
    from ..fetch.fetcher import Fetcher
    from ..fetch.ledger import Ledger
    from ..settle.queue import SettlementQueue
    from ..settle.retry import RetryPolicy
    from ..settle.stats import Stats

logger = logging.getLogger(__name__)


class Processor:
    """Runs one job at a time on its own thread, and settles it.

    Created by the Manager, ``concurrency`` of them, each handed what it works
    with: the fetcher's hand-over (``next_unit``, ``processor_idle``), the
    ledger (what runs), the settlement queue (where each settlement goes), the retry
    policy (where a failure goes), the stats, the server middleware chain and
    the features' Plans. ``start`` runs ``run`` on the ``cogworker-processor-<index>``
    daemon thread, which loops until it is handed ``None`` (the Manager's stop);
    quiet doesn't concern it (no more jobs come). A processor that dies of a bug
    tells ``on_death`` (the Manager replaces it); the job it held stays on the
    in-progress list (reliable fetch) for reconciliation or orphan recovery.

    Built without a ``handover``, a processor is called, not started: ``process(unit)`` runs one
    job on the caller's thread and puts its settlement in the queue it was given (one never
    opened by a fetcher settles at once, through its Settler), then returns its JobRun
    (``run.decision.settlement``: the Settlement made, ``run.error``: what the job raised). The
    test helpers (django_cogworker/testing/) run every job so, through the same phases and hooks.

    The event loop's runner (engine/loop/runner.py) has one Processor too, never started: it awaits
    ``process_async(unit)`` in a task per job, the same phases with only the run's call awaited.
    """

    def __init__(self, index: int, *, ledger: Ledger, settlements: SettlementQueue, retry: RetryPolicy,
                 stats: Stats, server_chain: Callable[[Any, dict], Any], plans: Plans, handover: Fetcher | None = None,
                 on_death: Callable[[Processor], None] | None = None,
                 thread_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 stopping: threading.Event | None = None,
                 server_chain_async: Callable[[Any, dict], Awaitable[Any]] | None = None,
                 abandoned: Callable[[], bool] | None = None):
        self.index = index
        self.handover = handover
        self.ledger = ledger
        self.settlements = settlements
        self.retry = retry
        self.stats = stats
        self.server_chain = server_chain
        self.plans = plans
        self.on_death = on_death
        # What the thread runs in, from its first job to its end (the worker's: runtime.own_connection).
        self.thread_context = thread_context
        # Set once the worker stops (the Manager's): a job that can stop between two steps of its own
        # (an iterable job) reads it from its run (push/scope.py's Running.stopping). None: never set.
        self.stopping = stopping
        # The async form of the server chain, for ``process_async`` (push/middleware.py), and whether
        # the loop runner gave up on its jobs (the shutdown deadline: a cancel then settles nothing).
        self.server_chain_async = server_chain_async
        self.abandoned = abandoned
        self.name = f"cogworker-processor-{index}"
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.current: Unit | None = None

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        """Take and process units until handed None; on a bug of our own, log and tell ``on_death``."""
        handover = self.handover
        if handover is None:
            raise RuntimeError("a processor built without a handover is called (process), not started")
        try:
            with self.thread_context():
                self._loop(handover)
        except BaseException as exc:
            log_safely(logger.error, "processor %d died; replacing it", self.index, exc_info=exc)
            if self.on_death is not None:
                self.on_death(self)

    def _loop(self, handover: Fetcher) -> None:
        while True:
            unit = handover.next_unit()
            if unit is None:
                return
            self.current = unit
            taken = time.monotonic()
            try:
                self.process(unit)
            finally:
                self.current = None
                if self.thread.name != self.name:
                    self.thread.name = self.name  # (a job renamed it: logs and the workers hash use it)
                handover.processor_idle(time.monotonic() - taken)

    def process(self, unit: Unit) -> JobRun | None:
        """Run one unit through the phases: before, run (around), decide, settling, settle, after;
        return its JobRun (None for a payload that can't be read: buried in dead)."""
        opened = self._open(unit)
        if opened is None:
            return None
        plan, run = opened
        context = joblog.enter(run.jid, run.shown_class)  # (every record logged on this thread until leave)
        running = None
        try:
            try:
                decision = self._before(plan, run)
                if decision is None:
                    running = self._start(run)
                    self._run(plan, run)
                    decision = self._decide(plan, run)
            except BaseException as exc:  # noqa: BLE001 - a job's SystemExit is its failure, not ours
                # (Its phases run in this handler: django.tasks' receiver logs the traceback it sees.)
                self._failed(plan, run, exc)
            else:
                self._conclude(plan, run, decision)
        finally:
            if running is not None:
                _scope.running.reset(running)
            joblog.leave(context)
        return run

    async def process_async(self, unit: Unit, interrupt: Any = None, place: str | None = None) -> JobRun | None:
        """``process`` for a job on the event loop (engine/loop/runner.py): the same phases, its
        run awaited through the ``around_async`` hooks and the async server chain. ``interrupt``:
        how a timeout or a cancel stops it (interrupts.TaskInterrupt); ``place``: its name in the ledger.

        Cancelled from outside (the loop runner abandons it at the shutdown deadline, the job
        handed back to its queue), it settles nothing: the CancelledError goes on up."""
        opened = self._open(unit)
        if opened is None:
            return None
        plan, run = opened
        run.interrupt, run.place = interrupt, place
        context = joblog.enter(run.jid, run.shown_class)  # (this task's context: each task has its own)
        running = None
        try:
            try:
                decision = self._before(plan, run)
                if decision is None:
                    running = self._start(run)
                    await self._run_async(plan, run)
                    decision = self._decide(plan, run)
            except BaseException as exc:  # noqa: BLE001 - as in process; a CancelledError not of the abandon too
                self._unless_abandoned(exc)
                self._failed(plan, run, exc)
            else:
                self._unless_abandoned(None)
                self._conclude(plan, run, decision)
        finally:
            if running is not None:
                _scope.running.reset(running)
            joblog.leave(context)
        return run

    def _unless_abandoned(self, error: BaseException | None) -> None:
        """CancelledError if the loop abandoned this job as it ended: handed back, it settles nothing (one
        that swallowed its cancel, or got JobTimeout for it, was settled and requeued: it ran twice)."""
        if self.abandoned is not None and self.abandoned():
            raise asyncio.CancelledError("abandoned at the shutdown deadline: handed back") from error

    def _open(self, unit: Unit) -> tuple[Plan, JobRun] | None:
        """The unit's payload, plan and JobRun; None for a payload that can't be read (buried in dead)."""
        notes = unit.notes
        try:
            payload = (notes.pop(DECODED, None) if notes else None) or payloads.decode(unit.raw)
        except PayloadError as exc:
            try:
                self.bury(unit, exc)
            finally:
                self.ledger.unit_dropped(unit)
            return None
        # A class this worker doesn't know fails like a job that raised, and is retried: pushed by
        # code deployed before the workers restarted, it runs once they have. Nothing is imported
        # for it: only the classes discovered at startup ever run.
        plan = self.plans.plan(registered(payload["class"])).for_payload(payload)
        # (Escaped once for the log lines: a jid holding a newline wrote lines of its own making.)
        return plan, JobRun(unit, payload, plan.job_class, payloads.printable(payload.get("jid")),
                            payloads.printable(payload["class"]))

    def _start(self, run: JobRun) -> contextvars.Token:
        """Record the job as running; its scope current until ``process`` resets the token returned."""
        self.ledger.job_started(run.unit, run.payload, run.place)
        run.scope = _scope.Running(run.payload, self.stopping)
        return _scope.running.set(run.scope)

    def _failed(self, plan: Plan, run: JobRun, exc: BaseException) -> None:
        run.error = exc
        self._conclude(plan, run, self._decide(plan, run) if run.ran else self._unrun(run, exc))

    def _before(self, plan: Plan, run: JobRun) -> Decision | None:
        """The first ``before`` hook's Decision (the job doesn't run), or None; a hook that raises
        fails the job unrun (raised to ``process``, which files it)."""
        for hook in plan.before:
            decision = hook(run)
            if decision is not None:
                return decision
        return None

    def _run(self, plan: Plan, run: JobRun) -> None:
        """Run the job through the ``around`` hooks and the server middleware; its error raises."""
        run.started = time.monotonic()
        # (The job named once: not again where the handler's format shows it; joblog.Mention.)
        logger.info("start%s", joblog.Mention(run.jid, run.shown_class))
        payload = run.payload
        try:
            run.job = (plan.job_class or _unknown_job)(payload)
            run.value = plan.run_through(run, lambda: self.server_chain(run.job, payload))
        finally:
            run.elapsed = time.monotonic() - run.started

    async def _run_async(self, plan: Plan, run: JobRun) -> None:
        """``_run`` on the event loop: the job's own call in a task of its own, which its interrupt
        cancels (a cancel sent as it returns lands nowhere: that task is done)."""
        run.started = time.monotonic()
        logger.info("start%s", joblog.Mention(run.jid, run.shown_class))
        payload = run.payload
        chain = self.server_chain_async
        try:
            run.job = (plan.job_class or _unknown_job)(payload)
            interrupt = run.interrupt

            async def innermost() -> Any:
                if interrupt is None:
                    return await chain(run.job, payload)  # type: ignore[misc]
                return await interrupt.run(chain(run.job, payload))  # type: ignore[misc]

            run.value = await plan.run_through_async(run, innermost)
        finally:
            run.elapsed = time.monotonic() - run.started

    def _decide(self, plan: Plan, run: JobRun) -> Decision:
        """What becomes of a job that ran: a feature's claim on how it ended, else the core's.

        A ``decide`` hook that raises files the job as a failure naming it (FeatureError): raised
        to ``process``, it killed the processor and left the job to run again at every restart,
        never filed."""
        error = run.error
        for hook in plan.decide:
            try:
                decision = hook(run)
            except BaseException as exc:  # noqa: BLE001 - a feature's bug, even a SystemExit: the job is filed
                error = feature_error(hook, "decide", exc, run.error)
                break
            if decision is not None:
                return decision
        if error is None:
            logger.info("done%s elapsed=%.3fs", joblog.Mention(run.jid, run.shown_class), run.elapsed)
            return Decision(Outcome.SUCCESS, Settlement(ACK))
        decision = self._failure(run, error)
        log_safely(logger.warning, "fail%s elapsed=%.3fs: %s: %s (%s)", joblog.Mention(run.jid, run.shown_class),
                   run.elapsed, payloads.printable(payloads.error_class(error)),
                   payloads.printable(payloads.error_message(error), payloads.ERROR_MESSAGE_LIMIT),
                   payloads.printable(decision.fate, payloads.ERROR_MESSAGE_LIMIT), exc_info=trimmed(error))
        return decision

    def _unrun(self, run: JobRun, exc: BaseException) -> Decision:
        """A job a ``before`` hook failed (its limiter's key function raised; over its limit once
        more than OVER_LIMIT_MAX allows): filed as its failure, retry then dead."""
        decision = self._failure(run, exc)
        log_safely(logger.warning, "fail%s before its run: %s: %s (%s)", joblog.Mention(run.jid, run.shown_class),
                   payloads.error_class(exc), payloads.printable(payloads.error_message(exc)),
                   payloads.printable(decision.fate),
                   exc_info=trimmed(exc) if isinstance(exc, FeatureError) else None)  # (a feature's bug: its trace)
        return decision

    def _failure(self, run: JobRun, exc: BaseException) -> Decision:
        # (Its error_backtrace from the user's code in, without the worker's frames that led there.)
        filing = self.filing(run.unit, run.payload, exc, run.job, from_user_code(exc.__traceback__))
        outcome = Outcome.RETRY if filing is not None and filing.target == "retry" else Outcome.DEAD
        return Decision(outcome, Settlement(filing if filing is not None else ACK), exc, fate_of(filing), failure=True)

    def _conclude(self, plan: Plan, run: JobRun, decision: Decision) -> None:
        """Shape the settlement (``settling`` hooks), settle it once, count, and run the ``after`` hooks."""
        for shape in plan.settling:
            decision = _guarded(shape, run, decision)
        run.decision = decision
        try:
            self.settlements.put(run.unit.raw, decision.settlement)
            if decision.outcome is not Outcome.RESCHEDULED and (run.ran or decision.failure):
                self.stats.job_done(decision.failure, run.payload["class"] if plan.job_class else None,
                                    run.elapsed)
        finally:
            if run.ran:
                self.ledger.job_finished(run.unit, run.place)
            else:
                self.ledger.unit_dropped(run.unit)
            for after in plan.after:
                _guarded(after, run)

    def filing(self, unit: Unit, payload: dict, exc: BaseException, job: Any,
               traceback: TracebackType | None = None) -> Filing | None:
        """Where a failed job goes (None: discarded); never raises.

        The failure path must not fail in turn: a payload field it can't use
        (a negative ``retry_count``), a hook raising SystemExit, or a payload the
        job left unencodable (a datetime put in it, a NaN delay) used to kill the
        processor with the job unfiled, to run again or, with basic fetch, be
        lost. Such a job goes to dead with the reason. The filing is encoded here
        once, so a settlement can only fail for Redis, never forever.
        """
        try:
            filing = self.retry.filing(payload, exc, job, traceback)
            if filing is not None:
                filing.raw()
                if not math.isfinite(filing.score):
                    raise ValueError(f"its score is {filing.score!r}")
            return filing
        except BaseException as error:  # noqa: BLE001 - whatever it is, the job must be filed
            reason = f"its failure could not be filed ({payloads.error_class(error)}: {payloads.error_message(error)})"
            log_safely(logger.error, "jid=%s: %s; sent to dead", payloads.printable(payload.get("jid")),
                       payloads.printable(reason, payloads.ERROR_MESSAGE_LIMIT), exc_info=error)
            return dead_filing(unit.raw, reason, exc)

    def bury(self, unit: Unit, exc: PayloadError) -> None:
        """A payload we can't read: dead with the reason, never dropped."""
        reason = str(exc)
        try:
            payload = payloads.decode(unit.raw)
            payload["error_class"] = type(exc).__name__
            payload["error_message"] = reason
            payload.pop("dead", None)  # kept even with dead=False: nobody saw it run
            readable = True
        except PayloadError:
            payload = payloads.dead_letter(unit.raw, reason, time.time())
            readable = False
        try:
            filing = self.retry.exhausted(payload, exc, reason=reason)
            if filing is None:  # (a death handler set dead=False: kept all the same, nobody saw it run)
                raise ValueError("discarded by a death handler")
            filing.raw()  # (a death handler may have put what can't be encoded in it)
        except BaseException:  # noqa: BLE001 - it goes to dead whatever the handlers did
            filing = dead_filing(unit.raw, reason, exc)
        logger.error("dead on arrival (queue %r): %s", unit.queue,
                     payloads.printable(reason, payloads.ERROR_MESSAGE_LIMIT))
        self.settlements.put(unit.raw, Settlement(filing))
        if readable:  # (its unique and periodic locks go now, not at their TTL)
            run = JobRun(unit, payload, None, payloads.printable(payload.get("jid")),
                         payloads.printable(payload.get("class")))
            run.decision = Decision(Outcome.DEAD, Settlement(filing), exc, failure=True)
            for after in self.plans.plan(None).after:
                _guarded(after, run)


def _unknown_job(payload: dict) -> Any:
    """Stand in for a job class this worker has not registered: its run fails with UnknownJobError."""
    raise UnknownJobError(f"no job is registered as {payload['class']!r} in this worker (pushed by newer code "
                          f"than it runs, or not defined in an installed app's jobs.py)")


def _guarded(hook: Callable[..., Any], run: JobRun, *args: Any) -> Any:
    """Call a ``settling`` or ``after`` hook: one that raises is logged, and the job's settlement
    goes on as it was (a feature's bug never costs a job its settling)."""
    try:
        return hook(run, *args)
    except BaseException as exc:  # noqa: BLE001
        log_safely(logger.error, "%s failed for jid=%s; the job is settled all the same",
                   getattr(hook, "__qualname__", repr(hook)), run.jid, exc_info=exc)
        return args[0] if args else None
