"""The launcher: builds one worker process's parts from the config and runs them until told to stop.

Created by ``runcogworker`` (or a test) with a validated Config and a Redis
client. ``run`` blocks on the main thread: it installs the signal handlers,
waits for the first good heartbeat, starts the manager (processors and the
fetcher), the heartbeat and the poller, then handles signals until a stop:

* TERM / INT: stop fetching, wait up to SHUTDOWN_TIMEOUT for running jobs,
  hand back the unfinished to the head of their queues, return 0; a second
  one while stopping ends the wait: running jobs are handed back at once;
* TSTP: quiet (no new fetches; the process stays up);
* TTIN: log every thread's stack;
* HUP (a lone process; USR1 from the supervisor under ``--processes``): retire for a rolling
  restart: quiet, wait for running jobs as long as they take (or ROLLING_TIMEOUT), hand back
  the rest, exit with REPLACE_EXIT (engine/process/caps.py) for the process manager to start
  a fresh one. A TERM meanwhile makes it a stop: SHUTDOWN_TIMEOUT from then.

Over MAX_MEMORY_MB or MAX_JOBS_PER_PROCESS (caps.py), it stops as at TERM and exits with
REPLACE_EXIT too, the cap's figures logged and counted (``stat:replaced``). Over MAX_MEMORY_MB
already as its processors are about to start, it refuses to run: ConfigError, naming both figures.

The same requests come from the admin as remote signals, read by the heartbeat.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
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
from typing import Any, NoReturn

from ...broker.keys import for_config
from ...broker.locks import active_ttl, touch_running
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import ConfigError
from ...push import scope
from ...push.client import Client
from ...push.job import call_perform
from ...push.middleware import build_async_chain, build_chain
from ..fetch.registry import make_fetch
from ..loop.runner import run_job_async
from ..loops import run_each
from ..recovery.key_guard import KeyGuard
from ..recovery.orphans import OrphanRecovery
from ..run.factories import FeatureFactory, build_features, load_features, requeue_hook, stop_features
from ..run.hooks import WorkerParts
from ..schedule.periodic_ticker import Ticker
from ..schedule.poller import Poller
from ..settle.retry import RetryPolicy
from ..settle.stats import Stats
from .caps import REPLACE_EXIT, Caps, Over
from .health import Health, HealthServer, beat_verdict, worker_verdict
from .heartbeat import Heartbeat, rss_kb
from .manager import Manager
from .report import Reporter

logger = logging.getLogger(__name__)

# Seconds between two reconciles of the in-progress list with this process's
# record; a job must be unknown at two of them to be requeued, so this bounds
# how long a fetch reply may be in flight.
RECONCILE_INTERVAL = 30.0


def new_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_job(job: Any, payload: dict) -> Any:
    """The innermost step of the server chain: the job's own perform, with the payload's arguments,
    or the clear ones a feature opened for this run (``job.arguments``: an encrypted job's)."""
    opened = job.arguments
    if opened is not None:
        return call_perform(job, *opened)
    return call_perform(job, payload.get("args", ()), payload.get("kwargs", {}))


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
                 companions: Sequence[Any] = (), features: Sequence[FeatureFactory] | None = None,
                 retire_signal: int | None = signal.SIGHUP, reporter: Reporter | None = None,
                 health: HealthServer | None = None):
        self.config = config
        self.retire_signal = retire_signal
        self.reporter = reporter  # (a supervised process's pipe to its supervisor: report.py)
        self.health = health
        # (built without caps too: its count of jobs started is a replaced process's figure)
        self.caps = Caps(config.max_memory_mb, config.max_jobs_per_process, self._over_cap,
                         on_first_job=reporter.worked if reporter is not None else None)
        self._over: Over | None = None
        # (A worker under a supervisor stops on TERM only: a Ctrl-C reaches every process of the
        # terminal's group, and the supervisor forwards it as a TERM; counted twice, it would hurry.)
        self.stop_signals = tuple(stop_signals)
        self.redis = redis
        self.keys = for_config(config)
        self.identity = identity or new_identity()
        scope.identity = self.identity  # (a limiter's holder tokens name the process by it)
        self.stats = Stats(self.keys)
        self.retry = RetryPolicy(config, death_handlers)
        self.fetch = make_fetch(config, redis, self.keys, self.identity)
        # The features the job's path runs through, each made once for this process with the parts it
        # may use: by default the package's own, then COGWORKER["FEATURES"] (loaded by name, as
        # middleware is: the engine imports no feature). Each makes the services it needs; the worker
        # drives them (chores, housekeeping, start, stop, requeued) without naming any.
        if features is None:
            features = load_features(config)
        self.features = build_features(features, WorkerParts(config, redis, self.keys, self.identity, self.retry,
                                                             bool(extra_info and extra_info.get("supervisor"))))
        chain_async, lacking = build_async_chain(server_middleware, run_job_async)
        if lacking and config.async_concurrency:
            logger.warning("server middleware %s has no acall: async jobs run on the processor threads, not the "
                           "event loop (push/middleware.py)", lacking)
        self.manager = Manager(config, self.fetch, self.retry, self.stats,
                               build_chain(server_middleware, run_job), run_hook=requeue_hook(self.features),
                               features=self.features, processor_context=processor_context,
                               on_job_start=self.caps.job_started, server_chain_async=chain_async)
        self.heartbeat = Heartbeat(config, redis, self.keys, self.identity, self.manager, self.fetch, self.stats,
                                   on_signal=self._signals_put, version=version,
                                   extra_chores=(self._touch_periodic_locks, self._reconcile),
                                   features=self.features, extra_info=extra_info, on_beat=self._beaten)
        self._suspects: collections.Counter[bytes] = collections.Counter()
        self._next_reconcile = time.monotonic() + RECONCILE_INTERVAL
        self.poller = Poller(config, redis, self.keys, self.retry,
                             KeyGuard(redis, self.keys, config.queue_names,
                                      periodic=[entry.pjid for entry in periodic_entries]),
                             OrphanRecovery(config, redis, self.keys, self.identity, self.retry,
                                            steady_since=self.heartbeat.steady_at),
                             process_count=lambda: self.heartbeat.process_count,
                             housekeeping=tuple(step for f in self.features for step in f.housekeeping()))
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

    def _beaten(self) -> None:
        """After each good heartbeat (on its thread): tell the supervisor, and look at the RSS."""
        if self.reporter is not None:
            self.reporter.beat()
            if self._running:  # (whether it can fetch: a fetcher failing while the beats go through)
                self.reporter.able(not self._failing())
        self.caps.check()

    def _over_cap(self, over: Over) -> None:
        """A cap passed (a processor's or the heartbeat's thread): take nothing new, and stop."""
        self._over = over
        self.manager.make_quiet()
        self._signals.put("replace")

    def _failing(self) -> tuple[str, ...]:
        """Which of this process's Redis round trips failed last: its beat's, its fetcher's."""
        return (*(("heartbeat",) if self.heartbeat.failing else ()),
                *(("fetcher",) if self.manager.fetch_failing else ()))

    def health_state(self) -> Health:
        """What /healthz and /readyz answer (the health server's thread)."""
        alive, age = beat_verdict(self.heartbeat.last_ok, self._born, time.monotonic(),
                                  self.config.heartbeat_interval)
        state = ("stopping" if self._shutting_down else "quiet" if self.manager.quiet
                 else "running" if self._running else "starting")
        return worker_verdict(state, alive, self._failing(), {"last_beat_age": round(age, 3),
                                                              "identity": self.identity})

    def install_signal_handlers(self) -> None:
        for ignored in {signal.SIGTERM, signal.SIGINT} - set(self.stop_signals):
            signal.signal(ignored, signal.SIG_IGN)
        handled: list[tuple[int, str]] = [(s, "stop") for s in self.stop_signals]
        if self.retire_signal is not None:
            handled.append((self.retire_signal, "retire"))
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
                if self._draining_long:  # (retired: a TERM makes it a stop, SHUTDOWN_TIMEOUT from now)
                    self._draining_long = False
                    self.manager.shorten(self.config.shutdown_timeout)
                else:
                    self.manager.hurry()
            self._signals.put(name)
        return handler

    def run(self, install_signals: bool = True) -> int:
        """Run until stopped (main thread); return the exit code."""
        if install_signals:
            self.install_signal_handlers()
        self._born = time.monotonic()
        if self.health is not None:
            self.health.state = self.health_state
            self.health.start()
        give_up = threading.Event()
        waiter = threading.Thread(target=self._stop_while_starting, args=(give_up,), daemon=True)
        waiter.start()
        if not self.heartbeat.beat_until_ok(give_up):
            logger.info("stopped before the first heartbeat")
            if self.health is not None:
                self.health.stop()
            return 0
        give_up.set()
        waiter.join()
        if self._pending_stop:
            return self._shutdown()
        refusal = self.caps.refusal()  # (up, and nothing fetched yet: caps.py)
        if refusal is not None:
            self._refuse(refusal)
        for feature in self.features:  # (a feature's own thread: the timeout watcher)
            feature.start()
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
        self._running = True
        if self.reporter is not None:
            self.reporter.ready()
        while True:
            try:  # (woken each second: a signal handed to another thread doesn't interrupt the wait)
                name = self._signals.get(timeout=1.0)
            except queue.Empty:
                continue
            if name == "stop":
                return self._shutdown()
            if name == "replace":
                assert self._over is not None
                logger.warning("%s", self._over.describe(self.config.max_memory_mb, self.config.max_jobs_per_process))
                return self._shutdown(replaced=self._over.reason)
            if name == "retire":
                return self._retire()
            if name == "quiet":
                self.manager.make_quiet()
                if self.reporter is not None:
                    self.reporter.quiet()
            elif name == "dump":
                dump_threads()

    _pending_stop = False
    _shutting_down = False
    _draining_long = False
    _running = False
    _born = 0.0

    def _retire(self) -> int:
        timeout = self.config.rolling_timeout
        logger.info("retiring (rolling restart): taking nothing new, %s, then exiting (code %d) to be replaced "
                    "(a TERM makes it a stop)", "waiting for running jobs as long as they take" if timeout is None
                    else f"waiting up to {timeout:.1f}s (ROLLING_TIMEOUT) for running jobs", REPLACE_EXIT)
        self._draining_long = timeout is None or timeout > self.config.shutdown_timeout
        return self._shutdown(math.inf if timeout is None else timeout, replaced="rolling")

    def _refuse(self, why: str) -> NoReturn:
        """Leave as at a stop, having taken nothing, and raise ConfigError: this process can't run here.

        A supervisor hears why on the report pipe and stops (caps.after_exit); a lone worker's
        command exits with REFUSE_EXIT, naming the setting and the figures.
        """
        if self.reporter is not None:
            self.reporter.refuse(why)
        self._shutdown(refused=True)
        raise ConfigError([why])

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

    def _shutdown(self, timeout: float | None = None, replaced: str | None = None, refused: bool = False) -> int:
        """Stop in order, waiting up to ``timeout`` (SHUTDOWN_TIMEOUT) for running jobs; return the exit code.

        ``replaced``: why this process exits to be replaced ("memory", "jobs", "rolling"), counted
        in ``stat:replaced``; it then exits with REPLACE_EXIT.
        """
        self._shutting_down = True
        if self.reporter is not None:
            self.reporter.quiet()
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        if replaced is None and not refused:
            logger.info("shutting down: waiting up to %.1fs for running jobs (a second %s hands them back now)",
                        timeout, " or ".join(signal.Signals(s).name[3:] for s in self.stop_signals))
        # The fetch stops first: a companion's stop waits for its thread (the outbox relay's round,
        # on a database that may not answer), and the fetch went on taking jobs meanwhile, a TERM
        # reaching it 30 s late.
        self.manager.make_quiet()
        if self.ticker is not None:
            self.ticker.stop()
        for companion in self.companions:
            companion.stop()
        self.manager.stop(timeout)
        stop_features(self.features)  # (their threads, and what they kept through an outage: lock releases)
        self.poller.stop()
        self.heartbeat.stop()
        run_each((("stats", lambda: self.stats.flush(self.redis)),
                  ("in-progress registry", self._forget),
                  ("process registry", self.heartbeat.clear),
                  *((("replacement count", lambda: self.redis.hincrby(self.keys.stat_replaced, replaced, 1)),)
                    if replaced else ())),
                 "at shutdown, %s not written", log=logger, raise_outage=False, traceback=False)
        if self.health is not None:
            self.health.stop()
        self.stopped.set()
        if replaced:
            logger.info("stopped: exiting with code %d to be replaced (%s; %d job(s) started, RSS %.1f MB)",
                        REPLACE_EXIT, replaced, self.caps.jobs, rss_kb() / 1024)
            return REPLACE_EXIT
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
        lines.append(f"Thread {thread.name} (daemon={thread.daemon}):")
        if (frame := frames.get(thread.ident or -1)) is not None:
            lines.extend(line.rstrip() for line in traceback.format_stack(frame))
    logger.warning("thread dump:\n%s", "\n".join(lines))
