"""One entry of the scheduled, retry or dead set and its actions: ``SortedEntry`` (delete, enqueue
now, kill, and ``bury`` for a payload that can't be written back), ``poison_letter`` and
``KILLED_REASON``. The set it belongs to (``sorted_sets.SortedSet``) pages and finds entries and
moves them in bulk; an entry reaches it through ``parent``, typed by what it uses (``EntrySet``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from .. import declarations, retries
from ..broker import crossings, scripts
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..push import payload as payloads
from ..push import unique
from . import removals
from ._base import ActionRefused, Poison, _printable, reencode
from .records import JobRecord

KILLED_REASON = "killed from the admin"


class EntrySet(Protocol):
    """What an entry uses of its set (``sorted_sets.SortedSet`` is one)."""

    redis: RedisClient
    keys: Keys
    key: str

    @property
    def name(self) -> str: ...

    @property
    def can_kill(self) -> bool: ...

    def find(self, token: str, *, whole: bool = False) -> SortedEntry | None: ...

    def dead_limits(self, now: float) -> tuple[Any, Any]: ...

    def batch_ttl(self) -> float: ...


def _retry_of(entry: JobRecord) -> retries.Retry | None:
    """A feature's retry of ``entry`` when it names no queue (django_cogworker/retries.py), else None."""
    if entry.parse_error or entry.queue is not None:
        return None
    return retries.RETRIES.get(entry.payload.get("class"))  # type: ignore[arg-type]



def poison_letter(entry: JobRecord, reason: str, now: float) -> dict[str, Any]:
    """The dead entry for a payload that can't be written back: its stored text kept, and its jid."""
    letter = payloads.dead_letter(entry.raw, reason, now)
    if not entry.ident.startswith("sha1:"):
        letter["jid"] = entry.ident
    return letter


class SortedEntry(JobRecord):
    """A payload in a sorted set, with its score (when it is due, or when it died)."""

    def __init__(self, parent: EntrySet, raw: bytes | str, score: float, **kwargs: Any):
        super().__init__(raw, **kwargs)
        self.parent = parent
        self.score = float(score)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]} in {self.parent.name} at {self.score:.3f}>"

    @property
    def token(self) -> str:
        """A stable reference to this entry for forms and URLs; see :meth:`SortedSet.find`."""
        return f"{self.score!r}|{self.ident}"

    def whole(self) -> SortedEntry | None:
        """This entry with every byte read (itself when it was); None if it is gone."""
        return self if self.complete else self.parent.find(self.token, whole=True)

    def delete(self) -> bool:
        """Remove it; False if it was no longer there. A unique job's lock goes with it, and what a
        feature held for it (a keep_last_if_active job's state: its kept follow-up is written)."""
        entry = self.whole()
        if entry is None:
            return False
        p = self.parent
        removed = bool(p.redis.zrem(p.key, entry.raw))
        if removed and entry.payload.get("unique_digest") and entry.jid:
            unique.release(p.redis, p.keys, entry.payload)
        if removed and not entry.parse_error:
            removals.told(p.redis, p.keys, entry.payload)
        return removed

    def enqueue_now(self, now: float | None = None) -> bool:
        """Move it to the end of its queue now; False if it was no longer there (the poller took it).

        A payload that can't be written back goes to dead with the reason (or, in dead, stays),
        and ActionRefused says so.
        """
        entry = self.whole()
        if entry is None:
            return False
        now = time.time() if now is None else now
        if (special := _retry_of(entry)) is not None:
            return special(entry, now)
        queue = entry.queue
        if entry.parse_error or queue is None:
            raise ActionRefused(f"{_printable(entry.display_class)} {entry.ident} names no queue it could run from")
        payload = dict(entry.payload, enqueued_at=now)
        payload.pop("at", None)
        try:
            text = reencode(payload)
        except Poison as exc:
            raise entry.bury(exc.reason, now) from exc
        p = self.parent
        if p.keys.spread:  # (a cluster: the queue is in another slot; leased, pushed, then removed)
            outcome = crossings.zset_to_queues(p.redis, p.keys, p.key, [(entry.raw, entry.score, queue, text)], now)[0]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome == crossings.MOVED
        return bool(scripts.CLAIM_AND_REQUEUE(p.redis, [p.key, p.keys.queues, p.keys.queue(queue)],
                                              [entry.raw, queue, text]))

    retry_now = enqueue_now

    def bury(self, reason: str, now: float) -> ActionRefused:
        """Send this poison entry to dead with ``reason`` (in dead, leave it); return the refusal to raise."""
        p, what = self.parent, f"{_printable(self.display_class)} {self.ident}"
        if p.name == "dead":
            return Poison(f"{what} {reason}: it stays in dead")
        below, cap = p.dead_limits(now)
        scripts.MOVE_BETWEEN_ZSETS(p.redis, [p.key, p.keys.dead],
                                   [self.raw, now, reencode(poison_letter(self, reason, now)), below, cap])
        return Poison(f"{what} {reason}: sent to dead with the reason")

    def kill(self, now: float | None = None) -> bool:
        """Move it to the dead set (retries only); False if it was no longer there."""
        p = self.parent
        if not p.can_kill:
            raise ActionRefused(f"entries of {p.name} can't be killed")
        entry = self.whole()
        if entry is None:
            return False
        now = time.time() if now is None else now
        if entry.parse_error:
            dead = payloads.dead_letter(entry.raw, f"{KILLED_REASON} ({entry.parse_error})", now)
        else:
            dead = dict(entry.payload, dead_reason=KILLED_REASON)
            dead.setdefault("failed_at", now)
        try:
            text = reencode(dead)
        except Poison as exc:
            text = reencode(poison_letter(entry, f"{KILLED_REASON}; it {exc.reason}", now))
        below, cap = p.dead_limits(now)
        moved = bool(scripts.MOVE_BETWEEN_ZSETS(p.redis, [p.key, p.keys.dead], [entry.raw, now, text, below, cap]))
        # Only once moved: an entry the poller took meanwhile is running, and its features mustn't
        # hear it died (a keep_last follow-up written beside the run, its batch counting it dead).
        # The cost: this process dying between the two leaves them untold (the state expires).
        if moved and not entry.parse_error:
            declarations.died(p.redis, p.keys, entry.payload, "Killed", KILLED_REASON, p.batch_ttl())
        return moved
