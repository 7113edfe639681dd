"""The manager: processor threads, the fetcher thread, and this process's own record of its jobs.

Created by the Launcher. ``start`` starts ``concurrency`` processors and one
fetcher thread. The fetcher takes at most as many jobs per round trip as there
are idle processors (never hoarding: what one process can't start now stays in
Redis for the others) and hands them over. ``quiet`` stops fetching;
``stop(timeout)`` quiets, waits up to ``timeout`` for running jobs, then hands
back everything unfinished (``requeue_unfinished``).

The record (running jobs, pending settlements) lives in memory on purpose: it
is trusted over anything in Redis, which may be what is failing, or may have
lost its last writes in a failover.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import payload as payloads
from .. import scripts
from ..conf import Config
from ..errors import is_unsendable
from .fetch import Fetch, Unit
from .processor import Processor
from .retry import Filing, RetryPolicy
from .stats import Stats
from .watchdog import Watchdog

logger = logging.getLogger(__name__)

Settlement = Any  # "ack", or a Filing (failed job to file in retry/dead)

# Batching under load (Manager._gather): the longest a fetch waits for more idle
# processors, the share of a core above which the process counts as bound by
# the GIL, and how often that share is measured.
GATHER_WAIT = 0.002
GIL_BUSY = 0.8
LOAD_WINDOW = 0.1


class Manager:
    def __init__(self, config: Config, fetch: Fetch, retry: RetryPolicy, stats: Stats,
                 server_chain: Callable[[Any, dict], Any]):
        self.config = config
        self.fetch = fetch
        self.keys = fetch.keys
        self.redis = fetch.redis
        self.retry = retry
        self.stats = stats
        self.server_chain = server_chain
        self.paused: frozenset[str] = frozenset()
        # Called with (payload, moment) when a job starts and when its run
        # ends ("success", "retry", "dead"): the launcher releases unique and
        # periodic locks with it.
        self.run_hook: Callable[[dict, str], Any] | None = None
        self._quiet = threading.Event()
        self._stopping = False
        # Hand-over from the fetcher to the processors, and back: C-level queues rather than a
        # Condition and a Semaphore (Python code that takes locks twice per call), which cost
        # several µs of GIL-held time per job in a worker bound by the GIL.
        self._units: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per idle processor
        for _ in range(config.concurrency):
            self._idle.put(None)
        self._ack_lock = threading.Lock()
        self._acks: list[bytes] = []  # finished, to be acked with the next fetch
        self._fetcher_blocking = False
        self._cpu_busy = False
        self._load_mark = (time.monotonic(), time.process_time())
        self._jobs_lock = threading.Lock()
        # raw payload -> how many copies run now (two copies of one payload can run at once)
        self._running: collections.Counter[bytes] = collections.Counter()
        # raw payload -> copies handed to the processors, not yet started
        self._handed: collections.Counter[bytes] = collections.Counter()
        # thread ident -> (thread name, unit, payload, started at epoch), for the workers hash
        self._by_thread: dict[int, tuple[str, Unit, dict, float]] = {}
        # raw payload -> "ack" or Filing: finished, not yet settled in Redis
        self._pending: dict[bytes, Settlement] = {}
        self.processors = [Processor(self, i) for i in range(config.concurrency)]
        self._fetcher = threading.Thread(target=self._fetch_loop, name="cogworker-fetcher", daemon=True)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        for p in self.processors:
            p.start()
        self._fetcher.start()

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
        self.make_quiet()
        if self._fetcher.ident is not None:  # (a stop can come before start)
            # Not bounded by the deadline: a blocking fetch still in flight may yet receive a
            # job, which the fetcher then hands back (_fetch_loop). Exiting before it has done
            # so lost that job with basic fetch. The wait is at most one blocking call.
            self._fetcher.join(self.fetch.block_cap + 5)
        self._stopping = True
        unstarted = self._drain_units()
        for _ in self.processors:
            self._units.put(None)  # each processor returns on taking one
        for p in self.processors:
            if p.thread.ident is not None:
                p.thread.join(max(0.0, deadline - time.monotonic()))
        unstarted += self._drain_units()  # (handed over by a fetcher that outlived its join)
        with self._jobs_lock:
            for unit in unstarted:
                self._forget_handed(unit.raw)
        # In the order they were fetched: the running ones first (basic fetch requeues in this order).
        unfinished = [p.current for p in self.processors if p.thread.is_alive() and p.current] + unstarted
        if unfinished:
            logger.warning("%d job(s) still running or unstarted at the shutdown deadline", len(unfinished))
        self._pend_acks(self._take_acks())  # held for a fetch that won't come
        return self.requeue_unfinished(unfinished)

    # -- fetcher thread ------------------------------------------------------

    def _fetch_loop(self) -> None:
        watchdog = Watchdog("fetcher", self._quiet)
        deep = False
        while not self._quiet.is_set():
            try:
                self._idle.get(timeout=0.5)
            except queue.Empty:
                continue
            n = self._gather(deep)
            units: list[Unit] = []
            acks = self._take_acks()
            if not watchdog.run_step(lambda: units.extend(  # noqa: B023
                    self.fetch.retrieve(n, self.paused, acks, self._before_block))):  # noqa: B023
                self._pend_acks(acks, failed=True)
            with self._ack_lock:
                self._fetcher_blocking = False
            deep = len(units) == n
            for _ in range(n - len(units)):
                self._idle.put(None)
            if units and self._quiet.is_set():
                # Received by a blocking call that outlived quiet (or the stop): no new job may
                # start now, so straight back to the head of its queue, for any process.
                self._hand_back(units)
                units = []
            if units:
                with self._jobs_lock:
                    for unit in units:
                        self._handed[unit.raw] += 1
                for unit in units:
                    self._units.put(unit)
            elif watchdog.failures == 0 and not self.fetch.queue_order(self.paused):
                self._quiet.wait(self.config.fetch_idle_max_interval)  # every queue paused: don't spin

    def _gather(self, deep: bool) -> int:
        """Take the idle tokens (one is held already); when worth it, wait briefly for more.

        A fetch round trip costs the process about as much CPU as a small job, so
        under a deep queue taking 5 jobs per trip instead of 2 saves a fifth of
        the worker's CPU. Waiting for more processors to go idle is free only when
        they couldn't run anyway: when this process is bound by the GIL (its
        threads together keep a core busy). With I/O-bound jobs it would leave
        processors idle, so there is no wait then. Never more than are idle:
        what this process can't start now stays in Redis for the others.
        """
        n = 1 + min(self._idle.qsize(), self.config.concurrency - 1)  # (only this thread takes tokens)
        for _ in range(n - 1):
            self._idle.get_nowait()
        if deep and n < self.config.concurrency and self._cpu_bound():
            deadline = time.monotonic() + GATHER_WAIT
            while n < self.config.concurrency:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    self._idle.get(timeout=left)
                except queue.Empty:
                    break
                n += 1
        return n

    def _cpu_bound(self) -> bool:
        """Did this process use at least GIL_BUSY of a core over the last LOAD_WINDOW or so?"""
        now = time.monotonic()
        since, cpu_then = self._load_mark
        if now - since >= LOAD_WINDOW:
            cpu = time.process_time()
            self._cpu_busy = (cpu - cpu_then) / (now - since) >= GIL_BUSY
            self._load_mark = (now, cpu)
        return self._cpu_busy

    # -- acks ride on the fetch ---------------------------------------------
    #
    # A finished job's ack (LREM from the in-progress list) waits in memory
    # for the fetcher's next round trip, which a busy process makes as soon as
    # the processor that finished is idle: about one round trip per batch
    # instead of one more per job. While the fetcher blocks (idle), acks go out
    # at once instead. The window this widens: a process killed with acks
    # still in memory has those finished jobs recovered as orphans and run
    # again; at most one per processor, for at most one fetch round trip (plus
    # GATHER_WAIT when the fetcher gathers idle processors).

    def ack(self, raw: bytes) -> None:
        with self._ack_lock:
            if not self._fetcher_blocking and not self._stopping and self._fetcher.is_alive():
                self._acks.append(raw)
                return
        self.settle(raw, "ack")

    def _take_acks(self) -> list[bytes]:
        with self._ack_lock:
            acks, self._acks = self._acks, []
        return acks

    def _before_block(self) -> None:
        """The fetcher is about to block: acks from now on go out at once, and so do any held."""
        with self._ack_lock:
            self._fetcher_blocking = True
            acks, self._acks = self._acks, []
        if acks:
            try:
                self.fetch.ack_many(acks)
            except Exception:
                self._pend_acks(acks, failed=True)
                raise

    def _pend_acks(self, acks: list[bytes], failed: bool = False) -> None:
        """Keep acks as pending settlements: retried every beat, and dropped atomically at shutdown."""
        if failed:
            for raw in acks:
                logger.error("settling jid=%s failed (its ack didn't reach Redis); kept in memory and retried",
                             _jid("ack", raw))
        if acks:
            with self._jobs_lock:
                for raw in acks:
                    self._pending[raw] = "ack"

    def _hand_back(self, units: list[Unit]) -> None:
        try:
            self.fetch.hand_back(units)
        except Exception:
            logger.exception("could not hand back %d job(s) fetched after quiet", len(units))
        for _ in units:
            self._idle.put(None)

    def next_unit(self) -> Unit | None:
        """Block until a unit is handed over; None once stopping."""
        return self._units.get()

    def _drain_units(self) -> list[Unit]:
        units = []
        while True:
            try:
                unit = self._units.get_nowait()
            except queue.Empty:
                return units
            if unit is not None:
                units.append(unit)

    def processor_idle(self) -> None:
        self._idle.put(None)

    def processor_died(self, processor: Processor) -> None:
        if self._stopping:
            return
        replacement = Processor(self, processor.index)
        self.processors[self.processors.index(processor)] = replacement
        replacement.start()

    # -- the record ----------------------------------------------------------

    def job_started(self, unit: Unit, payload: dict) -> None:
        with self._jobs_lock:
            self._forget_handed(unit.raw)
            self._running[unit.raw] += 1
            # By ident, not name: a job may rename its thread, and must not leave a phantom run behind.
            self._by_thread[threading.get_ident()] = (threading.current_thread().name, unit, payload, time.time())

    def unit_dropped(self, unit: Unit) -> None:
        """A handed-over unit that never started (its payload couldn't be run) is settled."""
        with self._jobs_lock:
            self._forget_handed(unit.raw)

    def _forget_handed(self, raw: bytes) -> None:
        if self._handed[raw] > 1:
            self._handed[raw] -= 1
        else:
            self._handed.pop(raw, None)

    def job_finished(self, unit: Unit) -> None:
        with self._jobs_lock:
            self._running[unit.raw] -= 1
            if self._running[unit.raw] <= 0:
                del self._running[unit.raw]
            self._by_thread.pop(threading.get_ident(), None)

    def running_jobs(self) -> list[bytes]:
        with self._jobs_lock:
            return list(self._running)

    @property
    def busy(self) -> int:
        with self._jobs_lock:
            return len(self._by_thread)

    def workers_snapshot(self) -> dict[str, str]:
        """thread name -> JSON of what it runs, for ``workers:<identity>``."""
        with self._jobs_lock:
            items = list(self._by_thread.items())
        return {name: json.dumps({"queue": unit.queue, "payload": unit.raw.decode("utf-8", "replace"),
                                  "run_at": started})
                for _ident, (name, unit, _payload, started) in items}

    def known_raws(self) -> collections.Counter[bytes]:
        """Every payload this process holds: handed over, running, or finished and unsettled."""
        with self._jobs_lock:
            known = collections.Counter(self._handed)
            known.update(self._running)
            known.update(self._pending.keys())  # (its values are settlements, not counts)
        with self._ack_lock:
            known.update(self._acks)
        return known

    def pending_settlements(self) -> dict[bytes, Settlement]:
        with self._jobs_lock:
            return dict(self._pending)

    # -- settling ------------------------------------------------------------

    def settle(self, raw: bytes, how: Settlement) -> None:
        """Ack or file a finished job; if Redis refuses, remember it and retry on later beats."""
        how, error = self._settle_once(raw, how)
        if error is not None:
            logger.error("settling jid=%s failed (%s: %s); kept in memory and retried",
                         _jid(how, raw), type(error).__name__, payloads.printable(error, payloads.ERROR_MESSAGE_LIMIT))
            with self._jobs_lock:
                self._pending[raw] = how

    def _settle_once(self, raw: bytes, how: Settlement) -> tuple[Settlement, Exception | None]:
        """Apply ``how``; return the settlement to keep trying (None when done) and why it failed.

        A filing that can't be written as built (:func:`is_unsendable`) is no outage: waiting changes
        nothing. It is filed once more at once, as the payload was fetched with the failure's fields
        appended (:meth:`Filing.as_stored`), so the job still ends in retry or dead with its error.
        """
        try:
            self._apply(raw, how)
            return how, None
        except Exception as exc:
            if not (isinstance(how, Filing) and how.text is None and is_unsendable(exc)):
                return how, exc
            unsendable = exc
        try:
            how = how.as_stored(raw)
        except Exception as exc:  # (raw that isn't a JSON object: the processor buries those itself)
            logger.error("jid=%s could not be filed (%s: %s), nor as it was fetched (%s)", _jid(how, raw),
                         type(unsendable).__name__, payloads.printable(unsendable), payloads.printable(exc))
            return how, unsendable
        logger.error("jid=%s could not be filed as built (%s: %s); filed as it was fetched, with its error",
                     _jid(how, raw), type(unsendable).__name__, payloads.printable(unsendable))
        try:
            self._apply(raw, how)
            return how, None
        except Exception as exc:
            return how, exc

    def _apply(self, raw: bytes, how: Settlement) -> None:
        if how == "ack":
            self.fetch.ack(raw)
        else:
            self.fetch.file(raw, how, self.retry.dead_trim() if how.target == "dead" else None)

    def retry_pending_settlements(self) -> int:
        """One more try at every pending settlement; return how many are still pending."""
        for raw, how in self.pending_settlements().items():
            settled, error = self._settle_once(raw, how)
            with self._jobs_lock:
                if self._pending.get(raw) is not how:
                    continue
                if error is None:
                    del self._pending[raw]
                else:
                    self._pending[raw] = settled
            if error is not None:
                logger.warning("pending settlement of jid=%s still fails: %s", _jid(how, raw),
                               payloads.printable(error, payloads.ERROR_MESSAGE_LIMIT))
        return len(self._pending)

    def requeue_unfinished(self, unfinished: list[Unit]) -> int:
        """Hand back what didn't finish; settle or hand over what did. Never raises.

        Jobs that finished but aren't settled are still on the in-progress list.
        One more try at settling them first; then the acks that still fail are
        dropped in the same atomic step as requeueing the rest (a separate ack
        pass that failed used to leave finished jobs to be requeued and run
        again). Failures that can't be filed even now are handed to
        ``unsettled`` for any live process to file later: never requeued, they
        already ran. What can't even be handed over stays on the list
        (``keep``) for orphan recovery once this process is gone.
        """
        try:
            self.retry_pending_settlements()
            pending = self.pending_settlements()
            keep = self._park_unsettled({raw: how for raw, how in pending.items() if how != "ack"})
            acks = [raw for raw, how in pending.items() if how == "ack"]
            moved = self.fetch.requeue(unfinished, acks=acks, keep=keep)
            self._tell_requeued(unfinished)
            with self._jobs_lock:
                for raw in acks:
                    self._pending.pop(raw, None)
            if moved:
                logger.warning("requeued %d job(s) unfinished at shutdown", moved)
            return moved
        except Exception:
            logger.exception("requeueing unfinished jobs failed; they stay on %s for orphan recovery",
                             self.fetch.in_progress)
            return 0

    def _tell_requeued(self, units: list[Unit]) -> None:
        """Run the hook for jobs handed back (an until_executed run keeps its periodic lock while queued)."""
        if self.run_hook is None:
            return
        for unit in units:
            try:
                self.run_hook(payloads.decode(unit.raw), "requeued")
            except Exception as exc:
                logger.warning("requeue hook failed: %s: %s", type(exc).__name__, exc)

    def _park_unsettled(self, unfiled: dict[bytes, Filing]) -> list[bytes]:
        keep = []
        for raw, filing in unfiled.items():
            try:
                record = payloads.encode({"target": filing.target, "score": filing.score, "payload": filing.raw()})
                scripts.PARK_UNSETTLED(self.redis, [self.fetch.in_progress, self.keys.unsettled], [raw, record])
            except Exception as exc:
                logger.error("could not hand jid=%s over to %s (%s); left for orphan recovery",
                             payloads.printable(filing.payload.get("jid")), self.keys.unsettled, exc)
                keep.append(raw)
                continue
            with self._jobs_lock:
                self._pending.pop(raw, None)
        return keep


def _jid(how: Settlement, raw: bytes) -> str:
    """The job's jid, for a log line."""
    if isinstance(how, Filing):
        return payloads.printable(how.payload.get("jid"))
    try:
        return payloads.printable(json.loads(raw).get("jid"))
    except Exception:
        return "?"
