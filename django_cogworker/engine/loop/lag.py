"""The event loop's lag, watched from a thread of its own: a job that blocks the loop is named.

A job on the loop that makes a blocking call (``time.sleep``, ``requests.get``, the sync ORM through
a library that doesn't refuse it) holds every job on the loop until it returns. The loop can't say
so itself while it is held: a callback on the loop stamps the time every TICK, and the
``cogworker-loop-lag`` thread reads the stamp. Past ``limit`` seconds old, it logs (once) the job
whose task runs on the loop at that moment, with its jid and class, and, once the loop runs again,
how long it was held.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from ...push import payload as payloads

logger = logging.getLogger(__name__)

TICK = 0.05  # seconds between two stamps of the loop
LIMIT = 0.25  # seconds the loop may go without a stamp before the job holding it is logged


class LoopLag:
    """Created by the LoopRunner with its loop and ``holder`` (the (jid, class) of the job whose task
    runs now). ``begin`` (on the loop's thread) starts the stamps; ``start`` the watching thread;
    ``stop`` ends it. ``check(now)`` is one look, for the thread and for tests."""

    def __init__(self, loop: asyncio.AbstractEventLoop, holder: Callable[[], tuple[str, str] | None],
                 limit: float = LIMIT, clock: Callable[[], float] = time.monotonic):
        self.loop = loop
        self.holder = holder
        self.limit = limit
        self.clock = clock
        self.stamp = clock()
        self.worst = 0.0  # the longest the loop was held, seconds (for a reader: tests, the bench)
        self._held_by: tuple[str, str] | None = None
        self._since = 0.0
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="cogworker-loop-lag", daemon=True)

    def begin(self) -> None:
        self.stamp = self.clock()
        self.loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.stamp = self.clock()
        self.loop.call_later(TICK, self._tick)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(TICK):
            try:
                self.check(self.clock())
            except Exception:  # (the watch must outlive a bug of its own)
                logger.exception("loop lag check failed; continuing")

    def check(self, now: float) -> None:
        """Log a job holding the loop past the limit, once, and the end of the hold."""
        lag = now - self.stamp
        if lag > self.limit + TICK:
            if self._held_by is None:
                held = self.holder() or ("-", "(no job: the worker's own code)")
                self._held_by, self._since = held, self.stamp
                logger.warning("the event loop is blocked (%.2fs so far) by jid=%s class=%s: a blocking call in "
                               "async code holds every job on the loop (await it, or wrap it in "
                               "asgiref's sync_to_async)", lag, payloads.printable(held[0]),
                               payloads.printable(held[1]))
            self.worst = max(self.worst, lag)
        elif self._held_by is not None:
            jid, shown = self._held_by
            held_for = self.stamp - self._since
            self.worst = max(self.worst, held_for)
            logger.warning("the event loop runs again after %.2fs blocked by jid=%s class=%s", held_for, jid, shown)
            self._held_by = None
