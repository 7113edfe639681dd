"""The supervisor of ``runcogworker --processes N``: keeps N worker processes running, and rolls them.

It exists so one command (one systemd unit, one container) uses every CPU: a Python process runs
one job's Python at a time, however many threads it has. Its children are described, and
started, by :mod:`.children`; they report to it through :mod:`.report`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable

from ...errors import ConfigError
from .caps import REPLACE_EXIT, Then, after_exit
from .children import RETIRE, Child, ChildSpec, Slot, describe_exit, logical_cwd, run_forked
from .health import Health, HealthServer, fleet_verdict
from .report import BEAT, QUIET, READY, UNREADY, WORKED, split_refusal

__all__ = ["Slot", "Supervisor", "describe_exit"]

logger = logging.getLogger(__name__)

# Signals the supervisor acts on; blocked around a fork so none lands in a child before it is ready.
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGHUP, signal.SIGCHLD)


class Supervisor:
    """Starts ``processes`` workers, restarts those that die, rolls them on HUP, and passes signals on.

    Created by ``runcogworker`` after Django is set up and the jobs are imported, and before any
    Redis connection or thread exists in the process: a forked child inherits the parent's sockets
    and a thread's held locks, neither of which is safe to share. ``run_child(spec)`` is what a
    forked child runs: it builds its own Redis client and Launcher and returns the exit code, which
    the child exits with (``os._exit``: nothing of the parent's is torn down twice).

    ``run`` blocks on the main thread, the only thread here. It starts every slot, then loops:
    signal handlers only record the signal (the self-pipe of ``signal.set_wakeup_fd`` wakes the
    loop), which also reads the children's reports and answers the health probes (never waiting
    on a client: health.py); it reaps exited children with ``waitpid(-1, WNOHANG)``. One that
    crashed is restarted after a backoff (``backoff_min`` doubling to ``backoff_max``, back to
    ``backoff_min`` once a child lived ``stable_after`` seconds), so a crash loop doesn't spin,
    whatever the exit; only one with REPLACE_EXIT (over a cap) after it ran a job is replaced at
    once, so the host keeps its N processes; a refusal before any was ready stops it
    (``caps.after_exit``; ``run`` then raises ConfigError).

    * TERM / INT: forward TERM to every child, wait up to ``shutdown_timeout`` + ``stop_grace`` for
      them to drain and exit, SIGKILL what is left, return 0; a second one forwards a second TERM
      (each child hands its running jobs back at once). A child ignores INT (its TERM comes from here);
    * TSTP: forward it (each child quiets); children that die from then on are not restarted;
    * TTIN: log the children, forward it (each child logs its threads);
    * HUP: a rolling restart. A new generation: each slot gets a fresh process (a new import of
      the code: ``command`` run again), and once it is ready its older process is retired (RETIRE:
      it takes nothing new, finishes its running jobs within ROLLING_TIMEOUT, or as long as they
      take, and exits). Until the fresh one is ready the old one keeps working, so a deploy that
      doesn't start (an import error) costs nothing but log lines. A HUP during a roll starts
      one more generation: the newest code wins; processes already retiring go on finishing
      their jobs; a fresh one not yet ready is stopped (it has taken nothing), and the process
      that still works in its slot retires once the newest is ready.

    Each child asks the kernel for a TERM when the supervisor dies (Linux ``PR_SET_PDEATHSIG``;
    elsewhere a thread watching ``getppid``), so a kill -9 of the supervisor leaves no worker
    behind: each drains as on any TERM.
    """

    def __init__(self, processes: int, run_child: Callable[[ChildSpec], int], *, shutdown_timeout: float,
                 stop_grace: float = 5.0, backoff_min: float = 1.0, backoff_max: float = 30.0,
                 stable_after: float = 60.0, clock: Callable[[], float] = time.monotonic, identity: str = "",
                 command: list[str] | None = None, heartbeat_interval: float = 5.0,
                 health: HealthServer | None = None):
        self.slots = [Slot(index, delay=backoff_min) for index in range(processes)]
        self.run_child = run_child
        self.shutdown_timeout, self.stop_grace = shutdown_timeout, stop_grace
        self.backoff_min, self.backoff_max, self.stable_after = backoff_min, backoff_max, stable_after
        self.clock = clock
        self.identity, self.command, self.workdir = identity, command, logical_cwd()
        self.heartbeat_interval = heartbeat_interval
        self.health = health
        self.pid = os.getpid()
        self.generation = 0
        self.quiet = self.stopping = False
        self.children: dict[int, Child] = {}
        self.any_ready = False  # (a child of this supervisor was ready: a refusal is no longer the config's)
        self.refusal: str | None = None  # why a child refused to run, which stopped this supervisor
        self._cut_off: set[int] = set()  # children whose fetcher fails (UNREADY since their last READY)
        self._pending: list[int] = []
        self._pipe: tuple[int, int] | None = None

    # -- the main loop ---------------------------------------------------------------------

    def run(self) -> int:
        """Start the children and supervise them until a TERM or INT; return the exit code."""
        self._install()
        if self.health is not None:
            self.health.state = self.health_state
        try:
            for slot in self.slots:
                self._spawn(slot)
            while not self.stopping:
                due = [s.restart_at for s in self.slots if s.restart_at is not None]
                self._wait(min([1.0, *(max(0.0, t - self.clock()) for t in due)]))
                self._handle_signals()
                self._reap()
                self._restart_due()
            code = self._stop()
            if self.refusal is not None:
                raise ConfigError([self.refusal])
            return code
        finally:
            self._uninstall()

    def _stop(self) -> int:
        logger.info("stopping: TERM to %d worker process(es), waiting up to %.1fs (a second INT or TERM: they "
                    "hand running jobs back now)", len(self.children), self.shutdown_timeout + self.stop_grace)
        self._forward(signal.SIGTERM)
        deadline = self.clock() + self.shutdown_timeout + self.stop_grace
        while self.children and self.clock() < deadline:
            self._wait(min(0.5, max(0.0, deadline - self.clock())))
            self._handle_signals()
            self._reap()
        for pid, child in list(self.children.items()):
            logger.warning("%s still running after %.1fs: SIGKILL", child.name(),
                           self.shutdown_timeout + self.stop_grace)
            self._kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._forget(child)
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
                logger.info("worker processes (generation %d now): %s", self.generation, ", ".join(
                    f"{c.index}=pid {c.pid} gen {c.generation}" + (" retiring" if c.retiring else "")
                    for c in sorted(self.children.values(), key=lambda c: (c.index, c.generation))) or "none")
                self._forward(signal.SIGTTIN)
            elif signum == signal.SIGHUP:
                self._roll()

    # -- rolling restarts --------------------------------------------------------------------

    def _roll(self) -> None:
        if self.stopping or self.quiet:
            logger.warning("HUP ignored: %s", "stopping" if self.stopping else "quiet (TSTP): fresh processes would "
                                                                              "fetch")
            return
        if self.command is None:
            logger.error("HUP ignored: this supervisor wasn't started by a runcogworker command line, which a fresh "
                         "process would run again")
            return
        self.generation += 1
        logger.info("rolling restart: generation %d, %d fresh process(es); each older one retires once the fresh one "
                    "of its slot is ready", self.generation, len(self.slots))
        for slot in self.slots:
            if slot.current is not None and not slot.current.ready:
                self._retire(slot.current)  # (superseded before it was ready: it has taken nothing)
            slot.restart_at, slot.delay = None, self.backoff_min
            self._spawn(slot)

    def _ready(self, child: Child) -> None:
        slot = self.slots[child.index]
        logger.info("%s ready", child.name())
        self.any_ready = True
        if child is not slot.current:
            return
        for other in list(self.children.values()):
            if other.index == child.index and other is not child and not other.retiring:
                self._retire(other)

    def _retire(self, child: Child) -> None:
        child.retiring = True
        if child.ready:
            logger.info("retiring %s: it takes nothing new, finishes its running jobs and exits", child.name())
            self._kill(child.pid, RETIRE)
        else:
            logger.info("stopping %s: superseded before it was ready", child.name())
            self._kill(child.pid, signal.SIGTERM)

    # -- the children ------------------------------------------------------------------------

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.get(pid)
            if child is None:
                continue
            self._read_report(child)  # (what it said last: a READY that came with its exit)
            self._forget(child)
            slot = self.slots[child.index]
            lived = self.clock() - child.started_at
            how = describe_exit(status)
            if child is not slot.current:
                logger.info("%s retired: %s after %.1fs", child.name(), how, lived)
                continue
            slot.current = None
            if self.stopping:
                logger.info("%s %s", child.name(), how)
                continue
            if self.quiet:
                logger.warning("%s %s after %.1fs; not restarted: quiet", child.name(), how, lived)
                continue
            then = after_exit(os.waitstatus_to_exitcode(status), child.worked, self.any_ready)
            if child.refusal is not None:
                logger.error("%s refused to run: %s", child.name(), child.refusal)
            if then is Then.STOP:
                logger.error("%s %s before any was ready: stopping, as each fresh one would refuse", child.name(), how)
                self.refusal = child.refusal or f"{child.name()} refused to run ({how})"
                self.stopping = True
                for other in self.slots:
                    other.restart_at = None
                continue
            if then is Then.AT_ONCE:
                logger.warning("%s exited to be replaced (code %d: over a cap, its figures logged above) after "
                               "%.1fs: starting a fresh one now", child.name(), REPLACE_EXIT, lived)
                self._spawn(slot)
                continue
            if lived >= self.stable_after:
                slot.delay = self.backoff_min
            logger.warning("%s %s after %.1fs; restarting it in %.1fs", child.name(), how, lived, slot.delay)
            slot.back_off(self.clock(), self.backoff_max)

    def _forget(self, child: Child) -> None:
        self.children.pop(child.pid, None)
        self._cut_off.discard(child.pid)
        if child.report is not None:
            os.close(child.report)
            child.report = None

    def _restart_due(self) -> None:
        now = self.clock()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                slot.restart_at = None
                self._spawn(slot)

    def _forward(self, signum: int) -> None:
        for pid in list(self.children):
            self._kill(pid, signum)

    @staticmethod
    def _kill(pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # exited since the last reap: the next reap sees it

    # -- health ------------------------------------------------------------------------------

    def health_state(self) -> Health:
        """What /healthz and /readyz answer: health.fleet_verdict of the children as reported."""
        return fleet_verdict(self.children.values(), [s.current for s in self.slots], self._cut_off,
                             now=self.clock(), interval=self.heartbeat_interval, quiet=self.quiet,
                             stopping=self.stopping, generation=self.generation)

    # -- signals, reports and the self-pipe -------------------------------------------------

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
        """Sleep until a signal, a report or a probe arrives, or ``timeout`` passes; handle the last two."""
        assert self._pipe is not None
        reports = {c.report: c for c in self.children.values() if c.report is not None}
        watched = [self._pipe[0], *reports]
        if self.health is not None:
            watched.append(self.health.fileno())
            timeout = min(timeout, self.health.next_deadline())
        readable, _, _ = select.select(watched, [], [], timeout)
        for ready in readable:
            if ready in reports:
                self._read_report(reports[ready])
            elif ready == self._pipe[0]:
                with contextlib.suppress(BlockingIOError):
                    while os.read(ready, 512):
                        pass
        if self.health is not None:
            self.health.serve()  # (what arrived, and the requests out of time: never waits)

    def _read_report(self, child: Child) -> None:
        if child.report is None:
            return
        try:
            data = os.read(child.report, 4096)
        except BlockingIOError:
            return
        if not data:  # (EOF: it exited, or execs no more: its reap follows)
            os.close(child.report)
            child.report = None
            return
        data, refusal = split_refusal(data)
        child.refusal = refusal or child.refusal
        child.worked = child.worked or WORKED in data
        if BEAT in data:
            child.last_beat = self.clock()
        if QUIET in data:
            child.quiet = True
        if UNREADY in data and data.rfind(UNREADY) > data.rfind(READY):
            self._cut_off.add(child.pid)
        elif READY in data:
            self._cut_off.discard(child.pid)
        if READY in data and not child.ready:
            child.ready = True
            self._ready(child)

    # -- starting a child --------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        spec = ChildSpec(self.identity, slot.index, self.generation, -1)
        read, spec.report_fd = os.pipe()
        # Blocked across the fork: a TERM meant for the new child waits until it can act on it.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(spec, read)  # never returns
        except OSError as exc:
            # (EAGAIN, ENOMEM: out of processes or memory for now) Raising would end the
            # supervisor and, with it, every worker still running.
            logger.error("could not fork worker process %d: %s; trying again in %.1fs", slot.index, exc, slot.delay)
            os.close(read)
            os.close(spec.report_fd)
            slot.back_off(self.clock(), self.backoff_max)
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        os.close(spec.report_fd)
        os.set_blocking(read, False)
        child = Child(pid, slot.index, self.generation, self.clock(), read)
        slot.current = self.children[pid] = child
        logger.info("started %s%s", child.name(), ": a fresh import" if self.generation else "")

    def _child(self, spec: ChildSpec, read: int) -> None:
        def detach() -> None:  # (what is the supervisor's: its self-pipe, the other children's, the probes')
            signal.set_wakeup_fd(-1)
            self._close_pipe()
            os.close(read)
            for other in self.children.values():
                if other.report is not None:
                    os.close(other.report)
            if self.health is not None:
                self.health.discard()

        fresh = (self.command, self.workdir) if spec.generation and self.command is not None else None
        run_forked(spec, detach, HANDLED, self.pid, self.run_child, fresh)  # (never returns)
