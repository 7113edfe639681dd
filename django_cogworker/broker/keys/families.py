"""The key families: the keys of one batch (``BatchKeys``) or one limiter key (``LimitKeys``),
kept together in one slot and handed to their scripts as KEYS in one order, and ``Want``, the type
a key must hold and where its move to quarantine is noted. ``Keys.batch`` and ``Keys.limit`` build
the names (keys/__init__.py, with the schema's table); this module says what each must hold.
"""

from __future__ import annotations

import re
from typing import NamedTuple


def glob_escape(text: str) -> str:
    """Escape Redis MATCH's special characters: ``text`` is matched literally."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class Want(NamedTuple):
    """The Redis type a key must hold, and where a move of it to quarantine is noted: ``(hash,
    field)`` in the key's own slot, the field set to the time of the move (broker/quarantine.py)."""

    type: str
    note: tuple[str, str] | None = None
    ttl: int | None = None  # seconds the note's hash lives when the note makes it (None: no expiry)


class BatchKeys(NamedTuple):
    """One batch's keys, in the order the batch scripts take them as KEYS."""

    meta: str  # hash: description, created_at, ttl, callbacks (cb:<event>), done_<event> stamps, committed,
    #            lost:<name> (a key of the batch moved to quarantine: when)
    jobs: str  # set: every jid (and "b:<bid>" of each child batch) ever added
    pending: str  # set: those not yet succeeded
    failed: str  # hash: those of pending whose last run failed -> JSON {class, error, message, at}
    dead: str  # set: those of pending that went to dead
    open: str  # set: the jobs() blocks open on it (owner tokens): no event fires while one is
    outbox: str  # list: callbacks fired, to be delivered to their queues

    def expected(self, ttl: float | None = None) -> dict[str, Want]:
        """Each key's type; a move to quarantine is noted in ``meta`` as ``lost:<name>`` (a meta the
        note makes lives ``ttl`` seconds, the batch's)."""
        note_ttl = max(1, int(ttl)) if ttl else None
        return {key: Want(kind, (self.meta, f"lost:{name}"), note_ttl)
                for key, kind, name in zip(self, BATCH_TYPES, self._fields, strict=True)}


class LimitKeys(NamedTuple):
    """One limiter key's keys (features/limits/), in the order the limiter scripts take them as KEYS."""

    holders: str  # zset (concurrent): holder token (JSON: jid, process, since, run) -> lease end
    starts: str  # zset (window): start token -> when it started
    state: str  # hash: bn, bc (bucket: which bucket, its starts); tat (leaky)
    stats: str  # hash: granted, over, rescheduled, failed, expired; the last hour's ring (features/limits/scripts.py);
    #             lost:<name> (a key of the limiter moved to quarantine: when)
    waiting: str  # zset (concurrent): jids of refused jobs -> their due time; a release wakes the first
    parked: str  # hash (concurrent): jid -> the job as rescheduled (what a wake-up moves to its queue)

    def expected(self) -> dict[str, Want]:
        """Each key's type; a move to quarantine is noted in ``stats`` as ``lost:<name>``."""
        return {key: Want(kind, (self.stats, f"lost:{name}"))
                for key, kind, name in zip(self, LIMIT_TYPES, self._fields, strict=True)}


BATCH_TYPES = ("hash", "set", "set", "hash", "set", "set", "list")  # BatchKeys' types, in its order
LIMIT_TYPES = ("zset", "zset", "hash", "hash", "zset", "hash")  # LimitKeys' types, in its order
