"""A processor thread: take a fetched job, run it through the server middleware, settle it.

Settling: success acks; failure files in retry or dead atomically with the
ack. A settle that fails (Redis away) is kept by the Settler as a pending
settlement and retried by the heartbeat: the job already ran, so it is never
put back to run again by that path.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ... import joblog
from ...batches.steps import step_for
from ...errors import Cancelled, LimitError, OverLimit, PayloadError, UnknownJobError
from ...push import payload as payloads
from ...push import scope as _scope
from ...push.job import registered
from ..fetch.contract import Unit
from ..settle.retry import Filing
from .gate import DROPPED, FREE
from .results import encode_return

if TYPE_CHECKING:
    from ..fetch.fetcher import Fetcher
    from ..fetch.ledger import Ledger
    from ..settle.retry import RetryPolicy
    from ..settle.settling import AckBatch, Settler
    from ..settle.stats import Stats
    from .extras import JobExtras
    from .gate import Gate

logger = logging.getLogger(__name__)


class Processor:
    """Runs one job at a time on its own thread, and settles it.

    Created by the Manager, ``concurrency`` of them, each handed what it works
    with: the fetcher's hand-over (``next_unit``, ``processor_idle``), the
    ledger (what runs), the ack batch and the settler (settling), the retry
    policy (where a failure goes), the stats, the server middleware chain and
    the Launcher's run hook (unique and periodic locks). ``start`` runs
    ``run`` on the ``cogworker-processor-<index>`` daemon thread, which loops
    until it is handed ``None`` (the Manager's stop); quiet doesn't concern it
    (no more jobs come). A processor that dies of a bug tells ``on_death``
    (the Manager replaces it); the job it held stays on the in-progress list
    (reliable fetch) for reconciliation or orphan recovery.
    """

    def __init__(self, index: int, *, handover: Fetcher, ledger: Ledger, acks: AckBatch, settler: Settler,
                 retry: RetryPolicy, stats: Stats, server_chain: Callable[[Any, dict], Any],
                 run_hook: Callable[[dict, str], Any] | None, on_death: Callable[[Processor], None],
                 extras: JobExtras | None = None, gate: Gate | None = None,
                 thread_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext):
        self.index = index
        self.handover = handover
        self.ledger = ledger
        self.acks = acks
        self.settler = settler
        self.retry = retry
        self.stats = stats
        self.server_chain = server_chain
        # Called with (payload, moment) when a job starts and when its run ends ("success",
        # "retry", "dead"): the launcher releases unique and periodic locks with it.
        self.run_hook = run_hook
        self.on_death = on_death
        # Result records and timeouts, for the job classes that want them (engine/run/extras.py).
        self.extras = extras
        # Expiry, cancellation and limits, before a job runs (engine/run/gate.py).
        self.gate = gate
        # What the thread runs in, from its first job to its end (the worker's: runtime.own_connection).
        self.thread_context = thread_context
        self.name = f"cogworker-processor-{index}"
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.current: Unit | None = None

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        """Take and process units until handed None; on a bug of our own, log and tell ``on_death``."""
        handover = self.handover
        try:
            with self.thread_context():
                self._loop(handover)
        except BaseException as exc:
            log_safely(logger.error, "processor %d died; replacing it", self.index, exc_info=exc)
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

    def process(self, unit: Unit) -> None:
        """Run one unit: decode, record, run through the chain, settle, count, release its locks."""
        ledger = self.ledger
        try:
            payload = payloads.decode(unit.raw)
        except PayloadError as exc:
            try:
                self.bury(unit, exc)
            finally:
                ledger.unit_dropped(unit)
            return
        # A class this worker doesn't know fails like a job that raised, and is retried: pushed by
        # code deployed before the workers restarted, it runs once they have (it went straight to
        # dead). Nothing is imported for it: only the classes discovered at startup ever run.
        known = registered(payload["class"])
        job_class: Callable[[dict], Any] = known or _unknown_job
        # Per-class counts only for classes this worker runs: an unknown name is anyone's to push,
        # and each would be a hash field (and a metrics series) of its own.
        counted = payload["class"] if known is not None else None
        gate = self.gate
        ticket: Any = FREE
        if gate is not None:
            try:
                entered = gate.enter(unit.raw, payload, known)
            except (LimitError, OverLimit) as exc:
                entered = self.fail_unrun(unit, payload, exc, counted)
            if isinstance(entered, str):  # (dropped, rescheduled or failed: it doesn't run)
                ledger.unit_dropped(unit)
                if entered == DROPPED:
                    self._hook(payload, "dead")
                return
            ticket = entered
        ledger.job_started(unit, payload)
        started = time.monotonic()
        # (Escaped once for the log lines: a jid holding a newline wrote lines of its own making.)
        jid, shown_class = payloads.printable(payload.get("jid")), payloads.printable(payload["class"])
        context = joblog.enter(jid, shown_class)  # (every record logged on this thread until leave)
        logger.info("start jid=%s class=%s", jid, shown_class)
        self._hook(payload, "start")
        outcome = "success"
        job = None
        # (Two class attributes: all a job without a result or a timeout pays; engine/run/extras.py.)
        extras = self.extras if known is not None and (known.result_ttl is not None or known.timeout is not None) \
            else None
        value = None
        bid = payload.get("bid")  # (a job of a batch: its batch step settles first, batches/steps.py)
        run = _scope.Running(payload)
        running = _scope.running.set(run)
        if gate is not None and (known is None or known.cancellable):  # (else no request reaches it)
            gate.cancels.started(jid, run)
        try:
            job = job_class(payload)
            if extras is None:
                value = self.server_chain(job, payload)
            else:
                value = extras.run(job, payload, self.server_chain)
            if gate is not None:  # (in the try: an interrupt sent as the job returned lands here, handled)
                gate.cancels.finished(jid)
            if bid is not None and payload.get("keep_result"):
                # (Read by the next step of a chain; a value JSON can't hold fails the job.)
                value = value if known is not None and known.result_ttl is not None else encode_return(value)
        except BaseException as exc:  # noqa: BLE001 - a job's SystemExit is its failure, not ours
            outcome = "retry"  # (until filed: a failure never releases locks as a success would)
            elapsed = time.monotonic() - started
            if gate is not None:
                gate.cancels.finished(jid)  # (first: an interrupt sent late must not land below)
                if run.cancelled or isinstance(exc, Cancelled):
                    outcome = "dead"
                    gate.cancelled_run(unit.raw, payload, known, job, exc, elapsed)
                    self.stats.job_done(False, counted, elapsed)
                    return
                if isinstance(exc, OverLimit) and gate.reschedule(unit.raw, payload, exc, counted=False):
                    outcome = "retry"  # (its locks stay, as for a retry)
                    if extras is not None:
                        extras.failed(job_class, payload, exc, Filing("schedule", 0.0, payload), job)
                    return
            filing = self.filing(unit, payload, exc, job)
            outcome = "retry" if filing is not None and filing.target == "retry" else "dead"
            if extras is not None:
                extras.failed(job_class, payload, exc, filing, job)
            log_safely(logger.warning, "fail jid=%s class=%s elapsed=%.3fs: %s: %s (%s)", jid, shown_class,
                       elapsed, payloads.printable(payloads.error_class(exc)),
                       payloads.printable(payloads.error_message(exc), payloads.ERROR_MESSAGE_LIMIT),
                       payloads.printable(_fate(filing), payloads.ERROR_MESSAGE_LIMIT), exc_info=exc)
            if bid is not None:
                died = filing is not None and filing.target == "dead"
                self.settler.settle(unit.raw, step_for(payload, "dead" if died else "failure",
                                                       filing if filing is not None else "ack", exc=exc))
            elif filing is not None:
                self.settler.settle(unit.raw, filing)
            else:
                self.acks.add(unit.raw)  # discarded (dead=False)
            self.stats.job_done(True, counted, elapsed)
        else:
            elapsed = time.monotonic() - started
            if gate is not None:
                if run.cancelled:  # (it stopped when asked, or ran on: either way not a success)
                    outcome = "dead"
                    gate.cancelled_run(unit.raw, payload, known, job, Cancelled("cancelled while it ran"), elapsed)
                    self.stats.job_done(False, counted, elapsed)
                    return
            logger.info("done jid=%s class=%s elapsed=%.3fs", jid, shown_class, elapsed)
            if extras is not None:
                extras.succeeded(job_class, payload, value)
            if bid is not None:
                step = step_for(payload, "success", "ack", result=value if payload.get("keep_result") else None)
                if step.record:
                    self.settler.settle(unit.raw, step)  # (its result is written before its step, alone)
                else:
                    self.acks.add(unit.raw, step)  # (its step runs with the others held, before its ack)
            else:
                self.acks.add(unit.raw)
            self.stats.job_done(False, counted, elapsed)
        finally:
            ticket.release()
            _scope.running.reset(running)
            ledger.job_finished(unit)
            self._hook(payload, outcome)
            joblog.leave(context)

    def fail_unrun(self, unit: Unit, payload: dict, exc: BaseException, counted: str | None) -> str:
        """File a job that can't be let run (its limiter's key function failed, or it was over a
        limit once more than OVER_LIMIT_MAX allows) as a failure; return where it went."""
        filing = self.filing(unit, payload, exc, None)
        fate = "retry" if filing is not None and filing.target == "retry" else "dead"
        log_safely(logger.warning, "fail jid=%s class=%s before its run: %s: %s (%s)",
                   payloads.printable(payload.get("jid")), payloads.printable(payload["class"]),
                   payloads.error_class(exc), payloads.printable(payloads.error_message(exc)),
                   payloads.printable(_fate(filing)))
        if isinstance(payload.get("bid"), str):
            self.settler.settle(unit.raw, step_for(payload, "dead" if fate == "dead" else "failure",
                                                   filing if filing is not None else "ack", exc=exc))
        elif filing is not None:
            self.settler.settle(unit.raw, filing)
        else:
            self.acks.add(unit.raw)
        self.stats.job_done(True, counted, 0.0)
        self._hook(payload, fate)
        return fate

    def filing(self, unit: Unit, payload: dict, exc: BaseException, job: Any) -> Filing | None:
        """Where a failed job goes (None: discarded); never raises.

        The failure path must not fail in turn: a payload field it can't use
        (a negative ``retry_count``), a hook raising SystemExit, or a payload the
        job left unencodable (a datetime put in it, a NaN delay) used to kill the
        processor with the job unfiled, to run again or, with basic fetch, be
        lost. Such a job goes to dead with the reason. The filing is encoded here
        once, so a settlement can only fail for Redis, never forever.
        """
        try:
            filing = self.retry.filing(payload, exc, job)
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

    def _hook(self, payload: dict, moment: str) -> None:
        """Tell the launcher's hook (unique and periodic locks): "start", "success", "retry" or "dead"."""
        hook = self.run_hook
        if hook is not None:
            try:
                hook(payload, moment)
            except BaseException as exc:  # noqa: BLE001 - the job is settled; the locks expire
                log_safely(logger.error, "run hook (%s) failed for jid=%s", moment,
                           payloads.printable(payload.get("jid")), exc_info=exc)

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
        self.settler.settle(unit.raw, filing)
        if readable:
            self._hook(payload, "dead")  # its unique and periodic locks go now, not at their TTL


def _unknown_job(payload: dict) -> Any:
    """Stand in for a job class this worker has not registered: its run fails with UnknownJobError."""
    raise UnknownJobError(f"no job is registered as {payload['class']!r} in this worker (pushed by newer code "
                          f"than it runs, or not defined in an installed app's jobs.py)")


def _fate(filing: Filing | None) -> str:
    """Where a failed job went, for its log line: "retry 1 in 17s", "dead: retries exhausted"."""
    if filing is None:
        return "discarded: dead=False"
    if filing.target == "retry":
        return f"retry {filing.payload.get('retry_count', 0) + 1} in {max(filing.score - time.time(), 0):.0f}s"
    return f"dead: {filing.payload.get('dead_reason', '')}"


def dead_filing(raw: bytes, reason: str, exc: BaseException | None) -> Filing:
    """A dead entry for a job whose own filing failed: its payload as pushed (not as the job left
    it), with the error and the reason; kept as it came if it can't be written back (1e309 in its
    args reads as inf), the raw bytes in a dead letter if it can't even be read."""
    now = time.time()
    try:
        payload = payloads.decode(raw)
        payload.update(error_class=payloads.error_class(exc) if exc is not None else "CogworkerError",
                       error_message=payloads.error_message(exc) if exc is not None else reason,
                       failed_at=now, dead_reason=payloads.safe_string(reason, payloads.ERROR_MESSAGE_LIMIT))
        filing = Filing("dead", now, payload)
        try:
            filing.raw()
        except ValueError:  # (a number JSON can't hold)
            filing = filing.as_stored(raw)
        return filing
    except BaseException:  # noqa: BLE001 - unreadable: keep the bytes
        return Filing("dead", now, payloads.dead_letter(raw, reason, now))


def log_safely(log: Callable[..., None], message: str, *args: Any, exc_info: BaseException | None = None) -> None:
    """Log, never raise: an exception whose traceback can't be formatted (a ``__notes__`` that
    raises, say) made the logging call itself raise and killed the processor mid-filing.

    An exception with a message longer than ERROR_MESSAGE_LIMIT (a job's 10 MB message was
    logged whole with its traceback, on every attempt) is shown cut there, like in its payload:
    its stack and its message, without ``exc_info``.
    """
    try:
        if exc_info is not None and not _fits_a_log(exc_info):
            message, args, exc_info = message + "\n%s", (*args, _short_traceback(exc_info)), None
        log(message, *args, exc_info=exc_info)
    except BaseException:  # noqa: BLE001
        try:
            log(message + " (traceback not shown: it could not be formatted)", *args)
        except BaseException:  # noqa: BLE001
            pass


def _fits_a_log(exc: BaseException) -> bool:
    """Whether every message of ``exc`` and of the exceptions chained to it is at most ERROR_MESSAGE_LIMIT long."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 100:
        seen.add(id(current))
        try:
            if len(str(current)) > payloads.ERROR_MESSAGE_LIMIT:
                return False
        except BaseException:  # noqa: BLE001 - a __str__ that raises is shown by the traceback as such
            pass
        current = current.__cause__ or current.__context__
    return True


def _short_traceback(exc: BaseException) -> str:
    """The stack of ``exc`` and its message cut at ERROR_MESSAGE_LIMIT (chained exceptions left out)."""
    import traceback

    try:
        stack = "".join(traceback.format_tb(exc.__traceback__))
    except BaseException:  # noqa: BLE001
        stack = ""
    message = payloads.error_message(exc)
    return (f"Traceback (most recent call last):\n{stack}{payloads.error_class(exc)}: {message}\n"
            f"(messages cut at {payloads.ERROR_MESSAGE_LIMIT} characters; chained exceptions not shown)")
