"""The fetcher thread: takes as many jobs as there are idle processors, and hands them over.

It waits for an idle processor, counts how many are idle (n), and asks the
fetch for up to n jobs: what it can't start now stays in Redis for the others.
Jobs go to the processors, and idle tokens come back, through C-level queues
(``queue.SimpleQueue``). What the jobs that finished since the last round
settled rides on the same round trip (the settlement queue's Outgoing:
engine/settle/queue.py); with nothing waiting, the fetcher blocks on one
queue (``Fetch.wait``), and what settles meanwhile goes out at once.

While its jobs run short (under SHORT_RUN on average), a process with a fetch
that keeps what it holds in Redis (reliable) also takes up to ``PREFETCH`` jobs
per processor ahead (a setting: 1 by default, 0 for none; counted for at least
AHEAD_MIN processors), so that a processor
done with a job starts the next at once instead of waiting for a round trip,
and the fetcher is woken once per few jobs (when what is waiting runs low)
instead of once per job: each wake-up hands the GIL to another thread, on
another CPU when the process isn't pinned. A job
taken ahead is on the in-progress list like a running one: orphan recovery puts
it back if the process dies, counted in ``max_orphanings`` the same way, and at
quiet the fetcher puts back at the head of their queues those no processor
started. It waits at most a few short jobs: with longer jobs (a job that takes
a second would keep one waiting a second while another process sat idle) none
are taken ahead, as before. A process that stalls past ORPHAN_THRESHOLD may be
taken for dead meanwhile, and what it took requeued elsewhere: a job taken before
then is started only once found still its own (stall.py, ``next_unit``).

With an event loop (ASYNC_CONCURRENCY > 0) a fetch asks for its free places too, and each job goes
to its pool: routing.py. None is taken ahead for the loop: a job handed to it starts at once.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time

from ...conf import Config
from ..loops import Watchdog
from ..run.hooks import FetchHooks
from ..settle.outgoing import Outgoing
from ..settle.queue import SettlementQueue
from .contract import Fetch, Unit, shown
from .ledger import Ledger
from .routing import Router
from .stall import clock as stall_clock

logger = logging.getLogger(__name__)

# Batching under load (Fetcher._gather): the longest a fetch waits for more idle
# processors, the share of a core above which the process counts as bound by
# the GIL, and how often that share is measured.
GATHER_WAIT = 0.002
GIL_BUSY = 0.8
LOAD_WINDOW = 0.1
# Taking ahead: the mean run (s) under which jobs are, the weight of each finished job in that mean,
# and the fewest processors PREFETCH counts (with 2, a place ahead each left a fetch every other
# job: -c 2 took 2,870 jobs/s with 2 ahead, 3,449 with 8; bench/wakeups.py).
SHORT_RUN = 0.005
AHEAD_MIN = 8
RUN_WEIGHT = 0.05


class Fetcher:
    """The loop that fetches for the processors, and the hand-over between them.

    Created by the Manager, with the Manager's quiet event. ``start`` runs the
    loop on the ``cogworker-fetcher`` daemon thread, under a Watchdog; quiet
    ends it (a job a blocking call receives after quiet is handed straight
    back to its queue, never started). At stop the Manager calls ``join``,
    then ``drain`` (units handed over but never taken) and ``release`` (one
    ``None`` per processor, which returns on taking it).

    Processor threads call ``next_unit`` and, once done with it,
    ``processor_idle``; the heartbeat sets ``paused``. The fetcher owns the draining side of the
    settlement queue: it opens it, takes what goes out with each fetch, and closes it at its end.
    """

    def __init__(self, config: Config, fetch: Fetch, ledger: Ledger, settlements: SettlementQueue,
                 quiet: threading.Event, hooks: FetchHooks | None = None):
        self.config = config
        # The features' work on a whole fetch (a limit's takes, one round trip), and on jobs fetched
        # that never run here (what that work took, given back): engine/run/hooks.py.
        self.hooks = hooks if hooks is not None else FetchHooks(())
        self.fetch = fetch
        self.ledger = ledger
        # What the processors settled, sent with each fetch (engine/settle/queue.py).
        self.settlements = settlements
        self.quiet = quiet
        self.paused: frozenset[str] = frozenset()  # queues not to fetch from, read at each beat
        # Hand-over from the fetcher to the processors, and back: C-level queues rather than a
        # Condition and a Semaphore (Python code that takes locks twice per call), which cost
        # several µs of GIL-held time per job in a worker bound by the GIL.
        self._units: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
        # One token per job this process may take: an idle processor's, or a place ahead.
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._ahead = max(config.concurrency, AHEAD_MIN) * config.prefetch if fetch.keeps_held else 0
        # Tokens of places ahead the fetcher holds back, out of the queue (all, until jobs prove short).
        self._reserved = self._ahead
        self._run_mean = SHORT_RUN * 2  # a finished job's mean run, seconds (as if long, at first)
        for _ in range(config.concurrency):
            self._idle.put(None)
        # The fetcher waits on this, not on the tokens: a processor wakes it when it finds nothing
        # to take, or when what waits for the processors is down to low water, not for every job.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._low_water = self._ahead // 2
        self._cpu_busy = False
        self._load_mark = (time.monotonic(), time.process_time())
        # (its ``failing`` is the fetcher's part of readiness: engine/process/health.py)
        self.watchdog = Watchdog("fetcher", quiet)
        # The event loop's places and where each job goes (routing.py); None: threads only.
        self.router: Router | None = None
        self._held = False  # whether _awake left the fetcher holding a processor's token
        self.thread = threading.Thread(target=self._run, name="cogworker-fetcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        """Wait for the loop to end (after quiet); a no-op if it never started.

        Not bounded by the shutdown deadline: a blocking fetch still in flight may yet receive a
        job, which the loop then hands back. Exiting before it has done so lost that job with
        basic fetch. The wait is at most one blocking call.
        """
        if self.thread.ident is not None:
            self.thread.join(self.fetch.block_cap + 5)

    # -- the hand-over, processor side -----------------------------------------

    def next_unit(self) -> Unit | None:
        """The next unit handed over, waking the fetcher first if there is none yet; None once stopping.

        One taken before this process may have been taken for dead (it stalled past
        ORPHAN_THRESHOLD: stall.py) is handed out only once the fetch has found it still ours;
        one that isn't (orphan recovery gave it to another process) is dropped, and the next taken.
        """
        while True:
            try:
                unit = self._units.get_nowait()
            except queue.Empty:
                self._wake.put(None)
                unit = self._units.get()
            if unit is None or self.admit(unit):
                return unit
            self._idle.put(None)

    def admit(self, unit: Unit) -> bool:
        """Whether ``unit`` may start (the loop runner asks too): surely ours, or found so by the
        fetch; one that isn't is dropped, its place to be freed by the caller."""
        return self.fetch.stall.covers(unit.taken) or self._still_ours(unit)

    def _still_ours(self, unit: Unit) -> bool:
        """Ask the fetch; a unit that isn't ours, or that can't be asked about, is dropped."""
        try:
            if self.fetch.still_ours(unit):
                return True
            logger.warning("jid=%s, taken before this process went silent past ORPHAN_THRESHOLD, was taken back by "
                           "orphan recovery meanwhile: not started here (it runs elsewhere)", shown(unit)[0])
        except Exception as exc:  # (Redis away: left where it is; on our list, the reconcile puts it back)
            logger.warning("jid=%s, taken before this process went silent past ORPHAN_THRESHOLD, could not be "
                           "checked (%s: %s): not started here", shown(unit)[0], type(exc).__name__, exc)
        self.ledger.unit_dropped(unit)
        self.hooks.returned([unit])
        return False

    def processor_idle(self, ran: float = SHORT_RUN * 2) -> None:
        """A processor is done with a unit it took ``ran`` seconds to run and settle."""
        # (updated without a lock by each processor: a lost update moves the mean a little less)
        self._run_mean += (ran - self._run_mean) * RUN_WEIGHT
        self._idle.put(None)
        if self.router is not None:
            self.router.thread_freed()
        if self._ahead and self._units.qsize() <= self._low_water:
            self._wake.put(None)  # (to take more ahead before the processors run out)

    def wake(self) -> None:
        """Wake the fetcher (a place on the event loop freed: routing.py)."""
        self._wake.put(None)

    def drain(self) -> list[Unit]:
        """Take back the units handed over that no processor has taken."""
        units: list[Unit] = []
        while True:
            try:
                unit = self._units.get_nowait()
            except queue.Empty:
                return units
            if unit is not None:
                units.append(unit)

    def release(self, processors: int) -> None:
        """Hand ``processors`` processors a None each: each returns on taking one."""
        for _ in range(processors):
            self._units.put(None)

    # -- the loop ----------------------------------------------------------------

    def _run(self) -> None:
        self.settlements.open()
        try:
            self._fetch_until_quiet()
            # Taken ahead, not started: back to the head of their queues for any process (at the
            # stop, the Manager drains whatever a processor took meanwhile or a late fetch added).
            ahead = self.drain()
            if ahead:
                self.ledger.forget_unstarted(ahead)
                self._hand_back(ahead)
        finally:
            # Held for a fetch that won't come: sent now, and later ones at once. Left held until the
            # stop, a long quiet (TSTP before a deploy) kept those finished jobs on the in-progress
            # list, and a kill -9 meanwhile ran them again.
            self.settlements.close()

    def _fetch_until_quiet(self) -> None:
        watchdog = self.watchdog
        deep = False
        while not self.quiet.is_set():
            if not self._awake():
                continue
            n, places = self._gather(deep)
            want = n + places if self.router is None else self.router.count(n, places)
            if want == 0:  # (the mix of jobs lately says neither pool would take one: routing.py)
                self._give_back(n, places)
                continue
            units: list[Unit] = []
            sent = stall_clock()  # (before the fetch: a job may be ours from the moment it is sent)
            watchdog.run_step(functools.partial(self._fetch, want, units))
            deep = len(units) == want
            if units and self.quiet.is_set():
                # Received by a blocking call that outlived quiet (or the stop): no new job may
                # start now, so straight back to the head of its queue, for any process.
                self._hand_back(units, tokens=False)
                units = []
            to_loop: list[Unit] = []
            if units and self.router is not None:
                units, to_loop, back = self.router.split(units, n, places)
                if back:  # (seen by no feature, recorded nowhere: as if never fetched)
                    self._hand_back(back, tokens=False, hooks=False)
            self._give_back(n - len(units), places - len(to_loop))
            if units or to_loop:
                self.hooks.fetched(units + to_loop)
                self.ledger.hand(units + to_loop)
                for unit in units + to_loop:
                    unit.taken = sent
                for unit in units:
                    self._units.put(unit)
                if to_loop:
                    self.router.loop.submit(to_loop)  # type: ignore[union-attr]
            elif watchdog.failures == 0 and not self.fetch.queue_order(self.paused):
                self.quiet.wait(self.config.fetch_idle_max_interval)  # every queue paused: don't spin

    def _give_back(self, tokens: int, places: int) -> None:
        for _ in range(tokens):
            self._idle.put(None)
        if self.router is not None:
            self.router.give(places)

    def _fetch(self, n: int, units: list[Unit]) -> None:
        """One fetch of up to ``n`` jobs into ``units``, carrying what the processors settled; with
        nothing waiting, a blocking wait on one queue (what settles meanwhile goes out at once)."""
        outgoing: Outgoing = self.settlements.take(self.fetch.rides)
        try:
            # (self.fetch looked up at each call: tests replace its methods on the instance.)
            units += self.fetch.retrieve(n, self.paused, outgoing)
        except BaseException as exc:
            self.settlements.sent(outgoing, exc)
            raise
        self.settlements.sent(outgoing)
        if units or not self.fetch.queue_order(self.paused):
            return
        self.settlements.waiting()
        try:
            units += self.fetch.wait(self.paused)
        finally:
            self.settlements.fetching()

    def _awake(self) -> bool:
        """Wait until a processor is idle, or what waits for the processors runs low; hold one token.

        False after 0.5 s without (to look at quiet). Spare wakes are drained here: each
        processor may have asked for one.
        """
        self._held = self._take_token()
        if self._held:
            if self._units.qsize() <= self._low_water and self._worth():
                return True
            self._idle.put(None)  # (enough waiting still, or nothing to fetch for: wait for a wake)
            self._held = False
        elif self.router is not None and self._worth():
            return True
        try:
            self._wake.get(timeout=0.5)
        except queue.Empty:
            return False
        while True:
            try:
                self._wake.get_nowait()
            except queue.Empty:
                break
        self._held = self._take_token()
        if self._worth():
            return True
        if self._held:
            self._idle.put(None)
            self._held = False
        return False

    def _worth(self) -> bool:
        """Whether a fetch now would ask for a job (with the event loop: the Router's count)."""
        router = self.router
        if router is None:
            return self._held
        threads = int(self._held) + (0 if router.blocked == "thread" else self._idle.qsize())
        return router.count(threads, router.places()) > 0

    def _take_token(self) -> bool:
        """Take an idle processor's token, if one is there and the threads aren't blocked (routing.py)."""
        if self.router is not None and self.router.blocked == "thread":
            return False
        try:
            self._idle.get_nowait()
        except queue.Empty:
            return False
        return True

    def _gather(self, deep: bool) -> tuple[int, int]:
        """Take the idle tokens (one may be held already) and the loop's free places; when worth it,
        wait briefly for more idle processors. Return (jobs for the threads, for the loop).

        A fetch round trip costs the process about as much CPU as a small job, so
        under a deep queue taking 5 jobs per trip instead of 2 saves a fifth of
        the worker's CPU. Waiting for more processors to go idle is free only when
        they couldn't run anyway: when this process is bound by the GIL (its
        threads together keep a core busy). With I/O-bound jobs it would leave
        processors idle, so there is no wait then. Never more than are idle (plus
        the places ahead, while jobs run short): what this process can't start
        soon stays in Redis for the others.
        """
        places = self.router.take() if self.router is not None else 0
        if not self._held and self.router is not None and self.router.blocked == "thread":
            return 0, places
        n = int(self._held) + self._idle.qsize()  # (only this thread takes tokens: all of these are there)
        for _ in range(n - int(self._held)):
            self._idle.get_nowait()
        if self._ahead:
            n = self._hold_back(n)
        capacity = self.config.concurrency + self._ahead - self._reserved
        if deep and 0 < n < capacity and self._cpu_bound():
            deadline = time.monotonic() + GATHER_WAIT
            while n < capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    self._idle.get(timeout=left)
                except queue.Empty:
                    break
                n += 1
        return n, places

    def _hold_back(self, n: int) -> int:
        """Of ``n`` tokens taken, keep back those of places ahead while jobs run long (none while
        they run short, the ones held given back); return the number left to fetch for."""
        if self._run_mean < SHORT_RUN:
            n, self._reserved = n + self._reserved, 0
        else:
            keep = min(self._ahead - self._reserved, n)
            n, self._reserved = n - keep, self._reserved + keep
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

    def _hand_back(self, units: list[Unit], tokens: bool = True, hooks: bool = True) -> None:
        if hooks:
            self.hooks.returned(units)
        try:
            self.fetch.hand_back(units)
        except Exception:  # (on our in-progress list still: the reconcile puts them back)
            logger.exception("could not hand back %d job(s) fetched and not to be started", len(units))
        for _ in units if tokens else ():
            self._idle.put(None)

