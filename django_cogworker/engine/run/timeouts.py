"""Job timeouts: a job past its ``timeout`` is interrupted in its own thread, or its process replaced.

(A job on the event loop has its task cancelled instead, and JobTimeout raised from the await it
was cancelled in: interrupts.py. One that blocks the loop past its timeout is stuck as below.)

How a job is stopped: :class:`JobTimeout` is raised in the processor thread that runs it, with
CPython's ``PyThreadState_SetAsyncExc``, which takes effect at the thread's next bytecode. The
job fails with it and is filed as any failure (retry, then dead). The limits of that:

* a thread blocked in one C call (``time.sleep``, a socket read without its own timeout, a
  long C extension call) sees the exception only when the call returns;
* a job that catches BaseException (JobTimeout is one, so ``except Exception`` lets it pass)
  can ignore it;
* on CPython 3.13 (bug gh-139622, seen on 3.13.0; not on 3.11 or 3.12) the exception may skip
  the ``except`` and ``finally`` clauses of the function it lands in (those of its callers,
  the processor's among them, still run): a job's own cleanup in that one function may not
  run. The job is filed all the same.

A job still running ``grace`` seconds after its timeout was raised is **stuck**. A process
started by ``runcogworker --processes N`` then exits (code 70), and its supervisor starts
a new one: the stuck job and the others it held are recovered by the orphan rules (run again;
dead after MAX_ORPHANINGS). A single process can't be replaced from inside: it logs the stuck
job at error, once per grace period, and that processor stays busy until the job returns.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import timeout_error
from ...push import payload as payloads
from .interrupts import Interrupt, ThreadInterrupt, raise_in_thread

__all__ = ["Timeouts", "raise_in_thread", "STUCK_EXIT_CODE", "DEFAULT_GRACE"]

logger = logging.getLogger(__name__)

STUCK_EXIT_CODE = 70  # (EX_SOFTWARE) the code a process replaced for a stuck job exits with
DEFAULT_GRACE = 10.0  # seconds a job may run on after its JobTimeout before it counts as stuck


@dataclass
class _Armed:
    thread_id: int
    interrupt: Interrupt
    deadline: float
    jid: str
    timeout: float
    fired_at: float | None = None


class Timeouts:
    """Watches the jobs that have a timeout, on a thread of its own (``cogworker-timeouts``).

    Created by the Launcher (``replace_when_stuck`` when it runs under a supervisor) and
    handed to the processors, which ``arm`` it before a job with a timeout and ``disarm`` it
    when the job returns. ``start`` starts the thread, ``stop`` ends it. ``on_stuck`` (default:
    ``os._exit(STUCK_EXIT_CODE)`` when replacing) is injected for tests.
    """

    def __init__(self, *, grace: float = DEFAULT_GRACE, replace_when_stuck: bool = False,
                 on_stuck: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.grace = grace
        self.replace_when_stuck = replace_when_stuck
        self.on_stuck = on_stuck or (lambda: os._exit(STUCK_EXIT_CODE))
        self.clock = clock
        self._cond = threading.Condition()
        self._armed: dict[int, _Armed] = {}  # token -> what is watched
        self._next_token = 0
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="cogworker-timeouts", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def arm(self, timeout: float, jid: str, interrupt: Interrupt | None = None) -> int:
        """Watch the calling thread's job (``interrupt``: the job's task on the event loop) for
        ``timeout`` seconds; return the token to disarm it with."""
        ident = threading.get_ident()
        with self._cond:
            self._next_token += 1
            token = self._next_token
            self._armed[token] = _Armed(ident, interrupt if interrupt is not None else ThreadInterrupt(ident),
                                        self.clock() + timeout, jid, timeout)
            self._cond.notify()
        return token

    def rearm(self, token: int) -> None:
        """Watch the job armed with ``token`` for its whole timeout again from now (an iterable job,
        before each item: its timeout bounds one item). Nothing if it already fired: it raises."""
        with self._cond:
            armed = self._armed.get(token)
            if armed is not None and armed.fired_at is None:
                armed.deadline = self.clock() + armed.timeout  # (later only: the watcher wakes early, not late)

    def disarm(self, token: int | None) -> None:
        """The job returned (or raised): stop watching it (``None``: whatever the calling thread armed).

        When its JobTimeout was already sent but not yet raised (the job returned just then), it
        is withdrawn here: raised later it would hit the processor's own code, not the job's.
        Called from the thread that armed it, inside the code that files a job's failure.
        """
        with self._cond:
            if token is None:
                ident = threading.get_ident()
                # (a thread's own: the loop's thread arms one per job on it, each disarmed by its token)
                tokens = [t for t, armed in self._armed.items()
                          if armed.thread_id == ident and isinstance(armed.interrupt, ThreadInterrupt)]
            else:
                tokens = [token]
            for armed in [self._armed.pop(t, None) for t in tokens]:
                if armed is not None and armed.fired_at is not None:
                    armed.interrupt.withdraw()

    def _run(self) -> None:
        while True:
            try:
                with self._cond:
                    if self._stopping:
                        return
                    self._cond.wait(self._check(self.clock()))
            except Exception:  # (a bug here must not end the watch)
                logger.exception("timeout watch failed; continuing")
                time.sleep(1.0)

    def _check(self, now: float) -> float | None:
        """Fire what is due and report what is stuck (lock held); return seconds until the next due."""
        wait: float | None = None
        for armed in self._armed.values():
            if armed.fired_at is None and now >= armed.deadline:
                armed.fired_at = now
                logger.warning("jid=%s ran past its timeout of %ss: raising JobTimeout in its %s",
                               payloads.printable(armed.jid), armed.timeout,
                               "thread" if isinstance(armed.interrupt, ThreadInterrupt) else "task")
                armed.interrupt.send(timeout_error(armed.timeout))
            if armed.fired_at is not None and now >= armed.fired_at + self.grace:
                self._stuck(armed, now)
            due = armed.deadline if armed.fired_at is None else armed.fired_at + self.grace
            wait = due - now if wait is None else min(wait, due - now)
        return None if wait is None else max(wait, 0.01)

    def _stuck(self, armed: _Armed, now: float) -> None:
        late = now - armed.deadline
        if self.replace_when_stuck:
            logger.error("jid=%s is still running %.0fs past its timeout, ignoring JobTimeout: exiting so the "
                         "supervisor replaces this process (its jobs follow the orphan rules)",
                         payloads.printable(armed.jid), late)
            self.on_stuck()
            return
        logger.error("jid=%s is still running %.0fs past its timeout, ignoring JobTimeout (a blocking C call, "
                     "or it catches BaseException); a thread can't be killed: its processor stays busy until it "
                     "returns (under --processes the process would be replaced)", payloads.printable(armed.jid), late)
        armed.fired_at = now  # (logged again after another grace period)
