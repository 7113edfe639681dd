"""Caps on one worker process's life: MAX_MEMORY_MB and MAX_JOBS_PER_PROCESS.

Python processes that run jobs for months grow: a cache that is never cleared, a C extension's
fragments, a leak in a library. Celery's answer is ``--max-memory-per-child``; ours is the same
rule, kept without losing or repeating a job: a process over a cap takes nothing new, finishes
what it runs within SHUTDOWN_TIMEOUT (hands back the rest, as at TERM) and exits with
REPLACE_EXIT. Its supervisor (``--processes``) starts a fresh one at once; a lone process is
restarted by its process manager (systemd ``Restart=on-failure``, Kubernetes' restart policy).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .heartbeat import rss_kb

logger = logging.getLogger(__name__)

# The exit code of a process that exits to be replaced (a cap, a rolling restart): EX_TEMPFAIL of
# <sysexits.h>, "try again". Not 0, so that a process manager told to restart on failure does.
REPLACE_EXIT = 75
# Least seconds between two reads of the RSS from a job's start (each read is a file read, ~10 µs;
# at thousands of jobs a second, reading at every start would cost a share of a core).
MEMORY_EVERY = 0.25


@dataclass(frozen=True)
class Over:
    """Which cap a process passed, and its figures then (logged, and counted by reason)."""

    reason: str  # "memory" or "jobs"
    rss_mb: float
    jobs: int
    lived: float  # seconds since the process started

    def describe(self, max_memory_mb: int | None, max_jobs: int | None) -> str:
        cap = (f"MAX_MEMORY_MB {max_memory_mb}" if self.reason == "memory"
               else f"MAX_JOBS_PER_PROCESS {max_jobs}")
        return (f"over {cap}: RSS {self.rss_mb:.1f} MB, {self.jobs} job(s) started in {self.lived:.1f}s; "
                f"taking nothing new, finishing what runs, then exiting (code {REPLACE_EXIT}) to be replaced")


class Caps:
    """Watches this process against its caps and says once when it passes one.

    Created by the Launcher when MAX_MEMORY_MB or MAX_JOBS_PER_PROCESS is set. ``job_started`` is
    called on each processor thread as a job starts (the Manager's ledger hook): it counts the job
    and, at most every MEMORY_EVERY seconds, reads the RSS. ``check`` is called on each heartbeat
    (the RSS of a process whose jobs are long is read there). The first cap passed calls
    ``on_over`` once, on whichever thread saw it; it must only quiet and queue (the Launcher's).
    """

    def __init__(self, max_memory_mb: int | None, max_jobs: int | None, on_over: Callable[[Over], None], *,
                 rss: Callable[[], int] = rss_kb, clock: Callable[[], float] = time.monotonic):
        self.max_memory_kb = max_memory_mb * 1024 if max_memory_mb else None
        self.max_jobs = max_jobs
        self.on_over = on_over
        self.rss, self.clock = rss, clock
        self.started = clock()
        self._counter = itertools.count(1)  # (next() is atomic under the GIL; ``+= 1`` from threads loses counts)
        self.jobs = 0
        self._next_memory = 0.0
        self._over = False
        self._lock = threading.Lock()

    def job_started(self) -> None:
        jobs = self.jobs = next(self._counter)
        if self.max_jobs is not None and jobs >= self.max_jobs:
            self._passed("jobs", self.rss())
        elif self.max_memory_kb is not None and self.clock() >= self._next_memory:
            self.check()

    def check(self) -> None:
        """Read the RSS now; say so if it is over MAX_MEMORY_MB."""
        if self.max_memory_kb is None:
            return
        self._next_memory = self.clock() + MEMORY_EVERY
        kb = self.rss()
        if kb > self.max_memory_kb:
            self._passed("memory", kb)

    def _passed(self, reason: str, kb: int) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        self.on_over(Over(reason, kb / 1024, self.jobs, self.clock() - self.started))
