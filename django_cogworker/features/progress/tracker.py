"""One running job's progress: the latest report kept in memory, written to ``progress:<jid>`` at
most once a second.

Who makes one: ``Job.progress`` (api.py's :func:`report`) on the first report of a run, kept in
the run's ``Running.extras["progress"]`` (push/scope.py); an iterable job's loop
(features/iteration/) uses the same one. Only the job's own thread touches it.

Why throttled: a job that reports each of a million rows would pay a Redis round trip per row.
:meth:`Tracker.update` costs memory only (0.4-0.6 µs measured; ``Job.progress`` with its checks and
look-ups 1.2-1.6 µs, on the 2-vCPU dev box, Python 3.11); a write goes when a second has
passed since the last (:meth:`flush`), or rides a round trip the job makes anyway (an iterable
job's checkpoint: :meth:`queue`). The report last made is written at the run's end whatever its
timing (the hook's ``flush(force=True)``), so a bar never stops short of where the job got.

The hash (fields, all text): ``done``; ``total`` (empty: unknown); ``note``; ``updated`` (epoch of
the write); ``started`` (epoch of the job's first report ever: kept across its retries and
re-enqueues); ``eta`` (seconds left as of ``updated``, empty when unknown). Each write refreshes
its TTL (:data:`TTL`): the key outlives a job that vanished (killed and never recovered) by a day
at most; the progress hook deletes it when the job succeeds or dies for good.

The ETA is this run's rate (items since the run's first report, over the seconds since) applied to
what is left: a run resumed after a retry, or a job waiting an hour in the schedule between two
runs, doesn't count that hour as slow progress. Unknown until a run has moved past its first
report, and when the total is.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...push import payload as payloads

logger = logging.getLogger(__name__)

INTERVAL = 1.0  # seconds: at most one write per job per INTERVAL (the checkpoint's own cadence)
TTL = 86400  # seconds a ``progress:<jid>`` lives past its last write
NOTE_MAX = 200  # characters of a note kept (a longer one is clipped: a progress line, not a log)


def check(done: Any, total: Any, note: Any) -> tuple[float, float | None, str]:
    """The report ``(done, total, note)`` as kept: ValueError naming what is wrong with it.

    ``done``: a finite number >= 0 (may pass ``total``: the fraction stops at 1). ``total``: None
    (unknown), or a finite number > 0. ``note``: text, clipped to :data:`NOTE_MAX` characters (a
    lone surrogate, which UTF-8 can't carry to Redis, replaced by U+FFFD).
    """
    if isinstance(done, bool) or not isinstance(done, (int, float)) or not math.isfinite(done) or done < 0:
        raise ValueError(f"progress: done must be a finite number >= 0, got {payloads.printable(repr(done))}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, (int, float))
                              or not math.isfinite(total) or total <= 0):
        raise ValueError(f"progress: total must be None (unknown) or a finite number > 0, "
                         f"got {payloads.printable(repr(total))}")
    if not isinstance(note, str):
        raise ValueError(f"progress: note must be text (str), got {type(note).__name__}")
    note = note[:NOTE_MAX]
    if not note.isascii():
        note = note.encode("utf-8", "replace").decode("utf-8")
    return done, total, note


def number(value: float) -> str:
    """``value`` as the hash holds it: ``12`` for a whole number, else its repr (``0.25``)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Tracker:
    """One running job's progress: updated in memory, written at most once a second.

    ``clock``: the wall clock (what is written: ``updated``, ``started``, and the rate the ETA is
    read from); ``monotonic``: the interval between writes; both injected for tests.
    """

    def __init__(self, redis: RedisClient, keys: Keys, jid: str, clock: Callable[[], float] = time.time, *,
                 monotonic: Callable[[], float] = time.monotonic, ttl: int = TTL, interval: float = INTERVAL):
        self.redis = redis
        self.key = keys.progress(jid)
        self.jid = jid
        self.clock = clock
        self.monotonic = monotonic
        self.ttl = ttl
        self.interval = interval
        self.done: float | None = None  # the latest report (None: none yet)
        self.total: float | None = None
        self.note = ""
        self.unwritten = False
        self.written_at: float | None = None  # (monotonic) the last write
        self.closed = False  # the key deleted (the job succeeded or died): nothing written again
        self._first: tuple[float, float] | None = None  # (done, wall time) of this run's first report
        self._at = 0.0  # (wall) when the latest report was made
        self._failing = False  # a write failed: the next failure is logged at debug only

    def update(self, done: float, total: float | None = None, note: str = "") -> None:
        """Memory only (a few hundred ns): the latest report, validated (done >= 0; total > 0 or None)."""
        done, total, note = check(done, total, note)
        now = self.clock()
        if self._first is None:
            self._first = (done, now)
        self.done, self.total, self.note, self._at = done, total, note, now
        self.unwritten = True

    def due(self) -> bool:
        """An unwritten report, and a second since the last write."""
        return (self.unwritten and not self.closed
                and (self.written_at is None or self.monotonic() - self.written_at >= self.interval))

    def eta(self) -> float | None:
        """Seconds left at this run's rate, as of the latest report; None when it can't be told."""
        if self.total is None or self.done is None or self._first is None:
            return None
        if self.done >= self.total:
            return 0.0
        first_done, first_at = self._first
        moved, took = self.done - first_done, self._at - first_at
        if moved <= 0 or took <= 0:
            return None
        return (self.total - self.done) * took / moved

    def fields(self) -> dict[str, str]:
        """The latest report as the hash holds it (``started`` apart: written only if absent)."""
        eta = self.eta()
        return {"done": number(self.done or 0), "total": "" if self.total is None else number(self.total),
                "note": self.note, "updated": repr(self._at), "eta": "" if eta is None else f"{eta:.3f}"}

    def queue(self, pipe: Any) -> None:
        """Add the unwritten report's write (HSET + EXPIRE) to ``pipe`` (a checkpoint's pipeline);
        marks it written. No-op when nothing is unwritten."""
        if not self.unwritten or self.closed:
            return
        first_at = self._first[1] if self._first is not None else self._at
        pipe.hset(self.key, mapping=self.fields())
        pipe.hsetnx(self.key, "started", repr(first_at))  # (a run resumed keeps the job's first)
        pipe.expire(self.key, self.ttl)
        self.unwritten = False
        self.written_at = self.monotonic()

    def flush(self, force: bool = False) -> None:
        """Write the unwritten report on its own round trip if due (or ``force``); an error is
        logged, never raised into the job."""
        if not (self.due() or (force and self.unwritten and not self.closed)):
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            self.queue(pipe)
            pipe.execute()
        except Exception as exc:  # (Redis away: the job goes on; the next report writes it all)
            self.unwritten = True
            log = logger.debug if self._failing else logger.warning
            self._failing = True
            log("jid=%s: could not write its progress: %s: %s", payloads.printable(self.jid),
                payloads.error_class(exc), payloads.error_message(exc))
        else:
            if self._failing:
                logger.info("jid=%s: its progress is written again", payloads.printable(self.jid))
            self._failing = False

    def delete(self) -> None:
        """Delete ``progress:<jid>`` (the job succeeded or died for good) and write nothing more.
        Raises what Redis raises (the hook logs it)."""
        self.closed = True
        self.unwritten = False
        self.redis.delete(self.key)
