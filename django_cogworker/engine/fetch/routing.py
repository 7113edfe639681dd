"""Which pool a fetched job runs in: a processor thread, or a place on the event loop.

A process with ASYNC_CONCURRENCY > 0 runs two pools from one fetch: its CONCURRENCY processor
threads and its event loop's places (engine/loop/runner.py). The fetcher asks for as many jobs
as both have free, and the :class:`Router` sends each where its plan says (``Plan.on_loop``: an
``async def perform`` whose features and middleware all have an async form), read from the payload
alone: the class it names, and the fields that choose the plan.

A fetch can't ask Redis for "a sync job": what comes is what heads the queues. So a fetch asks for
as many jobs as both pools can take at the mix of jobs fetched lately (``share``, the average part
of async jobs): with T idle threads, P free places and a share s, at most (T + SLACK) / (1 - s) and
(P + SLACK) / s (:meth:`Router.count`). A process whose jobs are all sync (s at its floor) never
fetches for its loop while its threads are busy, nor one whose jobs are all async for its threads
while its loop is full; a mix asks for each pool's part. A job that still comes for
a pool with no place free (a sync job fetched when only loop places were free, or an async one
when only threads were) is **handed back at once to the head of its queue**, before any feature
saw it and before it was recorded as handed over: never a job taken ahead and not started. Then
the pool whose free places brought it is not offered again until the other pool frees a place
(``blocked``): otherwise the next fetch would take the same job back at once, and again. So a
queue whose head is a sync job while every thread is busy waits for a thread, even with loop
places free: the order of a queue is kept over the use of both pools (docs/jobs.md, "Async jobs").
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Protocol

from ...push import payload as payloads
from ...push.job import registered, registry
from ..run.hooks import Plans, is_coroutine_class
from .contract import Unit

logger = logging.getLogger(__name__)

THREAD, LOOP = "thread", "loop"
# The share of async jobs: its bounds (never quite sure a kind is gone), the weight of each job
# fetched in its average, and the room a fetch may overrun by in expectation (under 1 - SHARE_MIN:
# a full pool whose kind is all a process sees is never probed).
SHARE_MIN = 0.02
SHARE_WEIGHT = 0.05
SLACK = 0.9
# How long a pool stays blocked at most when the other frees no place (see Router).
BLOCK_MAX = 1.0


class Loop(Protocol):
    """What the fetcher hands jobs for the event loop to (engine/loop/runner.py's LoopRunner)."""

    capacity: int

    @property
    def alive(self) -> bool: ...

    def submit(self, units: list[Unit]) -> None: ...


class Router:
    """The loop's free places, for the fetcher, and where each fetched job goes.

    Created by the Manager with the loop runner and the process's Plans; used by the fetcher thread
    (``take``, ``split``, ``give``); ``loop_freed`` is called on the loop's thread as a job's task
    ends, ``thread_freed`` on a processor's as it goes idle. ``blocked`` lapses BLOCK_MAX seconds
    after it was set: a pool that freed its place between the fetch and ``split`` setting the block
    (no lock spans both threads' steps) would otherwise leave it set with nothing left to clear it,
    and a process whose jobs are mostly async, its threads all idle, never fetched again. A lapse
    costs at most a fetch that hands its job back again, once a BLOCK_MAX.
    """

    def __init__(self, loop: Loop, plans: Plans, wake: Callable[[], None]):
        self.loop = loop
        self.plans = plans
        self.wake = wake
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(loop.capacity):
            self._free.put(None)
        self._blocked: str | None = None  # the pool not offered until the other frees a place
        self._blocked_at = 0.0
        # No async class registered: the loop is never offered, nothing decoded to route.
        self._any_async = any(is_coroutine_class(cls) for cls in registry().values())
        self.share = SHARE_MIN if self._any_async else 0.0  # (most jobs of a Django project are sync)

    @property
    def blocked(self) -> str | None:
        """The pool not offered now: until the other frees a place, or BLOCK_MAX seconds at most."""
        if self._blocked is not None and time.monotonic() - self._blocked_at > BLOCK_MAX:
            self._blocked = None
        return self._blocked

    @blocked.setter
    def blocked(self, pool: str | None) -> None:
        self._blocked, self._blocked_at = pool, time.monotonic()

    # -- the loop's places ---------------------------------------------------------------------

    def places(self) -> int:
        """The loop's free places a fetch may count now (none while it is blocked, or its thread is dead)."""
        return 0 if self.blocked == LOOP or not self.loop.alive else self._free.qsize()

    def count(self, threads: int, places: int) -> int:
        """How many jobs to fetch for ``threads`` idle threads and ``places`` free places, at the mix
        of jobs fetched lately (see the module's header)."""
        share = self.share
        fits = (threads + SLACK) / (1 - share)
        if share:
            fits = min(fits, (places + SLACK) / share)
        return min(threads + places, int(fits))

    def take(self) -> int:
        """Take every free place of the loop (none while it is blocked, or dead); return how many."""
        if self.blocked == LOOP or not self.loop.alive:
            return 0
        n = 0
        while True:
            try:
                self._free.get_nowait()
            except queue.Empty:
                return n
            n += 1

    def give(self, n: int) -> None:
        for _ in range(n):
            self._free.put(None)

    def loop_freed(self) -> None:
        """A job's task on the loop ended: its place is free (threads offered again if blocked)."""
        # (The fetcher waits for a wake only with no place free: woken when the first frees, not
        # once per job, which handed it the GIL for nothing at every job's end.)
        first = self._free.qsize() == 0
        self._free.put(None)
        if self.blocked == THREAD:
            self.blocked = None
            first = True
        if first:
            self.wake()

    def thread_freed(self) -> None:
        if self.blocked == LOOP:
            self.blocked = None

    # -- where each job goes -------------------------------------------------------------------

    def on_loop(self, unit: Unit) -> bool:
        """Whether ``unit`` runs on the loop (a payload that can't be read: on a thread, which buries it;
        with the loop's thread dead, a bug of ours, every job: on the threads, through async_to_sync)."""
        if not self._any_async or not self.loop.alive:
            return False
        try:
            payload = payloads.decode(unit.raw)
            return self.plans.plan(registered(payload["class"])).for_payload(payload).on_loop
        except Exception:  # (unreadable, no class: the processor's path files it)
            return False

    def split(self, units: list[Unit], threads: int, places: int) -> tuple[list[Unit], list[Unit], list[Unit]]:
        """``units`` as (for the threads, for the loop, to hand back), at most ``threads`` and
        ``places`` of the first two; a job handed back blocks the pool that brought it."""
        to_threads: list[Unit] = []
        to_loop: list[Unit] = []
        back: list[Unit] = []
        share = self.share
        for unit in units:
            on_loop = self.on_loop(unit)
            if self._any_async:
                share = min(max(share + ((1.0 if on_loop else 0.0) - share) * SHARE_WEIGHT, SHARE_MIN), 1 - SHARE_MIN)
            if on_loop:
                if len(to_loop) < places:
                    to_loop.append(unit)
                    continue
                if self._free.qsize() == 0:  # (a place freed meanwhile: its next fetch takes it)
                    self.blocked = THREAD
            else:
                if len(to_threads) < threads:
                    to_threads.append(unit)
                    continue
                self.blocked = LOOP
            back.append(unit)
        self.share = share
        if back:
            logger.debug("%d job(s) fetched for a pool they don't run in: handed back to the head of their "
                         "queue; %s places not offered until the other pool frees one", len(back), self.blocked)
        return to_threads, to_loop, back
