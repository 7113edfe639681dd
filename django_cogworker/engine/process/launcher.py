"""The launcher: builds one worker process's parts from the config and runs them until told to stop.

Created by ``runcogworker`` (or a test) with a validated Config and a Redis
client. ``run`` blocks on the main thread: it installs the signal handlers,
waits for the first good heartbeat, starts the manager (processors and the
fetcher), the heartbeat and the poller, then handles signals until a stop:

* TERM / INT: stop fetching, wait up to SHUTDOWN_TIMEOUT for running jobs,
  hand back the unfinished to the head of their queues, return 0; a second
  one while stopping ends the wait: running jobs are handed back at once;
* TSTP: quiet (no new fetches; the process stays up);
* TTIN: log every thread's stack.

The same requests come from the admin as remote signals, read by the heartbeat.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any

from ...broker.keys import for_config
from ...broker.locks import active_ttl, touch_running
from ...broker.types import RedisClient
from ...conf import Config
from ...encryption.codec import perform_arguments
from ...encryption.keys import KeyRing, ring_for
from ...flow import upkeep
from ...push import scope
from ...push.client import Client
from ...push.job import call_perform, registry
from ...push.middleware import build_chain
from ..fetch.registry import make_fetch
from ..loops import run_each
from ..recovery.key_guard import KeyGuard
from ..recovery.orphans import OrphanRecovery
from ..run.cancels import Cancels
from ..run.extras import JobExtras
from ..run.results import ResultWriter
from ..run.run_locks import RunLocks
from ..run.timeouts import Timeouts
from ..schedule.periodic_ticker import Ticker
from ..schedule.poller import Poller
from ..settle.retry import RetryPolicy
from ..settle.stats import Stats
from .heartbeat import Heartbeat
from .manager import Manager

logger = logging.getLogger(__name__)

# Seconds between two reconciles of the in-progress list with this process's
# record; a job must be unknown at two of them to be requeued, so this bounds
# how long a fetch reply may be in flight.
RECONCILE_INTERVAL = 30.0


def new_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_job(job: Any, payload: dict, ring: KeyRing | None = None) -> Any:
    """The innermost step of the server chain: the job's own perform, with its arguments opened
    (``ring``: ENCRYPTION_KEYS) if they are sealed."""
    args, kwargs = perform_arguments(job, payload, ring)
    return call_perform(job, args, kwargs)


def job_runner(ring: KeyRing | None) -> Callable[[Any, dict], Any]:
    """``run_job`` with this process's keys (none: a sealed job fails KeyUnavailable, dead at once)."""
    if ring is None:
        return run_job
    return lambda job, payload: run_job(job, payload, ring)


class Launcher:
    """One worker process: builds its parts from the config, runs them, and stops them in order.

    Created by ``runcogworker`` (or a test) with a validated Config and a Redis
    client; builds the fetch, the Manager, the Heartbeat, the Poller, the
    Ticker, the RetryPolicy and the Stats, and wires them together. ``run``
    blocks on the main thread: the first good beat, then ``start`` of the
    manager, heartbeat, poller and ticker, then signals until a stop. Quiet
    (TSTP, or a remote signal) quiets the manager. A stop (``stop`` from
    another thread, TERM, INT) stops the ticker, the manager (with
    SHUTDOWN_TIMEOUT), the poller and the heartbeat, then flushes the stats
    and leaves the registries.
    """

    def __init__(self, config: Config, redis: RedisClient, *, server_middleware: Sequence[Callable] = (),
                 death_handlers: Sequence[Callable] = (), client_middleware: Sequence[Callable] = (),
                 periodic_entries: Sequence[Any] = (), clock: Callable[[], float] = time.time,
                 version: str = "0", identity: str | None = None, extra_info: Mapping[str, Any] | None = None,
                 stop_signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
                 processor_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 companions: Sequence[Any] = ()):
        self.config = config
        # (A worker under a supervisor stops on TERM only: a Ctrl-C reaches every process of the
        # terminal's group, and the supervisor forwards it as a TERM; counted twice, it would hurry.)
        self.stop_signals = tuple(stop_signals)
        self.redis = redis
        self.keys = for_config(config)
        self.identity = identity or new_identity()
        scope.identity = self.identity  # (a limiter's holder tokens name the process by it)
        # (runcogworker's system checks refuse to start with these: cogworker.E004, checks.py)
        for problem in upkeep.problems(config.heartbeat_interval, registry()):
            logger.error("%s", problem)
        self.stats = Stats(self.keys)
        self.retry = RetryPolicy(config, death_handlers)
        self.fetch = make_fetch(config, redis, self.keys, self.identity)
        self.run_locks = RunLocks(redis, self.keys)
        # A job past its timeout under a supervisor (--processes) that ignores it: this process
        # exits and is replaced; alone, it can only log it (see engine/run/timeouts.py).
        self.timeouts = Timeouts(grace=config.timeout_grace,
                                 replace_when_stuck=bool(extra_info and extra_info.get("supervisor")))
        self.manager = Manager(config, self.fetch, self.retry, self.stats,
                               build_chain(server_middleware, job_runner(
                                   ring_for(config.encryption_keys) if config.encryption_keys else None)),
                               run_hook=self.run_locks,
                               extras=JobExtras(ResultWriter(redis, self.keys, self.identity), self.timeouts),
                               cancels=Cancels(), processor_context=processor_context)
        self.heartbeat = Heartbeat(config, redis, self.keys, self.identity, self.manager, self.fetch, self.stats,
                                   on_signal=self._signals_put, version=version,
                                   extra_chores=(self._touch_periodic_locks, self._reconcile,
                                                 self.run_locks.retry_pending, self._limits),
                                   extra_info=extra_info, cancels=self.manager.cancels)
        self._suspects: collections.Counter[bytes] = collections.Counter()
        self._next_reconcile = time.monotonic() + RECONCILE_INTERVAL
        self.poller = Poller(config, redis, self.keys, self.retry,
                             KeyGuard(redis, self.keys, config.queue_names,
                                      periodic=[entry.pjid for entry in periodic_entries]),
                             OrphanRecovery(config, redis, self.keys, self.identity, self.retry,
                                            steady_since=self.heartbeat.steady_at),
                             process_count=lambda: self.heartbeat.process_count)
        # A retry this process files wakes its own poller when due (no message needed).
        self.retry.on_retry = self.poller.expect
        self.ticker = None
        if periodic_entries:
            client = Client(config, redis, middleware=client_middleware)
            self.ticker = Ticker(redis, self.keys, periodic_entries, lambda p: client.push(p, on_commit=False),
                                 ready=self.poller.first_orphan_check_done.is_set,
                                 catch_up=config.periodic_catch_up, catch_up_max=config.periodic_catch_up_max,
                                 tick_interval=config.periodic_tick_interval, clock=clock)
        # Threads the edge adds (the outbox relay), each with ``start`` and ``stop``: started once the
        # process is up, stopped first at shutdown.
        self.companions = tuple(companions)
        self._signals: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.stopped = threading.Event()

    def _limits(self, redis: RedisClient) -> None:
        """Renew the leases of the limiter places held here; index the limiter keys used (flow/upkeep.py)."""
        upkeep.beat(redis, self.keys)

    def _touch_periodic_locks(self, redis: RedisClient) -> None:
        touch_running(redis, self.keys, self.manager.running_jobs(), active_ttl(self.config.orphan_threshold))

    def _reconcile(self, redis: RedisClient) -> None:
        """Every RECONCILE_INTERVAL: requeue jobs the fetch holds for us that we never received."""
        if time.monotonic() < self._next_reconcile:
            return
        self._next_reconcile = time.monotonic() + RECONCILE_INTERVAL
        self._suspects = self.fetch.reconcile(self.manager.known_raws(), self._suspects)

    def _signals_put(self, name: str) -> None:
        self._signals.put(name)

    def install_signal_handlers(self) -> None:
        for ignored in {signal.SIGTERM, signal.SIGINT} - set(self.stop_signals):
            signal.signal(ignored, signal.SIG_IGN)
        handled: list[tuple[int, str]] = [(s, "stop") for s in self.stop_signals]
        for signum, name in (*handled, (signal.SIGTSTP, "quiet"), (signal.SIGTTIN, "dump")):
            signal.signal(signum, self._queue_signal(name))

    def _queue_signal(self, name: str) -> Callable[[int, FrameType | None], None]:
        """A signal handler that queues ``name`` for the main thread's loop (all a handler should do).

        A stop while stopping can't wait in the queue: the main thread is in ``_shutdown``, waiting
        for running jobs. It tells the manager to hand them back now (a flag, safe to set here);
        waiting the whole SHUTDOWN_TIMEOUT after a second Ctrl-C left only ``kill -9``.
        """
        def handler(_signum: int, _frame: FrameType | None) -> None:
            if name == "stop" and self._shutting_down:
                self.manager.hurry()
            self._signals.put(name)
        return handler

    def run(self, install_signals: bool = True) -> int:
        """Run until stopped (main thread); return the exit code."""
        if install_signals:
            self.install_signal_handlers()
        give_up = threading.Event()
        waiter = threading.Thread(target=self._stop_while_starting, args=(give_up,), daemon=True)
        waiter.start()
        if not self.heartbeat.beat_until_ok(give_up):
            logger.info("stopped before the first heartbeat")
            return 0
        give_up.set()
        waiter.join()
        if self._pending_stop:
            return self._shutdown()
        self.timeouts.start()
        # Said before the processors start: after them, a job waiting at startup had its "start"
        # line logged before the worker said it was ready.
        logger.info("cogworker %s ready: %d processor(s), %s fetch, queues %s", self.identity,
                    self.config.concurrency, self.config.fetch, ",".join(self.config.queue_names))
        self.manager.start()
        self.heartbeat.start()
        self.poller.start()
        if self.ticker is not None:
            self.ticker.start()
        for companion in self.companions:
            companion.start()
        while True:
            name = self._signals.get()
            if name == "stop":
                return self._shutdown()
            if name == "quiet":
                self.manager.make_quiet()
            elif name == "dump":
                dump_threads()

    _pending_stop = False
    _shutting_down = False

    def _stop_while_starting(self, give_up: threading.Event) -> None:
        """Let TERM interrupt a startup still waiting for Redis."""
        while not give_up.is_set():
            try:
                name = self._signals.get(timeout=0.2)
            except queue.Empty:
                continue
            if name == "stop":
                self._pending_stop = True
                give_up.set()
                return
            self._signals.put(name)
            time.sleep(0.2)

    def _shutdown(self) -> int:
        self._shutting_down = True
        logger.info("shutting down: waiting up to %.1fs for running jobs (a second %s hands them back now)",
                    self.config.shutdown_timeout, " or ".join(signal.Signals(s).name[3:] for s in self.stop_signals))
        if self.ticker is not None:
            self.ticker.stop()
        for companion in self.companions:
            companion.stop()
        self.manager.stop(self.config.shutdown_timeout)
        self.timeouts.stop()
        self.poller.stop()
        self.heartbeat.stop()
        run_each((("stats", lambda: self.stats.flush(self.redis)),
                  ("lock releases kept through an outage", lambda: self.run_locks.retry_pending(self.redis)),
                  ("in-progress registry", self._forget),
                  ("process registry", self.heartbeat.clear)),
                 "at shutdown, %s not written", log=logger, raise_outage=False, traceback=False)
        self.stopped.set()
        logger.info("stopped")
        return 0

    def _forget(self) -> None:
        if not self.fetch.forget_if_empty():
            logger.warning("jobs left on %s: orphan recovery will requeue them once %ss have passed",
                           self.fetch.in_progress, self.config.orphan_threshold)

    def stop(self) -> None:
        """Ask a running launcher to stop (from another thread, e.g. a test)."""
        self._signals.put("stop")


def dump_threads() -> None:
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        lines.append(f"Thread {thread.name} (daemon={thread.daemon}):")
        if frame is not None:
            lines.extend(line.rstrip() for line in traceback.format_stack(frame))
    logger.warning("thread dump:\n%s", "\n".join(lines))
