"""The manager: wires this process's processors, fetcher, ledger and settling, and owns their lifecycle.

Each part has a module of its own: ``fetch/fetcher.py`` (the thread that fetches
and hands jobs over), ``run/processor.py`` (the threads that run them),
``fetch/ledger.py`` (the in-memory record of what runs), ``settle/queue.py`` (the
settlements on their way, riding the fetches) and ``settle/settling.py`` (what is
applied alone, what is pending, the hand-off at shutdown). The manager
builds them, starts them, quiets and stops them, and answers for them to the
heartbeat and the launcher.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...conf import Config
from ..fetch.contract import Fetch
from ..fetch.fetcher import Fetcher
from ..fetch.ledger import Ledger
from ..fetch.routing import Router
from ..loop.runner import LoopRunner
from ..run.factories import step_runners
from ..run.hooks import Feature, FetchHooks, Plans
from ..run.processor import Processor
from ..settle.queue import SettlementQueue
from ..settle.retry import RetryPolicy
from ..settle.settlement import Settlement
from ..settle.settling import Settler
from ..settle.stats import Stats

logger = logging.getLogger(__name__)


class Manager:
    """Runs ``concurrency`` processors and the event loop's runner fed by one fetcher, and keeps the
    record of what they hold.

    Created by the Launcher with the config, the fetch, the retry policy, the
    stats, the server middleware chain and the run hook (unique and periodic
    locks). Runs no thread of its own: ``start`` (main thread) starts the
    processors, then the fetcher. ``make_quiet`` (main thread, on TSTP or a
    remote signal) stops fetching; the processors finish what they hold.
    ``stop(timeout)`` (main thread) quiets, waits for the fetcher's last call,
    waits up to ``timeout`` for running jobs, on the threads and on the loop (``hurry``, from
    a second stop signal, ends the wait), then settles what finished and hands back the rest
    (``requeue_unfinished``): the loop's unfinished jobs have their tasks cancelled first.

    The record (the ledger, and the Settler's pending settlements) lives in
    memory on purpose: it is trusted over anything in Redis, which may be what
    is failing, or may have lost its last writes in a failover.
    """

    def __init__(self, config: Config, fetch: Fetch, retry: RetryPolicy, stats: Stats,
                 server_chain: Callable[[Any, dict], Any], run_hook: Callable[[dict, str], Any] | None = None,
                 features: Sequence[Feature] = (),
                 processor_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 on_job_start: Callable[[], None] | None = None,
                 server_chain_async: Callable[[Any, dict], Any] | None = None):
        self.config = config
        self.fetch = fetch
        self.retry = retry
        self.stats = stats
        self.server_chain = server_chain
        self.run_hook = run_hook
        # The hooks each job class uses, built once per class (engine/run/hooks.py).
        # (No async server chain, a middleware without ``acall``: every job runs on a thread.)
        self.plans = Plans(features, async_chain=server_chain_async is not None)
        self.server_chain_async = server_chain_async
        self.processor_context = processor_context
        self._quiet = threading.Event()
        # Set as ``stop`` begins (a TERM, a rolling restart's retirement, a cap reached), read by the
        # running jobs through their processor: an iterable job stops at its next item and goes back
        # to its queue with its cursor, within SHUTDOWN_TIMEOUT (features/iteration/).
        self.stopping = threading.Event()
        self._stopping = False
        self._hurry = False  # (a plain flag: set from a signal handler, read by stop's wait)
        self._cut_at = math.inf  # (likewise: ``shorten``'s deadline, read by stop's wait)
        self.ledger = Ledger(on_start=on_job_start)
        self.settler = Settler(fetch, retry, run_hook,
                               runners=step_runners(features))
        self.settlements = SettlementQueue(self.settler, cap=config.concurrency)
        self.fetch_hooks = FetchHooks(features)
        self.fetcher = Fetcher(config, fetch, self.ledger, self.settlements, self._quiet, self.fetch_hooks)
        self.processors = [self._new_processor(i) for i in range(config.concurrency)]
        # The event loop for the jobs whose perform is async def (engine/loop/runner.py), fed by the
        # same fetcher through its Router; none with ASYNC_CONCURRENCY 0 (they run on the threads).
        self.loop: LoopRunner | None = None
        if config.async_concurrency and server_chain_async is not None:
            self.loop = LoopRunner(config.async_concurrency, self._new_processor(-1), admit=self.fetcher.admit,
                                   thread_context=processor_context)
            self.fetcher.router = Router(self.loop, self.plans, wake=lambda: self.fetcher.wake())
            self.loop.freed = self.fetcher.router.loop_freed

    def _new_processor(self, index: int) -> Processor:
        return Processor(index, handover=self.fetcher, ledger=self.ledger, settlements=self.settlements,
                         retry=self.retry, stats=self.stats, server_chain=self.server_chain, plans=self.plans,
                         on_death=self.processor_died, thread_context=self.processor_context,
                         stopping=self.stopping, server_chain_async=self.server_chain_async)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        for p in self.processors:
            p.start()
        if self.loop is not None:
            self.loop.start()
        self.fetcher.start()

    @property
    def quiet(self) -> bool:
        return self._quiet.is_set()

    def make_quiet(self) -> None:
        if not self._quiet.is_set():
            logger.info("quiet: no new jobs will be fetched")
        self._quiet.set()

    def stop(self, timeout: float) -> int:
        """Quiet, wait up to ``timeout`` s for running jobs, hand back the rest; return how many."""
        deadline = time.monotonic() + timeout
        self.stopping.set()
        self.make_quiet()
        self.fetcher.join()  # (not bounded by the deadline: see Fetcher.join)
        self._stopping = True
        self.settlements.close()  # a fetcher that outlived its join holds no more settlements
        unstarted = self.fetcher.drain()
        self.fetcher.release(len(self.processors))
        for p in self.processors:
            if p.thread.ident is not None:
                self._join(p.thread, deadline)
        if self.loop is not None:
            self.loop.wait(lambda: min(deadline, self._cut_at), lambda: self._hurry)
        if self._hurry:
            logger.warning("stop signal repeated: handing running jobs back now")
        unstarted += self.fetcher.drain()  # (handed over by a fetcher that outlived its join)
        self.fetch_hooks.returned(unstarted)  # (what a feature took for them at the fetch, given back)
        self.ledger.forget_unstarted(unstarted)
        # In the order they were fetched: the running ones first (basic fetch requeues in this order).
        unfinished = [p.current for p in self.processors if p.thread.is_alive() and p.current]
        if self.loop is not None:  # (its tasks cancelled, settling nothing: handed back with the rest)
            unfinished += self.loop.abandon()
        unfinished += unstarted
        if unfinished:
            logger.warning("%d job(s) still running or unstarted at the shutdown deadline", len(unfinished))
        return self.settler.requeue_unfinished(unfinished)

    def hurry(self) -> None:
        """Cut ``stop``'s wait for running jobs short: they are handed back at once (a second TERM/INT).

        Safe to call from a signal handler: it only sets a flag, which ``stop`` reads at least
        every 0.1 s.
        """
        self._hurry = True

    def shorten(self, timeout: float) -> None:
        """Have ``stop``'s wait end within ``timeout`` s from now, if it would end later.

        A TERM to a process retired by a rolling restart (which waits as long as its jobs take):
        it then stops as at TERM. Safe from a signal handler (one float written).
        """
        self._cut_at = min(self._cut_at, time.monotonic() + timeout)

    def _join(self, thread: threading.Thread, deadline: float) -> None:
        while thread.is_alive() and not self._hurry:
            left = min(deadline, self._cut_at) - time.monotonic()
            if left <= 0:
                return
            thread.join(min(left, 0.1))

    def processor_died(self, processor: Processor) -> None:
        """Replace a processor that died of a bug (on its own thread), unless stopping."""
        if self._stopping:
            return
        replacement = self._new_processor(processor.index)
        self.processors[self.processors.index(processor)] = replacement
        replacement.start()

    # -- for the heartbeat and the launcher ------------------------------------

    @property
    def paused(self) -> frozenset[str]:
        """The queues not to fetch from (set by the heartbeat from ``paused_queues``)."""
        return self.fetcher.paused

    @paused.setter
    def paused(self, queues: frozenset[str]) -> None:
        self.fetcher.paused = queues

    @property
    def fetch_failing(self) -> bool:
        """Whether the fetcher's last round trip to Redis failed (readiness: engine/process/health.py)."""
        return self.fetcher.watchdog.failing

    @property
    def busy(self) -> int:
        return self.ledger.busy

    def running_jobs(self) -> list[bytes]:
        return self.ledger.running_jobs()

    def workers_snapshot(self) -> dict[str, str]:
        return self.ledger.workers_snapshot()

    def known_raws(self) -> collections.Counter[bytes]:
        """Every payload this process holds: handed over, running, or finished and unsettled.

        Read in the order a job moves through them (the ledger, then pending, then held acks): a
        job that finishes meanwhile is added to the later ones before it leaves the earlier. (An
        ack in a round trip under way, riding on a fetch or sent at the settlement queue's cap, is in
        none of them: the reconcile requeues only what is unknown at two of its rounds in a row.)
        """
        known = self.ledger.held()
        known.update(self.settler.pending_settlements().keys())  # (its values are settlements, not counts)
        known.update(self.settlements.held())
        return known

    def pending_settlements(self) -> dict[bytes, Settlement]:
        return self.settler.pending_settlements()

    def retry_pending_settlements(self) -> int:
        return self.settler.retry_pending_settlements()
