"""Progress as a job reports it (``Job.progress``) and as everyone else reads it (``get_progress``,
the admin's busy page, ``cogworker busy --json``, a task's result).

Reading: :func:`get_progress` (one job) and :func:`read_many` (the busy page's rows: one pipeline
for all of them, never a round trip per row) return a :class:`Progress`, or None for a job that
reported none, or whose report is gone (it succeeded, or died for good).

Reporting: :func:`report` is ``Job.progress`` (declaration.py serves it). In a worker's run it
updates the run's :class:`~.tracker.Tracker` (:func:`current`, made on the run's first report) and
writes it if a second has passed since its last write. Under the test helpers (``cogworker_fake``,
``cogworker_inline``) each report is recorded, never written: ``jobs.progress(jid)`` lists them.
Outside a run (a job made by hand, ``MyJob().perform()``) it checks its values and does nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...push import scope as _scope
from .tracker import Tracker, check

logger = logging.getLogger(__name__)

NAME = "progress"  # its place in a run's ``Running.extras``


@dataclass(frozen=True, slots=True)
class Progress:
    """A job's latest progress report, as written (at most a second old while it runs).

    ``fraction``: done / total, at most 1.0 (None: the total is unknown). ``eta``: seconds left as
    of ``updated_at``, at the rate of its run so far (None: unknown: no total yet, or no item done
    since the run's first report).
    """

    done: float
    total: float | None
    note: str
    fraction: float | None
    eta: float | None
    updated_at: dt.datetime | None

    @property
    def percent(self) -> int | None:
        """The fraction as a whole percentage (for a bar), None when the total is unknown."""
        return None if self.fraction is None else int(self.fraction * 100)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON holds it (``cogworker busy --json``; ``updated_at``: epoch seconds)."""
        return {"done": self.done, "total": self.total, "note": self.note, "fraction": self.fraction,
                "eta": self.eta, "updated_at": None if self.updated_at is None else self.updated_at.timestamp()}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    """A field's number; None when empty or unreadable (a hand-written hash is read leniently)."""
    text = _text(value).strip() if value is not None else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def parse(record: dict[Any, Any]) -> Progress | None:
    """The :class:`Progress` of a ``progress:<jid>`` hash as HGETALL returns it; None when empty."""
    if not record:
        return None
    fields = {_text(k): v for k, v in record.items()}
    done = _number(fields.get("done")) or 0
    total = _number(fields.get("total"))
    if total is not None and total <= 0:
        total = None
    fraction = None if total is None else max(0.0, min(1.0, done / total))
    eta = _number(fields.get("eta"))
    updated = _number(fields.get("updated"))
    try:
        updated_at = None if updated is None else dt.datetime.fromtimestamp(updated, tz=dt.UTC)
    except (ValueError, OverflowError, OSError):
        updated_at = None
    return Progress(done=done, total=total, note=_text(fields.get("note", "")), fraction=fraction,
                    eta=None if eta is None or eta < 0 else float(eta), updated_at=updated_at)


def read(redis: RedisClient, keys: Keys, jid: str) -> Progress | None:
    """The progress of ``jid`` (None: none)."""
    return parse(redis.hgetall(keys.progress(jid)))


def read_many(redis: RedisClient, keys: Keys, jids: Sequence[str]) -> dict[str, Progress | None]:
    """The progress of each of ``jids``, read in one pipeline (one round trip for them all)."""
    if not jids:
        return {}
    pipe = redis.pipeline(transaction=False)
    for jid in jids:
        pipe.hgetall(keys.progress(jid))
    # (A key of the wrong type, written by hand, is no report: the other rows are read all the same.)
    return {jid: None if isinstance(record, Exception) else parse(record)
            for jid, record in zip(jids, pipe.execute(raise_on_error=False), strict=True)}


def progress_of(jids: Sequence[str | None], *, redis: RedisClient | None = None,
                keys: Keys | None = None) -> dict[str, Progress | None]:
    """The object model's read (the admin's busy page, ``cogworker busy``): the progress of each
    of ``jids`` (a None or empty jid left out), in one round trip."""
    from ...api._base import _defaults

    redis, keys = _defaults(redis, keys)
    return read_many(redis, keys, list(dict.fromkeys(jid for jid in jids if jid)))


def get_progress(jid: str) -> Progress | None:
    """The latest progress job ``jid`` reported (``Job.progress``), or None for a job that has none
    (it reported none, or succeeded or died for good since); uses the settings' Redis."""
    from ...api._base import _defaults

    redis, keys = _defaults(None, None)
    return read(redis, keys, jid)


class Recorder(Tracker):
    """The tracker of a run under the test helpers: each report is handed to the helper
    (``record_progress(jid, Progress)``), nothing is written to Redis (a plain job needs none)."""

    def __init__(self, helper: Any, jid: str):
        self.helper = helper
        self.jid = jid
        self.done, self.total, self.note, self.closed, self.unwritten = None, None, "", False, False
        self._first = None

    def update(self, done: float, total: float | None = None, note: str = "") -> None:
        done, total, note = check(done, total, note)
        fraction = None if total is None else max(0.0, min(1.0, done / total))
        self.done, self.total, self.note = done, total, note
        self.helper.record_progress(self.jid, Progress(done, total, note, fraction, None,
                                                       dt.datetime.now(tz=dt.UTC)))

    def due(self) -> bool:
        return False

    def queue(self, pipe: Any) -> None:
        return None

    def flush(self, force: bool = False) -> None:
        return None

    def delete(self) -> None:
        self.closed = True


def current(payload: dict[str, Any] | None = None) -> Tracker | None:
    """The tracker of the job this thread runs (of ``payload``'s run, if given), made on first use;
    None outside a run (a job made by hand). An iterable job's loop reports through it too."""
    run = _scope.running.get()
    if run is None or (payload is not None and run.payload is not payload):
        return None
    tracker: Tracker | None = run.extras.get(NAME)
    if tracker is None:
        from ...push import runtime

        jid = str(run.payload.get("jid"))
        helper = runtime.get_override()
        if helper is not None and hasattr(helper, "record_progress"):  # (testing/: fake or inline mode)
            tracker = Recorder(helper, jid)
        else:
            from ...broker.keys import for_config

            # (the job thread's client: this run alone uses the tracker, on this thread)
            tracker = Tracker(runtime.get_redis(), for_config(runtime.get_config()), jid)
        run.extras[NAME] = tracker
    return tracker


def report(payload: dict[str, Any], done: float, total: float | None = None, note: str = "") -> None:
    """``Job.progress``: see :meth:`~django_cogworker.push.job.Job.progress`."""
    tracker = current(payload)
    if tracker is None:
        check(done, total, note)  # (bad values raise outside a run too: a job made by hand in a test)
        return
    tracker.update(done, total, note)
    tracker.flush()
