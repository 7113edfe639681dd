"""The run of an iterable job: its enumerator walked item by item, between two items the reasons to
stop asked, the cursor saved on the way and at the end.

Between two items, in this order, a run stops (never in the middle of one):

* ``stopped``: the worker is stopping (its TERM, a rolling restart: ``Running.stopping``);
* ``max_runtime``: it has iterated ``max_iteration_runtime`` seconds;
* ``cancelled``: ``self.cancelled`` (``Job.cancel``): ``on_cancel``, and the cancellation feature
  ends it (dead, never retried; its saved state deleted);
* ``throttled``: a ``throttle_on`` condition holds, or a limiter refuses a place for the next item;
* ``completed``: the enumerator is exhausted: ``on_complete``.

The first three and a throttle save the cursor of the last item done and end the run; the hook
(hook.py) sends the job back to the schedule (due now; after the backoff for a throttle). An item
that raises has the cursor of the last item *done* saved, then fails the job as any failure
(retry, then dead); the run that retries it resumes there. While it runs, the cursor is saved every
``iteration_checkpoint`` seconds (and every ``checkpoint_every`` items): what a kill -9 costs is the
items since the last save, done again.

A timeout (``timeout``) bounds one item: it is armed anew before each (``Running.extras["timeout"]``,
set by the results feature, which arms it).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...bounds import short_repr
from ...push import payload as payloads
from ...push import scope as _scope
from .errors import IterationError
from .state import Saved, State, encode_cursor
from .throttle import Throttles, release

logger = logging.getLogger(__name__)

NAME = "iteration"  # its place in a run's ``Running.extras`` and ``JobRun.notes``
INTERRUPTED = ("stopped", "max_runtime", "throttled")  # the ends that send the job back to the schedule


@dataclass(eq=False)
class Run:
    """One run of an iterable job, as the hook made it, and how it ended (for the hook's ``decide``).

    ``state``: its saved state (None: nothing saved, a run no worker made: a job's perform called
    by hand, the test helpers). ``extras``: the run's ``Running.extras`` (the progress tracker, the
    timeout's re-arm)."""

    state: State | None
    interval: float = math.inf
    every: int | None = None
    max_runtime: float | None = None
    stopping: threading.Event | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    end: str = ""
    backoff: float = 0.0
    items: int = 0  # items done in this run
    longest: float = 0.0


def iterate(job: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Run | None) -> None:
    """Run ``job`` (an IterableJob) from its saved cursor to an end (see the module's header)."""
    cls = type(job)
    if cls._iteration_problem:
        raise IterationError(cls._iteration_problem)
    run = run if run is not None else Run(None)
    state = run.state
    saved = state.begin() if state is not None else Saved()
    job.cursor = saved.cursor
    job.executions = saved.executions + 1
    if saved.executions == 0:
        job.on_start()
    else:
        job.on_resume()
    enumerator = job.build_enumerator(*args, cursor=job.cursor, **kwargs)
    if enumerator is None:
        raise IterationError(f"{cls.name}.build_enumerator returned None: it must return an iterable of "
                             f"(item, cursor) pairs (self.list_enumerator(...), ...)")
    tracker, total = _tracker(job, enumerator)
    # The report rides each checkpoint; with none (nothing saved) or checkpoints further apart than
    # the tracker's own interval, it is also written on its own, once an interval at the most.
    own_writes = tracker is not None and (state is None or run.interval > tracker.interval)
    # (A run nothing is saved for, the test helpers', goes to its end: it has no schedule to wait in.)
    throttles = Throttles(cls.throttle_on, job, args, kwargs) if cls.throttle_on and state is not None else None
    rearm: Callable[[], None] | None = run.extras.get("timeout")
    items = iter(enumerator)
    each = job.each_iteration
    stopping, max_runtime, cancellable = run.stopping, run.max_runtime, cls.cancellable
    interval, every = run.interval, run.every
    done, cursor, checked = saved.done, saved.cursor, False
    started = last_save = time.monotonic()
    since = 0
    # Cancelled: the run's flag (set by the heartbeat's chore) at each item, ``Job.cancelled`` (which
    # asks Redis itself, at most once a second) once a second: a call per item cost more than the loop.
    scope = _scope.running.get()
    scope = scope if scope is not None and scope.payload is job.payload else None
    ask_at = 0.0
    try:
        while True:
            if rearm is not None:  # (the timeout bounds one iteration: its throttle asks and fetch too)
                rearm()
            if stopping is not None and stopping.is_set():
                run.end = "stopped"
                break
            now = time.monotonic()
            # (After an item at least: a run that stopped before any would come back for ever.)
            if max_runtime is not None and run.items and now - started >= max_runtime:
                run.end = "max_runtime"
                break
            if cancellable:
                if now >= ask_at:
                    ask_at = now + 1.0
                    cancelled = job.cancelled
                else:
                    cancelled = scope is not None and scope.cancelled
                if cancelled:
                    run.end = "cancelled"
                    break
            if throttles is not None and throttles.conditions:
                backoff = throttles.held()
                if backoff is not None:
                    run.end, run.backoff = "throttled", backoff
                    break
            try:
                pair = next(items)
            except StopIteration:
                run.end = "completed"
                break
            if type(pair) is not tuple and not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise IterationError(f"{cls.name}: its enumerator yielded {short_repr(pair)}, not an (item, cursor) "
                                     f"pair")
            item, after = pair
            if not checked:  # (the first: a cursor JSON can't hold fails at once, not at the first save)
                encode_cursor(after, cls.name)
                checked = True
            places = None
            if throttles is not None and throttles.limiters:
                places, backoff = throttles.places()
                if backoff is not None:
                    run.end, run.backoff = "throttled", backoff
                    break
            began = time.monotonic()
            try:
                each(item, *args, **kwargs)
            finally:
                if places:
                    release(places)
            now = time.monotonic()
            if now - began > run.longest:
                run.longest = now - began
            cursor = job.cursor = after
            done += 1
            since += 1
            run.items += 1
            if tracker is not None:
                tracker.update(done, total)
            if state is not None and (now - last_save >= interval or (every is not None and since >= every)):
                state.save(cursor, done, saved.runtime + now - started, tracker, run.longest)
                last_save, since = now, 0
            elif own_writes:  # (checkpoints further apart than its interval: the bar still moves)
                tracker.flush()
    except BaseException:
        run.end = "failed"
        if state is not None and run.items:
            _save_quietly(state, cursor, done, saved.runtime + time.monotonic() - started, tracker, run, failed=True)
        raise
    if state is not None:
        # (Completed too: a process killed before its ack has the job run again from the end, not the start.)
        _save_quietly(state, cursor, done, saved.runtime + time.monotonic() - started, tracker, run)
    job.on_stop()
    if run.end == "completed":
        job.on_complete()
    elif run.end == "cancelled":
        job.on_cancel()


def _save_quietly(state: State, cursor: Any, done: int, runtime: float, tracker: Any, run: Run,
                  failed: bool = False) -> None:
    """Save at a run's end: a save Redis refuses is logged (the job resumes from the save before).
    A cursor JSON can't hold raises, unless the run ``failed`` already (its own error is the one told)."""
    try:
        state.save(cursor, done, runtime, tracker, run.longest)
    except IterationError:
        if not failed:
            raise
        logger.warning("jid=%s: its cursor can't be saved: %s", payloads.printable(state.jid),
                       payloads.printable(sys.exc_info()[1]))
    except Exception as exc:
        logger.warning("jid=%s: its cursor could not be saved at its %s (%s: %s); it resumes from its last "
                       "checkpoint", payloads.printable(state.jid), run.end, type(exc).__name__,
                       payloads.printable(exc))


def _tracker(job: Any, enumerator: Any) -> tuple[Any, int | None]:
    """The run's progress tracker and the enumerator's length, when it knows it (else no report)."""
    if not hasattr(enumerator, "__len__"):
        return None, None
    total = len(enumerator)
    if total <= 0:
        return None, None
    try:
        from ..progress.api import current
    except ImportError:  # (the progress feature not there: no report)
        return None, total
    return current(job.payload), total
