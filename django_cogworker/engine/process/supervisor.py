"""The supervisor of ``runcogworker --processes N``: forks N worker processes and keeps them running.

It exists so one command (one systemd unit, one container) uses every CPU: a
Python process runs one job's Python at a time, however many threads it has.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Signals the supervisor acts on; blocked around a fork so none lands in a child before it is ready.
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGCHLD)


@dataclasses.dataclass
class Slot:
    """One of the N places a worker process fills: its index is kept across restarts."""

    index: int
    pid: int | None = None
    started_at: float = 0.0
    delay: float = 0.0  # the wait before the next restart (backoff)
    restart_at: float | None = None


class Supervisor:
    """Forks ``processes`` workers, restarts those that die, and passes signals on to them.

    Created by ``runcogworker`` after Django is set up and the jobs are imported,
    and before any Redis connection or thread exists in the process: a forked
    child inherits the parent's sockets and a thread's held locks, neither of
    which is safe to share. ``run_child(index)`` is what a child runs: it builds
    its own Redis client and Launcher (its own identity, heartbeat and
    in-progress list) and returns the exit code, which the child exits with
    (``os._exit``: nothing of the parent's is torn down twice).

    ``run`` blocks on the main thread, the only thread here. It forks every
    slot, then loops: signal handlers only record the signal (the self-pipe of
    ``signal.set_wakeup_fd`` wakes the loop); the loop reaps exited children
    with ``waitpid(-1, WNOHANG)`` and restarts them after a backoff (``backoff_min``
    doubling to ``backoff_max``, back to ``backoff_min`` once a child lived
    ``stable_after`` seconds), so a crash loop doesn't spin.

    * TERM / INT: forward TERM to every child, wait up to ``shutdown_timeout`` +
      ``stop_grace`` for them to drain and exit, SIGKILL what is left, return 0;
      a second one forwards a second TERM (each child hands its running jobs
      back at once). A child ignores INT (its TERM comes from here);
    * TSTP: forward it (each child quiets); children that die from then on are
      not restarted (they would fetch again);
    * TTIN: forward it (each child logs its threads).

    Each child asks the kernel for a TERM when the supervisor dies (Linux
    ``PR_SET_PDEATHSIG``; elsewhere a thread watching ``getppid``), so a kill -9
    of the supervisor leaves no worker behind: each drains as on any TERM.
    """

    def __init__(self, processes: int, run_child: Callable[[int], int], *, shutdown_timeout: float,
                 stop_grace: float = 5.0, backoff_min: float = 1.0, backoff_max: float = 30.0,
                 stable_after: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.slots = [Slot(index, delay=backoff_min) for index in range(processes)]
        self.run_child = run_child
        self.shutdown_timeout, self.stop_grace = shutdown_timeout, stop_grace
        self.backoff_min, self.backoff_max, self.stable_after = backoff_min, backoff_max, stable_after
        self.clock = clock
        self.pid = os.getpid()
        self.quiet = self.stopping = False
        self._pending: list[int] = []
        self._by_pid: dict[int, Slot] = {}
        self._pipe: tuple[int, int] | None = None

    # -- the main loop ---------------------------------------------------------------------

    def run(self) -> int:
        """Fork the children and supervise them until a TERM or INT; return the exit code."""
        self._install()
        try:
            for slot in self.slots:
                self._spawn(slot)
            while not self.stopping:
                due = [s.restart_at for s in self.slots if s.restart_at is not None]
                self._wait(min([1.0, *(max(0.0, t - self.clock()) for t in due)]))
                self._handle_signals()
                self._reap()
                self._restart_due()
            return self._stop()
        finally:
            self._uninstall()

    def _stop(self) -> int:
        logger.info("stopping: TERM to %d worker process(es), waiting up to %.1fs (a second INT or TERM: they "
                    "hand running jobs back now)", len(self._by_pid), self.shutdown_timeout + self.stop_grace)
        self._forward(signal.SIGTERM)
        deadline = self.clock() + self.shutdown_timeout + self.stop_grace
        while self._by_pid and self.clock() < deadline:
            self._wait(min(0.5, max(0.0, deadline - self.clock())))
            self._handle_signals()
            self._reap()
        for pid, slot in list(self._by_pid.items()):
            logger.warning("worker process %d (pid %d) still running after %.1fs: SIGKILL", slot.index, pid,
                           self.shutdown_timeout + self.stop_grace)
            self._kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self._by_pid.clear()
        logger.info("stopped")
        return 0

    def _handle_signals(self) -> None:
        pending, self._pending = self._pending, []
        for signum in pending:
            if signum in (signal.SIGTERM, signal.SIGINT):
                if self.stopping:
                    logger.warning("stop signal repeated: worker processes hand their running jobs back now")
                    self._forward(signal.SIGTERM)  # (their second TERM: see Launcher)
                    continue
                self.stopping = True
                for slot in self.slots:
                    slot.restart_at = None
            elif signum == signal.SIGTSTP:
                self.quiet = True
                self._forward(signal.SIGTSTP)
            elif signum == signal.SIGTTIN:
                logger.info("worker processes: %s", ", ".join(
                    f"{s.index}=pid {s.pid}" if s.pid else f"{s.index}=restarting" for s in self.slots))
                self._forward(signal.SIGTTIN)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self._by_pid.pop(pid, None)
            if slot is None:
                continue
            slot.pid = None
            lived = self.clock() - slot.started_at
            how = describe_exit(status)
            if self.stopping:
                logger.info("worker process %d (pid %d) %s", slot.index, pid, how)
                continue
            if self.quiet:
                logger.warning("worker process %d (pid %d) %s after %.1fs; not restarted: quiet",
                               slot.index, pid, how, lived)
                continue
            if lived >= self.stable_after:
                slot.delay = self.backoff_min
            logger.warning("worker process %d (pid %d) %s after %.1fs; restarting it in %.1fs",
                           slot.index, pid, how, lived, slot.delay)
            self._back_off(slot)

    def _back_off(self, slot: Slot) -> None:
        slot.restart_at = self.clock() + slot.delay
        slot.delay = min(slot.delay * 2, self.backoff_max)

    def _restart_due(self) -> None:
        now = self.clock()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                slot.restart_at = None
                self._spawn(slot)

    def _forward(self, signum: int) -> None:
        for pid in list(self._by_pid):
            self._kill(pid, signum)

    @staticmethod
    def _kill(pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # exited since the last reap: the next reap sees it

    # -- signals and the self-pipe ---------------------------------------------------------

    def _install(self) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for signum in HANDLED:
            signal.signal(signum, self._record)

    def _record(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:  # (a SIGCHLD only has to wake the loop: the wakeup fd did that)
            self._pending.append(signum)

    def _uninstall(self) -> None:
        signal.set_wakeup_fd(-1)
        for signum in HANDLED:
            signal.signal(signum, signal.SIG_DFL)
        self._close_pipe()

    def _close_pipe(self) -> None:
        for fd in self._pipe or ():
            os.close(fd)
        self._pipe = None

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal arrives or ``timeout`` passes; empty the self-pipe."""
        assert self._pipe is not None
        readable, _, _ = select.select([self._pipe[0]], [], [], timeout)
        if readable:
            try:
                while os.read(self._pipe[0], 512):
                    pass
            except BlockingIOError:
                pass

    # -- the child -------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        # Blocked across the fork: a TERM meant for the new child waits until it can act on it.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(slot.index)  # never returns
        except OSError as exc:
            # (EAGAIN, ENOMEM: out of processes or memory for now) Raising would end the
            # supervisor and, with it, every worker still running.
            logger.error("could not fork worker process %d: %s; trying again in %.1fs", slot.index, exc, slot.delay)
            self._back_off(slot)
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        slot.pid, slot.started_at = pid, self.clock()
        self._by_pid[pid] = slot
        logger.info("started worker process %d: pid %d", slot.index, pid)

    def _child(self, index: int) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            self._close_pipe()
            for signum in (signal.SIGTERM, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)  # until the Launcher installs its own: die
            for signum in (signal.SIGTSTP, signal.SIGTTIN):
                signal.signal(signum, signal.SIG_IGN)  # (their default stops the process)
            # (A Ctrl-C reaches the whole group: with our forwarded TERM, it counted as two stops.)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
            die_with_parent(self.pid)
            code = self.run_child(index)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            logger.exception("worker process %d failed", index)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):  # (closed: it must not keep the child alive)
                    stream.flush()
            os._exit(code)


def describe_exit(status: int) -> str:
    """"exited with code 3" or "killed by SIGKILL", from a waitpid status."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def die_with_parent(parent_pid: int) -> None:
    """Have this forked process get a TERM when the supervisor ``parent_pid`` dies (even by kill -9)."""
    if _set_pdeathsig(signal.SIGTERM):
        if os.getppid() != parent_pid:  # it died between the fork and the prctl: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)
        return
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="cogworker-parent-watch", daemon=True).start()


def _set_pdeathsig(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Where prctl isn't there: poll for the reparenting that the supervisor's death causes."""
    while os.getppid() == parent_pid:
        time.sleep(interval)
    logger.warning("supervisor pid %d is gone: stopping", parent_pid)
    os.kill(os.getpid(), signal.SIGTERM)
