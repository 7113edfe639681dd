"""The event loop of a worker process: the jobs whose ``perform`` is ``async def``, many at once.

One asyncio loop per process, on its own thread (``cogworker-loop``), runs up to ASYNC_CONCURRENCY
jobs at once, each in a task of its own, beside the CONCURRENCY processor threads that run sync
jobs. Both are fed by the same fetch (the fetcher asks for jobs for free threads and free places
on the loop; engine/fetch/routing.py sends each where it runs), and a job on the loop goes through
the same phases as one on a thread: the loop's :class:`~.processor.Processor` (never started)
awaits ``process_async``, which differs from ``process`` only in the call (the ``around_async``
hooks and the async server chain): the same before/decide/settling/settle/after, the same
settlement queue, ledger and stats, the job's log lines naming its jid (each task has its own
context). Reliable fetch keeps a job on the loop on the in-progress list like any other: a kill -9
recovers it as an orphan.

What blocks the loop blocks every job on it: the loop's lag is watched (lag.py), and a job
that holds it is logged with its jid and class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..fetch.contract import Unit, shown
from ..run.interrupts import TaskInterrupt
from ..run.processor import Processor
from .lag import LIMIT as LAG_LIMIT
from .lag import LoopLag

logger = logging.getLogger(__name__)

# Seconds the cancelled tasks of jobs handed back at the shutdown deadline get to run their own
# cleanup (their ``finally`` and ``except CancelledError``) before the loop stops.
ABANDON_GRACE = 1.0


async def run_job_async(job: Any, payload: dict) -> Any:
    """The innermost step of the async server chain: the job's own ``perform``, awaited, with the
    payload's arguments or the clear ones a feature opened (an encrypted job's)."""
    opened = job.arguments
    if opened is not None:
        args, kwargs = opened
    else:
        args, kwargs = payload.get("args", ()), payload.get("kwargs", {})
    return await job.perform(*args, **kwargs)


class LoopRunner:
    """Runs async jobs on an event loop of its own thread, up to ``capacity`` at once.

    Created by the Manager when ASYNC_CONCURRENCY > 0, with its Processor and the fetcher's
    ``admit`` (a job taken before a stall starts only if still ours) and ``freed`` (a place free:
    the Router's). ``start`` starts the ``cogworker-loop`` thread and the lag watch. The fetcher
    thread hands jobs over with ``submit``. At stop the Manager calls ``wait`` (up to the shutdown
    deadline), then ``abandon``: what still runs is cancelled, settles nothing, and is returned
    for the Manager to hand back with the threads' unfinished jobs; the loop then stops.
    """

    def __init__(self, capacity: int, processor: Processor, *, admit: Callable[[Unit], bool] = lambda unit: True,
                 freed: Callable[[], None] = lambda: None,
                 thread_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 lag_limit: float | None = None):
        self.capacity = capacity
        self.processor = processor
        processor.abandoned = self.abandoned
        self.admit = admit
        self.freed = freed
        self.thread_context = thread_context
        self.loop = asyncio.new_event_loop()
        self._places = list(range(capacity - 1, -1, -1))  # free place numbers, the lowest taken first
        # A job's task -> (its unit, the interrupt whose ``task`` runs its call); read by the lag watch.
        self._tasks: dict[asyncio.Task, tuple[Unit, TaskInterrupt]] = {}
        # Handed over by the fetcher, their tasks not made yet (a loop held by a blocking job makes
        # them late): abandon hands them back too, or basic fetch lost them at the deadline.
        self._submitted: list[Unit] = []
        self._submitted_lock = threading.Lock()
        self._abandoned = False
        self.lag = LoopLag(self.loop, self.holder, LAG_LIMIT if lag_limit is None else lag_limit)
        self.thread = threading.Thread(target=self._run, name="cogworker-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.lag.start()

    @property
    def alive(self) -> bool:
        """Whether the loop's thread runs (the Router sends no job to a loop whose thread died)."""
        return self.thread.is_alive()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            with self.thread_context():
                self.lag.begin()
                self.loop.run_forever()
        except BaseException:  # (a bug of ours: the jobs it held stay on the in-progress list)
            logger.exception("the event loop's thread died; its jobs are recovered with the process's")
        finally:
            self.lag.stop()

    def abandoned(self) -> bool:
        return self._abandoned

    @property
    def running(self) -> int:
        return len(self._tasks)

    # -- the hand-over: called by the fetcher thread --------------------------------------------

    def submit(self, units: list[Unit]) -> None:
        """Start ``units`` on the loop (one wake-up of it for the lot), each in a free place."""
        with self._submitted_lock:
            self._submitted.extend(units)
        self.loop.call_soon_threadsafe(self._begin, units)

    def _begin(self, units: list[Unit]) -> None:
        with self._submitted_lock:
            if self._abandoned:  # (handed back by abandon already: never begun)
                return
            for unit in units:
                self._submitted.remove(unit)
        for unit in units:
            place = self._places.pop()  # (the fetcher never hands more than are free)
            interrupt = TaskInterrupt(self.loop)
            task = self.loop.create_task(self._one(unit, place, interrupt))
            self._tasks[task] = (unit, interrupt)
            # (A task cancelled before its first step never runs _one's finally: abandon waited its
            # whole grace for it.)
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        self._tasks.pop(task, None)

    async def _one(self, unit: Unit, place: int, interrupt: TaskInterrupt) -> None:
        try:
            if self.admit(unit):
                await self.processor.process_async(unit, interrupt, f"cogworker-loop-{place}")
        except asyncio.CancelledError:
            if not self._abandoned:
                raise
        except BaseException:  # (process_async settles every job: this is a bug of ours)
            logger.exception("a job's task on the event loop failed outside its path (a bug); it stays on the "
                             "in-progress list")
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.pop(task, None)
            self._places.append(place)
            if not self._abandoned:
                self.freed()

    def holder(self) -> tuple[str, str] | None:
        """(jid, class) of the job whose task runs on the loop now (None: none does); any thread."""
        task = asyncio.current_task(self.loop)
        if task is None:
            return None
        for outer, (unit, interrupt) in list(self._tasks.items()):
            if task is outer or task is interrupt.task:  # (its own call runs in a task of its own)
                return shown(unit)
        return None

    # -- stop: called by the Manager on the main thread ------------------------------------------

    def wait(self, until: Callable[[], float], hurry: Callable[[], bool]) -> None:
        """Wait for the jobs on the loop to end, until ``until()`` (monotonic) or ``hurry()``."""
        while self._tasks and not hurry():
            left = until() - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def abandon(self) -> list[Unit]:
        """Give up on what still runs: return its units (for the Manager to hand back), cancel its
        tasks without settling them (ABANDON_GRACE for their own cleanup), and stop the loop."""
        with self._submitted_lock:
            self._abandoned = True
            units = [*self._submitted, *(unit for unit, _interrupt in list(self._tasks.values()))]
        if self.thread.is_alive():
            for task in list(self._tasks):
                self.loop.call_soon_threadsafe(task.cancel)
            deadline = time.monotonic() + ABANDON_GRACE
            while self._tasks and time.monotonic() < deadline:
                time.sleep(0.01)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(1.0)
        self.lag.stop()
        return units

