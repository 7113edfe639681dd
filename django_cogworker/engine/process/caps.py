"""Caps on one worker process's life: MAX_MEMORY_MB and MAX_JOBS_PER_PROCESS.

Python processes that run jobs for months grow: a cache that is never cleared, a C extension's
fragments, a leak in a library. Celery's answer is ``--max-memory-per-child``; ours is the same
rule, kept without losing or repeating a job: a process over a cap takes nothing new, finishes
what it runs within SHUTDOWN_TIMEOUT (hands back the rest, as at TERM) and exits with
REPLACE_EXIT. Its supervisor (``--processes``) starts a fresh one at once; a lone process is
restarted by its process manager (systemd ``Restart=on-failure``, Kubernetes' restart policy).

A MAX_MEMORY_MB that a process passes before it runs anything can only be passed again by every
fresh one: replacing it at once made a fork loop (392 forks in 42 s, no job run). So a process
measures itself once it is up, before its processors start (``Caps.refusal``), and refuses to
run below it: it exits with REFUSE_EXIT, naming the cap and its size, and its supervisor stops.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .heartbeat import rss_kb

logger = logging.getLogger(__name__)

# The exit code of a process that exits to be replaced (a cap, a rolling restart): EX_TEMPFAIL of
# <sysexits.h>, "try again". Not 0, so that a process manager told to restart on failure does.
REPLACE_EXIT = 75
# The exit code of a process that refuses to run with its configuration (MAX_MEMORY_MB below what it
# takes before any job): EX_CONFIG of <sysexits.h>. Starting it again would only refuse again: a
# supervisor stops, and systemd's ``RestartPreventExitStatus=78`` keeps a lone one down.
REFUSE_EXIT = 78
# Least seconds between two reads of the RSS from a job's start (each read is a file read, ~10 µs;
# at thousands of jobs a second, reading at every start would cost a share of a core).
MEMORY_EVERY = 0.25


class Then(enum.Enum):
    """What a supervisor does once the newest process of a slot has exited (``after_exit``)."""

    AT_ONCE = "start a fresh one at once"
    BACK_OFF = "start a fresh one after the crash backoff"
    STOP = "stop the supervisor"


def after_exit(code: int, worked: bool, any_ready: bool) -> Then:
    """What follows the exit (``code``: os.waitstatus_to_exitcode's) of a slot's newest process.

    Replaced at once only if it exited to be replaced (REPLACE_EXIT: a cap) having run a job
    (``worked``: it said so as its first job started, report.WORKED). One that ran nothing would
    be followed by one that does the same: MAX_MEMORY_MB below a fresh process's size, replaced
    at once, forked 392 times in 42 s and ran no job. Every other exit, however quick (0, a
    signal, a cap passed before any job), backs off as a crash; a child that exits after each job
    on purpose (--max-jobs-per-process 1) ran one, and isn't slowed. A refusal (REFUSE_EXIT)
    before any child was ready (``any_ready``) stops the supervisor: each fresh process would
    refuse alike. After that (a rolling restart to a release that refuses), it backs off as a
    crash and the processes that work go on, as with a release that fails to import.
    """
    if code == REFUSE_EXIT and not any_ready:
        return Then.STOP
    if code == REPLACE_EXIT and worked:
        return Then.AT_ONCE
    return Then.BACK_OFF


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
    ``on_first_job`` is called once, as the first job starts: a supervisor replaces at once only
    a process that ran something (one that exits without is a loop in the making: report.py).
    ``refusal`` is asked once, as the process is up and before its processors start.
    """

    def __init__(self, max_memory_mb: int | None, max_jobs: int | None, on_over: Callable[[Over], None], *,
                 rss: Callable[[], int] = rss_kb, clock: Callable[[], float] = time.monotonic,
                 on_first_job: Callable[[], None] | None = None):
        self.max_memory_mb = max_memory_mb
        self.max_memory_kb = max_memory_mb * 1024 if max_memory_mb else None
        self.max_jobs = max_jobs
        self.on_over = on_over
        self.on_first_job = on_first_job
        self.rss, self.clock = rss, clock
        self.started = clock()
        self._counter = itertools.count(1)  # (next() is atomic under the GIL; ``+= 1`` from threads loses counts)
        self.jobs = 0
        self._next_memory = 0.0
        self._over = False
        self._lock = threading.Lock()

    def job_started(self) -> None:
        jobs = self.jobs = next(self._counter)
        if jobs == 1 and self.on_first_job is not None:
            self.on_first_job()
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

    def refusal(self) -> str | None:
        """Why this process can't run under its MAX_MEMORY_MB (it is over it before any job), or None.

        Asked once everything is built and the first heartbeat went through, just before the
        processors start: that size is what a fresh process always takes (measured: within 0.4 MB
        of a ready one's at its next beats, -c 10), and nothing has been fetched yet, so a refusal
        hands nothing back. The sliver a process grows by as its threads start, a cap can still
        fall into: such a process exits at its next beat, having run nothing, and its supervisor
        backs it off as a crash.
        """
        if self.max_memory_kb is None:
            return None
        kb = self.rss()
        if kb <= self.max_memory_kb:
            return None
        return (f'COGWORKER["MAX_MEMORY_MB"] {self.max_memory_mb} is below the {kb / 1024:.1f} MB (RSS) this worker '
                f"process takes before running any job: every fresh process would be over it at once. Set it above "
                f"{math.ceil(kb / 1024)} with room for what the jobs use (or leave it unset: no cap)")

    def _passed(self, reason: str, kb: int) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        self.on_over(Over(reason, kb / 1024, self.jobs, self.clock() - self.started))
