"""Cancel requests as a worker process sees them: the jobs it must not start, and those it runs that
were asked to stop.

``cancel(jid)`` (features/cancellation/cancel.py) removes a job still waiting; for one already fetched it writes a
request to the ``cancels`` hash, which every heartbeat reads (one HGETALL in the beat's pipeline,
an empty reply while nobody cancels). From then on this process:

* never starts that jid (the gate drops it at fetch, counted as cancelled);
* tells the run of that jid it was cancelled (``Job.cancelled`` turns true; a job that polls it
  between its steps stops itself), and, for a request with ``interrupt``, raises
  :class:`~django_cogworker.errors.Cancelled` in its thread as a timeout is raised
  (engine/run/timeouts.py says what that can't stop).

So a cancel reaches a running job within one HEARTBEAT_INTERVAL (or sooner when the job reads
``self.cancelled``, which asks Redis itself at most once a second). Requests older than
REQUEST_TTL are dropped by the first process that reads them, and so is an entry that no
``cancel`` wrote (not a JSON object with a finite ``at`` within REQUEST_TTL of now): logged, it
cancels nothing (:func:`read_request`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

from ...errors import Cancelled
from ...push import payload as payloads
from ...push.scope import Running
from .interrupts import Interrupt, ThreadInterrupt

logger = logging.getLogger(__name__)

REQUEST_TTL = 24 * 3600.0  # seconds a request is kept: longer than any fetch is in flight


def read_request(raw: Any, now: float) -> bool | None:
    """A stored request's ``interrupt``; None for an entry to drop: older than REQUEST_TTL, or
    garbage (:func:`_parse`)."""
    parsed = _parse(raw, now)
    return None if parsed is None or now - parsed[0] > REQUEST_TTL else parsed[1]


def _parse(raw: Any, now: float) -> tuple[float, bool] | None:
    """(at, interrupt) of a stored request; None for garbage, what ``cancel`` never writes: not
    JSON, no finite ``at``, or one more than REQUEST_TTL ahead of ``now``.

    Garbage was taken for a request made "now": it cancelled its job, and never grew old enough to
    be dropped, so every heartbeat of every process read it forever.
    """
    try:
        request = json.loads(raw)
        at, interrupt = request["at"], request.get("interrupt", False)
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            return None
        at = float(at)
    # (UnicodeDecodeError is a ValueError; RecursionError: "[[[[..."; OverflowError: an int past a float)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError):
        return None
    if not math.isfinite(at) or at - now > REQUEST_TTL:
        return None
    return at, bool(interrupt)


class Cancels:
    """This process's copy of the cancel requests, and the runs it tells of them.

    Created by the Launcher; the heartbeat thread calls ``update`` each beat, the processor threads
    ``requested`` (at fetch: a dict lookup, no lock), ``started`` and ``finished`` around each run
    (one lock each, contended only by a beat that tells a run of its request).
    """

    def __init__(self, clock: Any = time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._requests: dict[str, bool] = {}  # jid -> interrupt
        self._running: dict[str, tuple[Running, Interrupt]] = {}  # jid -> (its run, how to interrupt it)
        self._interrupted: set[str] = set()

    def requested(self, jid: Any) -> bool:
        """Whether ``jid`` has a cancel request (a dict lookup: every job pays it at fetch)."""
        return bool(self._requests) and jid in self._requests

    def started(self, jid: str, running: Running, interrupt: Interrupt | None = None) -> None:
        """``jid`` runs, on the calling thread (``interrupt``: in its task on the event loop)."""
        interrupt = interrupt if interrupt is not None else ThreadInterrupt()
        with self._lock:
            self._running[jid] = (running, interrupt)
            if jid in self._requests:
                running.cancelled = True

    def finished(self, jid: str) -> None:
        """The run ended: an interrupt sent but not yet raised is withdrawn (raised later, it would
        hit the processor's own code, not the job's). One that lands in here anyway is spent."""
        try:
            self._finish(jid)
        except Cancelled:
            self._finish(jid)

    def _finish(self, jid: str) -> None:
        with self._lock:
            entry = self._running.pop(jid, None)
            if jid in self._interrupted:
                self._interrupted.discard(jid)
                if entry is not None:
                    entry[1].withdraw()

    def update(self, stored: dict[Any, Any]) -> list[str]:
        """Take the ``cancels`` hash as read by a beat; tell the runs concerned; return the jids of
        requests older than REQUEST_TTL, for the caller to delete."""
        requests: dict[str, bool] = {}
        stale = []
        now = self.clock()
        for jid, raw in stored.items():
            jid = jid.decode() if isinstance(jid, bytes) else str(jid)
            parsed = _parse(raw, now)
            if parsed is None:
                logger.warning("the cancel request stored for jid=%s is no request (%s): dropped, its job not "
                               "cancelled", payloads.printable(jid),
                               payloads.printable(raw.decode(errors="replace") if isinstance(raw, bytes) else raw, 200))
            if parsed is None or now - parsed[0] > REQUEST_TTL:
                stale.append(jid)
                continue
            requests[jid] = parsed[1]
        with self._lock:
            self._requests = requests
            for jid, interrupting in requests.items():
                entry = self._running.get(jid)
                if entry is None:
                    continue
                running, interrupt = entry
                if not running.cancelled:
                    running.cancelled = True
                    logger.warning("jid=%s: cancel requested while it runs; asking it to stop%s",
                                   payloads.printable(jid), ", interrupting it" if interrupting else "")
                if interrupting and jid not in self._interrupted:
                    self._interrupted.add(jid)
                    interrupt.send(Cancelled)
        return stale

