"""Keep a thread's loop alive through Redis outages and bugs, and say so once.

Every engine thread body runs one step at a time under :class:`Watchdog`:
an outage (connection lost, or Redis refusing writes: a replica, OOM) is
logged once when it starts and once when it ends, with its length; meanwhile
the step is retried with a growing pause (no busy loop). Any other exception
is logged with its traceback and backed off the same way; the thread never
dies of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import is_connection_error, is_unavailable

logger = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


class Watchdog:
    def __init__(self, name: str, stop: threading.Event, clock: Callable[[], float] = time.monotonic,
                 backoff_max: float = BACKOFF_MAX):
        self.name = name
        self.stop = stop
        self.clock = clock
        self.backoff_max = backoff_max
        self.outage_since: float | None = None
        self.failures = 0

    def run_step(self, step: Callable[[], object]) -> bool:
        """Run ``step`` once; on failure log, pause and return False."""
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - the loop must survive anything
            self._failed(exc)
            return False
        self.succeeded()
        return True

    def succeeded(self) -> None:
        if self.outage_since is not None:
            logger.warning("%s: Redis is back after %.1fs", self.name, self.clock() - self.outage_since)
            self.outage_since = None
        self.failures = 0

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if is_unavailable(exc):
            # READONLY and OOM used to count as bugs: a traceback on every attempt of a failover.
            if self.outage_since is None:
                self.outage_since = self.clock()
                what = "lost the connection to Redis" if is_connection_error(exc) else "Redis refuses to serve"
                logger.error("%s: %s (%s: %s); retrying with backoff", self.name, what, type(exc).__name__, exc)
        else:
            logger.exception("%s failed (attempt %d); backing off", self.name, self.failures)
        self.stop.wait(self.pause())

    def pause(self) -> float:
        return min(BACKOFF_START * 2 ** min(self.failures - 1, 10), self.backoff_max)


class LoopThread:
    """A daemon thread that runs ``self._run`` until ``stop``: the heartbeat, the poller, the ticker.

    Subclasses call ``_init_thread(name)`` in their constructor and watch
    ``stop_event`` in ``_run``. ``stop`` may come before ``start`` (a TERM
    during startup): it then only sets the event.
    """

    stop_event: threading.Event
    _thread: threading.Thread

    def _init_thread(self, name: str) -> None:
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread.ident is not None:
            self._thread.join(5)
