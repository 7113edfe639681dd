"""The ledger: this process's in-memory record of the jobs it holds, handed over or running.

Kept in memory on purpose: it is trusted over anything in Redis, which may be
what is failing, or may have lost its last writes in a failover. The
reconcile (what sits on our in-progress list that we don't know of?), the
workers hash and ``busy`` of each beat, and the periodic lock renewals all
read it.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable

from .contract import Unit


class Ledger:
    """What this process's threads hold: payloads handed over, payloads running, and by which thread.

    Created by the Manager. Written by the fetcher thread (``hand``), the
    processor threads (``job_started``, ``unit_dropped``, ``job_finished``)
    and the main thread at stop (``forget_unstarted``); read by the heartbeat
    thread. No thread of its own, nothing to start or stop. Finished jobs not
    yet settled are the Settler's to record, not this one's.

    One lock, for the units handed over: a job costs one acquisition on the
    processor's path (at its start). What runs is one dict entry per thread,
    set and removed by that thread alone (each a single operation under the
    GIL) and copied whole by readers: a job's end takes no lock.
    """

    def __init__(self, on_start: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        # Told of each job's start, on its processor's thread (the process's caps: engine/process/caps.py).
        self.on_start = on_start
        # raw payload -> copies handed to the processors, not yet started
        self._handed: collections.Counter[bytes] = collections.Counter()
        # thread ident (a job on the event loop: its place's name, "cogworker-loop-<n>") -> (thread or
        # place name, unit, payload, started at epoch), for the workers hash
        self._by_thread: dict[int | str, tuple[str, Unit, dict, float]] = {}

    def hand(self, units: list[Unit]) -> None:
        """Record ``units`` as handed to the processors (before they can start)."""
        with self._lock:
            for unit in units:
                self._handed[unit.raw] += 1

    def job_started(self, unit: Unit, payload: dict, place: str | None = None) -> None:
        """``unit`` starts, on the calling thread (``place``: on the event loop, in that place)."""
        with self._lock:
            self._forget_handed(unit.raw)
        # By ident, not name: a job may rename its thread, and must not leave a phantom run behind.
        # (A reader may count it in both or in neither for an instant: harmless, the reconcile puts
        # back only what it found unknown twice, RECONCILE_INTERVAL apart.)
        if place is not None:
            self._by_thread[place] = (place, unit, payload, time.time())
        else:
            self._by_thread[threading.get_ident()] = (threading.current_thread().name, unit, payload, time.time())
        if self.on_start is not None:
            self.on_start()

    def unit_dropped(self, unit: Unit) -> None:
        """Forget a handed-over unit that never started (its payload couldn't be run; it is settled)."""
        with self._lock:
            self._forget_handed(unit.raw)

    def forget_unstarted(self, units: list[Unit]) -> None:
        """Forget units never taken by a processor (at stop: they are handed back)."""
        with self._lock:
            for unit in units:
                self._forget_handed(unit.raw)

    def _forget_handed(self, raw: bytes) -> None:
        if self._handed[raw] > 1:
            self._handed[raw] -= 1
        else:
            self._handed.pop(raw, None)

    def job_finished(self, unit: Unit, place: str | None = None) -> None:
        self._by_thread.pop(threading.get_ident() if place is None else place, None)

    def _runs(self) -> list[tuple[str, Unit, dict, float]]:
        return list(self._by_thread.values())  # (one C call under the GIL: a consistent copy)

    def running_jobs(self) -> list[bytes]:
        """The payloads running now (each once, however many copies run)."""
        return list(dict.fromkeys(unit.raw for _name, unit, _payload, _started in self._runs()))

    @property
    def busy(self) -> int:
        """How many jobs run now (on processor threads and on the event loop)."""
        return len(self._by_thread)

    def workers_snapshot(self) -> dict[str, str]:
        """thread name -> JSON of what it runs, for ``workers:<identity>``."""
        items = list(self._by_thread.items())
        return {name: json.dumps({"queue": unit.queue, "payload": unit.raw.decode("utf-8", "replace"),
                                  "run_at": started})
                for _ident, (name, unit, _payload, started) in items}

    def held(self) -> collections.Counter[bytes]:
        """Every payload handed over or running, counted by copies."""
        with self._lock:
            known = collections.Counter(self._handed)
        known.update(unit.raw for _name, unit, _payload, _started in self._runs())
        return known
