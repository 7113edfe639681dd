"""Keep a thread's loop alive through Redis outages and bugs, and say so once.

Every thread body (the fetcher, the heartbeat, the poller, the periodic
ticker) runs one step at a time under :class:`Watchdog`: an outage
(connection lost, or Redis refusing writes: a replica, OOM) is logged once
when it starts and once when it ends, with its length; meanwhile the step is
retried with a growing pause (no busy loop). Any other exception is logged
with its traceback and backed off the same way; the thread never dies of it.

Outside ``engine/`` because the periodic ticker runs under it too, and the
engine imports the periodic package: a base here keeps the two from
importing each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import redis as redis_lib

from ..broker.types import RedisClient
from ..errors import is_connection_error, is_unavailable

logger = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 5.0

Step = tuple[str, Callable[[], object]]


class Watchdog:
    """Run a loop's steps, logging and backing off what fails; one per loop thread.

    Created by the thread body it guards, or by its owner, and only run there:
    ``run_step`` for each step, ``succeeded`` when a step that does its own
    error handling got through; other threads may read ``failing``. It keeps no thread of its own; a ``stop`` event
    set during its pause ends the pause at once.
    """

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

    @property
    def failing(self) -> bool:
        """Whether the last step failed (read from other threads: one int)."""
        return self.failures > 0

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
    ``stop_event`` in ``_run``. ``start`` starts the thread (once). ``stop`` may
    come before ``start`` (a TERM during startup): it then only sets the event;
    otherwise it sets it and waits up to 5 s for the thread to end.
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


def run_each(steps: Iterable[Step], failed: str, *, log: logging.Logger = logger, raise_outage: bool = True,
             traceback: bool = True) -> None:
    """Run every ``(name, step)``, each on its own: one that fails never skips the ones after it.

    A step that fails is logged as ``failed % name`` (with its traceback, or
    with ``: <class>: <message>`` appended when ``traceback`` is False) and the
    next one runs. An outage (``is_unavailable``: Redis away, or refusing
    writes) is re-raised at once when ``raise_outage``: every step after it
    would fail the same way, and the caller's watchdog logs it once and backs
    the whole off. A step failing on every round (a bug, a value that can't be
    read) used to stop the rest: one unreadable stamp in ``last_beat`` kept
    every process of the fleet from moving due scheduled and retry jobs.
    """
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - logged; the other steps still run
            if raise_outage and is_unavailable(exc):
                raise
            if traceback:
                log.exception(failed, name)
            else:
                log.error(failed + ": %s: %s", name, type(exc).__name__, exc)


def redis_time(redis: RedisClient) -> float:
    """Redis's clock (epoch seconds), so the hosts' clock skew doesn't matter to what is compared
    across processes (last beats, orphan verdicts).

    Falls back to this host's clock where TIME isn't allowed (some proxies and managed services,
    an ACL): better a skewed stamp than none. A lost connection is raised, not hidden.
    """
    try:
        seconds, micros = redis.time()
        return float(seconds + micros / 1e6)
    except redis_lib.exceptions.ResponseError:
        return time.time()
