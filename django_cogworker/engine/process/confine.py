"""Keeping a worker bound by its GIL on one CPU, while it is (``CPU_AFFINITY`` "auto", a process it leaves free).

Why: a worker process runs one thread's Python at a time (the GIL), yet the kernel spreads its
threads over every CPU it may use. Each of a job's Redis calls gives the GIL away and takes it
back, and with ten processor threads there is always one waiting for it: the thread woken is as
likely on the other CPU, so the hand-over is a cross-CPU wake-up (an inter-processor interrupt,
dearer in a VM, dearest where the guest's cpuidle driver is ``none``), and the objects it touches
are cold in that CPU's cache. The process uses about one core either way; on one CPU it gets far
more done with it. Measured on a 2-CPU VM (AMD EPYC, cpuidle ``haltpoll``), one ``-c 10`` worker
draining no-op jobs (one INCR each): left free, 4,600-6,600 jobs/s at 150-220 µs of CPU a job and
about 10 futex calls a job; on one CPU, 10,000-11,800 jobs/s at 80-97 µs and 2 (docs/benchmarks.md).

Pinning for good would cost what affinity.py says: C code that releases the GIL (compression,
NumPy) could no longer spread over CPUs, and a CPU other work keeps busy could not be left. So a
process that "auto" leaves free (a lone ``runcogworker``; a supervisor's workers when fewer than
its CPUs) watches itself instead, once a WINDOW (jittered, so that processes on one host don't
decide in step), and keeps its threads on one CPU only while that pays:

* free, and using about a core over the last window (BOUND: its GIL's worth, no more, so nothing runs
  in parallel) → every thread onto the CPU that was idlest;
* on one CPU, and using less than IDLE_BELOW of a core (idle, or its jobs wait on I/O) → free;
* on one CPU that other work takes more than CROWDED of → onto the idlest other CPU with ROOM for
  it, else free (the kernel spreads a busy machine's work better than a guess);
* on one CPU for PROBE_EVERY → free for a window: a process whose jobs now run C code in parallel
  uses more than a core then, and stays free.

A thread started later (a processor replaced) is moved at the next window. A program a job starts
while the process is on one CPU inherits that CPU (Linux's rule for a child): ``CPU_AFFINITY
"none"`` leaves the process free always. Linux only (``os.sched_setaffinity`` per thread,
``/proc/stat``); never raises into the worker: a failure is logged and the process left free.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..loops import LoopThread

logger = logging.getLogger(__name__)

WINDOW = 0.25  # seconds between two looks (× 0.8-1.2): a burst of a few thousand jobs gains too
BOUND = (0.75, 1.25)  # cores used while free: bound by its GIL, nothing in parallel
IDLE_BELOW = 0.5  # cores used on one CPU under which it is freed
CROWDED = 0.3  # share of its CPU other work takes, over which it moves or is freed
ROOM = 0.5  # idle share a CPU needs to be moved to
PROBE_EVERY = 30.0  # seconds on one CPU before a window free


@dataclass(frozen=True)
class Reading:
    """One window: the cores this process used, and each CPU's idle share."""

    usage: float
    idle: Mapping[int, float]


def decide(current: int | None, reading: Reading, probe_due: bool = False) -> int | None:
    """The CPU the process should be on after ``reading`` (None: free); ``current`` is where it is."""
    idle = reading.idle
    if current is None:
        if BOUND[0] <= reading.usage <= BOUND[1] and len(idle) > 1:
            return _idlest(idle)
        return None
    if probe_due or reading.usage < IDLE_BELOW or current not in idle:
        return None
    others = 1.0 - idle[current] - reading.usage  # (all of its use is on that CPU)
    if others <= CROWDED:
        return current
    roomy = {cpu: share for cpu, share in idle.items() if cpu != current and share >= ROOM}
    return _idlest(roomy) if roomy else None


def _idlest(idle: Mapping[int, float]) -> int:
    return max(idle, key=lambda cpu: (idle[cpu], -cpu))


def cpu_times(cpus: Sequence[int], stat: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """(idle, total) clock ticks of each of ``cpus`` since boot (steal counts as busy: not ours to use)."""
    wanted = {f"cpu{cpu}": cpu for cpu in cpus}
    times: dict[int, tuple[int, int]] = {}
    with open(stat) as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name in wanted:
                ticks = [int(t) for t in rest.split()]
                times[wanted[name]] = (ticks[3] + ticks[4], sum(ticks[:8]))
    return times


def idle_shares(before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]]) -> dict[int, float]:
    shares = {}
    for cpu, (idle, total) in after.items():
        if cpu in before and total > before[cpu][1]:
            shares[cpu] = (idle - before[cpu][0]) / (total - before[cpu][1])
    return shares


def move_threads(cpus: frozenset[int]) -> None:
    """Every thread of this process onto ``cpus`` (Linux sets a thread's affinity, not a process's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # (it ended meanwhile)
            pass


class Confiner(LoopThread):
    """The watch, on its own daemon thread (a Launcher companion: LoopThread's ``start`` and ``stop``).

    ``allowed`` is what the process may run on, as it started; the clocks and the mover are
    injected for the tests.
    """

    def __init__(self, allowed: Sequence[int], *, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic, process_time: Callable[[], float] = time.process_time,
                 read_cpus: Callable[[Sequence[int]], dict[int, tuple[int, int]]] = cpu_times,
                 move: Callable[[frozenset[int]], None] = move_threads):
        self.allowed = frozenset(allowed)
        self.window = window
        self._clock = clock
        self._process_time = process_time
        self._read_cpus = read_cpus
        self._move = move
        self.cpu: int | None = None  # where its threads are kept (None: free)
        self._since = 0.0
        self._init_thread("cogworker-confiner")

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            logger.exception("CPU confinement failed; the process is left free")
            self._set(None, "after a failure")

    def _watch(self) -> None:
        cpus = sorted(self.allowed)
        then, cpu_then, ticks_then = self._clock(), self._process_time(), self._read_cpus(cpus)
        while not self.stop_event.wait(self.window * random.uniform(0.8, 1.2)):
            now, cpu_now, ticks_now = self._clock(), self._process_time(), self._read_cpus(cpus)
            reading = Reading((cpu_now - cpu_then) / (now - then), idle_shares(ticks_then, ticks_now))
            then, cpu_then, ticks_then = now, cpu_now, ticks_now
            self.step(reading, now)

    def step(self, reading: Reading, now: float) -> None:
        """Act on one window's reading."""
        probe_due = self.cpu is not None and now - self._since >= PROBE_EVERY
        target = decide(self.cpu, reading, probe_due)
        if target != self.cpu:
            self._since = now
            self._set(target, f"at {reading.usage:.2f} cores" + (" (a window free, to look)" if probe_due else ""))
        elif target is not None:
            self._move(frozenset({target}))  # (threads started since: a processor replaced)

    def _set(self, cpu: int | None, why: str) -> None:
        try:
            self._move(frozenset({cpu}) if cpu is not None else self.allowed)
        except OSError as exc:
            logger.warning("could not move this process's threads (CPU confinement): %s; left as they are", exc)
            return
        self.cpu = cpu
        logger.debug("threads %s %s", f"kept on CPU {cpu}" if cpu is not None else "free", why)


def for_process(setting: object, pinned: frozenset[int] | None) -> Confiner | None:
    """The Confiner of a process "auto" left free on a machine (or cpuset) of several CPUs, else None."""
    if setting != "auto" or pinned is not None or not hasattr(os, "sched_getaffinity"):
        return None
    if not os.path.exists("/proc/stat"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return Confiner(allowed) if len(allowed) > 1 else None
