"""The chores that follow each heartbeat, on a thread of their own so the beat never waits on them.

A chore used to run on the heartbeat's thread, after the beat's writes and before the next beat.
One that took 40 s (a feature's slow Redis call, a lock) held the beats that long: past
ORPHAN_THRESHOLD another process took this one for dead and requeued the jobs it was running,
which then ran twice; and one slow on the first beat delayed the process's start (and its
readiness) as long. The beat now only pokes the chores; each group runs on its own thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from ..loops import LoopThread, Watchdog, run_each

logger = logging.getLogger(__name__)

Chore = tuple[str, Callable[[], object]]


class Chores(LoopThread):
    """Runs its ``chores`` once after each good beat, on its own daemon thread.

    Created by the Heartbeat, one per group: the core's (stats, pending settlements, the
    registry's pruning, the launcher's lock renewals and reconcile) and the features' (whose
    work this package doesn't know: one slow there never holds the core's back). ``poke``
    (the heartbeat's thread, after a good beat) asks for a round; pokes while a round runs make
    one more round after it, not one each, so a slow chore skips beats instead of queueing
    them. ``start`` and ``stop`` are LoopThread's; ``run_round`` runs one round on the caller's
    thread (what a test or the shutdown calls). A chore that fails is logged and the next one
    runs; a Redis outage ends the round, logged once by the watchdog, and the next poke retries.
    """

    def __init__(self, name: str, chores: Sequence[Chore]):
        self.chores = tuple(chores)
        self._poked = threading.Event()
        self._init_thread(name)

    def poke(self) -> None:
        self._poked.set()

    def run_round(self) -> None:
        run_each(self.chores, "heartbeat chore %s failed", log=logger)

    def _run(self) -> None:
        watchdog = Watchdog(self._thread.name, self.stop_event)
        while True:
            self._poked.wait()
            if self.stop_event.is_set():
                return
            self._poked.clear()
            watchdog.run_step(self.run_round)

    def ask_stop(self) -> None:
        """End the thread after its round (at once if it waits for a poke); no wait for it."""
        self.stop_event.set()
        self._poked.set()

    def stop(self) -> None:
        self.ask_stop()
        super().stop()
