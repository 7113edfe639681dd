"""The worker processes of a supervisor: what it knows of each, and how each is started.

A child of generation 0 is forked from the supervisor, which imported Django and the jobs once,
before any thread or connection existed: it starts in a moment and shares the imported pages. A
child of a later generation (after a SIGHUP: a rolling restart) is a fork that at once runs the
command line again (``execv``): a fresh interpreter that imports the code as it is on disk now,
which is the point of the restart; it runs ``runcogworker --supervised ...`` (a lone worker that
knows its supervisor). Either way its life in the forked process is ``run_forked``'s. Each of the
N places a child fills is a ``Slot``, which keeps the crash backoff of its successive children.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

from ...errors import ConfigError
from .caps import REFUSE_EXIT

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The signal a supervisor sends a child to retire it (a rolling restart). Not HUP: a terminal's
# hangup reaches every process of its group, and each child would retire on its own.
RETIRE = signal.SIGUSR1
# The option of runcogworker that makes it a supervised child (hidden: the supervisor adds it).
SUPERVISED_OPTION = "--supervised"


@dataclasses.dataclass
class ChildSpec:
    """What a child is told: its place, its generation, the pipe to report on (report.py)."""

    supervisor: str  # the supervisor's identity
    index: int
    generation: int
    report_fd: int


@dataclasses.dataclass
class Child:
    """One worker process as its supervisor sees it (its clock: monotonic seconds)."""

    pid: int
    index: int
    generation: int
    started_at: float
    report: int | None  # the read end of its report pipe; None once at EOF
    ready: bool = False
    quiet: bool = False
    retiring: bool = False
    last_beat: float | None = None
    worked: bool = False  # it started a job (report.WORKED)
    refusal: str | None = None  # why it refused to run (report.REFUSED)

    def name(self) -> str:
        return f"worker process {self.index} (pid {self.pid}, generation {self.generation})"


@dataclasses.dataclass
class Slot:
    """One of the N places a worker process fills: its index is kept across restarts and rolls."""

    index: int
    current: Child | None = None  # its newest process; None while a restart is due
    delay: float = 0.0  # the wait before the next restart (backoff)
    restart_at: float | None = None

    def back_off(self, now: float, longest: float) -> None:
        """Start the next one ``delay`` from ``now``; double the delay after it, up to ``longest``."""
        self.restart_at = now + self.delay
        self.delay = min(self.delay * 2, longest)


def child_signals() -> None:
    """In a new child, before it runs or execs: default dispositions until the Launcher installs its own.

    TERM and the retire signal act (by default: die) before that; TSTP and TTIN are ignored (their
    default stops the process); INT and HUP too: a Ctrl-C or a hangup reaches the whole group, and
    the supervisor passes on what it means. (Ignored dispositions survive an ``execv``.)
    """
    for signum in (signal.SIGTERM, signal.SIGCHLD, RETIRE):
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def fresh_command() -> list[str] | None:
    """The command line that started this process, to run again for a fresh child; None if it can't be.

    ``sys.orig_argv`` keeps ``-m django`` and interpreter options; the interpreter is named by
    ``sys.executable``. A supervisor started some other way (``call_command``) can't roll.
    """
    argv = list(getattr(sys, "orig_argv", ()))
    if "runcogworker" not in argv[1:] or not sys.executable:
        return None
    return [sys.executable, *argv[1:]]


def logical_cwd() -> str:
    """The working directory as the shell named it ($PWD), if it is this one; else the real path.

    A deploy that switches a symlink (``current -> releases/42``) changes what $PWD names, not the
    directory this process sits in: a fresh child changes to $PWD first, and so to the new release.
    """
    pwd = os.environ.get("PWD")
    try:
        if pwd and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()


def run_forked(spec: ChildSpec, detach: Callable[[], None], blocked: Iterable[int], parent_pid: int,
               run: Callable[[ChildSpec], int], fresh: tuple[list[str], str] | None) -> NoReturn:
    """Be the worker of ``spec`` in a process just forked from its supervisor; end here (``os._exit``).

    ``detach`` closes what is the supervisor's; the signal dispositions are then reset before the
    ``blocked`` signals (blocked across the fork) are let in, so one meant for this child acts on
    it. A child of a later generation runs the command line afresh (``fresh``: the command and its
    directory). Whatever happens, it never returns into the supervisor's loop, nor tears down
    anything of the parent's (``os._exit``).
    """
    code = 1
    try:
        detach()
        child_signals()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        die_with_parent(parent_pid)
        if fresh is not None:
            exec_fresh(*fresh, spec)  # (returns only if it failed: raises)
        code = run(spec)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except ConfigError:  # (the Launcher refused to run: it said why on the report pipe)
        code = REFUSE_EXIT
    except BaseException:
        logger.exception("worker process %d failed", spec.index)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # (closed: it must not keep the child alive)
                stream.flush()
        os._exit(code)


def exec_fresh(command: list[str], workdir: str, spec: ChildSpec) -> None:
    """Replace this (forked) process with a fresh ``runcogworker`` for ``spec``; returns only on failure."""
    os.set_inheritable(spec.report_fd, True)
    try:
        os.chdir(workdir)
    except OSError as exc:
        logger.warning("could not change to %s (%s): starting in %s", workdir, exc, os.getcwd())
    os.execv(command[0], [*command, SUPERVISED_OPTION, spec.supervisor, str(spec.index), str(spec.generation),
                          str(spec.report_fd)])


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
    """Have this process get a TERM when the supervisor ``parent_pid`` dies (even by kill -9)."""
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
