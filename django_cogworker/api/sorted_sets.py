"""The scheduled, retry and dead sets: ``SortedSet`` (paging, bounded filters and lookups, bulk actions),
its three kinds ``ScheduledSet``, ``RetrySet``, ``DeadSet``, and ``SortedEntry``, one entry with its actions.

The limits below are read from this module at call time: a test patches them here
(``monkeypatch.setattr(api.sorted_sets, "SCAN_LIMIT", ...)``), not on ``api``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from .. import payload as payloads
from .. import scripts, unique
from ..keys import Keys
from . import _base
from ._base import ActionRefused, _clamp_page, _defaults, _glob_escape, _number
from .records import JobRecord, Page

SCAN_LIMIT = 50_000  # entries a filter or a jid lookup examines at most
# Seconds a filter or a jid lookup scans at most: the entry cap alone kept a page under 200 ms on
# one machine and not on a slower one (each ZSCAN call there took twice as long).
SCAN_BUDGET = 0.12
MATCH_LIMIT = 1_000  # matches a filter keeps at most
BATCH = 500  # entries per script call of retry_all
KILLED_REASON = "killed from the admin"


class SortedEntry(JobRecord):
    """A payload in a sorted set, with its score (when it is due, or when it died)."""

    def __init__(self, parent: SortedSet, raw: bytes | str, score: float, **kwargs: Any):
        super().__init__(raw, **kwargs)
        self.parent = parent
        self.score = float(score)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]} in {self.parent.name} at {self.score:.3f}>"

    @property
    def token(self) -> str:
        """A stable reference to this entry for forms and URLs; see :meth:`SortedSet.find`."""
        return f"{self.score!r}|{self.ident}"

    def delete(self) -> bool:
        """Remove it; False if it was no longer there. A unique job's lock goes with it."""
        removed = bool(self.parent.redis.zrem(self.parent.key, self.raw))
        if removed and self.payload.get("unique_digest") and self.jid:
            unique.release(self.parent.redis, self.parent.keys, self.payload)
        return removed

    def enqueue_now(self, now: float | None = None) -> bool:
        """Move it to the end of its queue now; False if it was no longer there (the poller took it)."""
        queue = self.queue
        if self.parse_error or queue is None:
            raise ActionRefused(f"{self.display_class} {self.ident} names no queue it could run from")
        payload = dict(self.payload, enqueued_at=time.time() if now is None else now)
        payload.pop("at", None)
        p = self.parent
        return bool(scripts.CLAIM_AND_REQUEUE(p.redis, [p.key, p.keys.queues, p.keys.queue(queue)],
                                              [self.raw, queue, payloads.encode(payload)]))

    retry_now = enqueue_now

    def kill(self, now: float | None = None) -> bool:
        """Move it to the dead set (retries only); False if it was no longer there."""
        p = self.parent
        if not p.can_kill:
            raise ActionRefused(f"entries of {p.name} can't be killed")
        now = time.time() if now is None else now
        if self.parse_error:
            dead = payloads.dead_letter(self.raw, f"{KILLED_REASON} ({self.parse_error})", now)
        else:
            dead = dict(self.payload, dead_reason=KILLED_REASON)
            dead.setdefault("failed_at", now)
        below, cap = p.dead_limits(now)
        return bool(scripts.MOVE_BETWEEN_ZSETS(p.redis, [p.key, p.keys.dead],
                                               [self.raw, now, payloads.encode(dead), below, cap]))


class SortedSet:
    """Base of the scheduled, retry and dead sets: paging, filters, lookups and bulk actions."""

    name: ClassVar[str]  # the Keys attribute
    newest_first: ClassVar[bool] = False
    can_kill: ClassVar[bool] = False

    def __init__(self, *, redis: Any = None, keys: Keys | None = None, config: Any = None):
        self.redis, self.keys = _defaults(redis, keys)
        self._config = config
        self.key = getattr(self.keys, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r}>"

    def size(self) -> int:
        return int(self.redis.zcard(self.key))

    def _entry(self, raw: bytes, score: float, **kwargs: Any) -> SortedEntry:
        return SortedEntry(self, raw, score, **kwargs)

    def page(self, page: int = 1, per_page: int = 25, job: str | None = None,
             substring: str | None = None) -> Page:
        """One page by rank; with ``job`` (a class name) or ``substring`` (in the stored JSON), a bounded filter."""
        page, per_page = _clamp_page(page, per_page)
        if job or substring:
            return self._filtered_page(page, per_page, job or None, substring or None)
        start = (page - 1) * per_page
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.key)
        if self.newest_first:
            pipe.zrevrange(self.key, start, start + per_page - 1, withscores=True)
        else:
            pipe.zrange(self.key, start, start + per_page - 1, withscores=True)
        total, rows = pipe.execute()
        items = [self._entry(raw, score, position=start + i) for i, (raw, score) in enumerate(rows)]
        return Page(items, page, per_page, int(total))

    def _filtered_page(self, page: int, per_page: int, job: str | None, substring: str | None) -> Page:
        def wanted(entry: SortedEntry) -> bool:
            return ((job is None or entry.payload.get("class") == job)
                    and (substring is None or substring.encode() in entry.raw))

        pattern = (f"*{_glob_escape(substring)}*" if substring
                   else f'*"class":{_glob_escape(payloads.encode(job))}*')
        found, scanned, complete = self._scan(pattern, wanted, MATCH_LIMIT)
        found.sort(key=lambda e: e.score, reverse=self.newest_first)
        start = (page - 1) * per_page
        return Page(found[start:start + per_page], page, per_page, len(found), filtered=True, scanned=scanned,
                    complete=complete)

    def _scan(self, pattern: str, wanted: Callable[[SortedEntry], bool],
              limit: int) -> tuple[list[SortedEntry], int, bool]:
        """ZSCAN MATCH: up to ``limit`` wanted entries among at most SCAN_LIMIT examined, in SCAN_BUDGET s."""
        cursor, scanned, found, seen = 0, 0, [], set()
        deadline = time.monotonic() + SCAN_BUDGET
        while True:
            cursor, rows = self.redis.zscan(self.key, cursor, match=pattern, count=_base.SCAN_COUNT)
            scanned += _base.SCAN_COUNT  # COUNT is about how many entries one call examines
            for raw, score in rows:
                if raw in seen:
                    continue  # ZSCAN may return an entry twice while the set is rehashed
                seen.add(raw)
                entry = self._entry(raw, score)
                if wanted(entry):
                    found.append(entry)
            if int(cursor) == 0:
                return found, min(scanned, max(len(seen), self.size())), True
            if scanned >= SCAN_LIMIT or len(found) >= limit or time.monotonic() >= deadline:
                return found, scanned, False

    def entry(self, ref: str | tuple[float, bytes | str]) -> SortedEntry | None:
        """The entry with this jid (a bounded scan), or this exact ``(score, raw)``; None if absent."""
        if isinstance(ref, tuple):
            score, raw = ref
            raw = raw if isinstance(raw, bytes) else raw.encode()
            stored = self.redis.zscore(self.key, raw)
            return self._entry(raw, stored) if stored is not None and float(stored) == float(score) else None
        found, _, _ = self._scan(f'*"jid":{_glob_escape(payloads.encode(ref))}*', lambda e: e.jid == ref, 1)
        return found[0] if found else None

    def find(self, token: str) -> SortedEntry | None:
        """The entry a ``SortedEntry.token`` names: exact, and O(log n) (ZRANGEBYSCORE on its score).

        Many entries may share a score (a bulk push scheduled for one time):
        those are read SCAN_COUNT at a time, at most SCAN_LIMIT of them.
        """
        score_text, sep, ident = token.partition("|")
        score = _number(score_text)
        if not sep or score is None:
            return None
        for offset in range(0, SCAN_LIMIT, _base.SCAN_COUNT):
            rows = self.redis.zrangebyscore(self.key, score, score, start=offset, num=_base.SCAN_COUNT, withscores=True)
            for raw, stored in rows:
                entry = self._entry(raw, stored)
                if entry.ident == ident:
                    return entry
            if len(rows) < _base.SCAN_COUNT:
                break
        return None

    def delete_all(self) -> int:
        """Empty the set; return how many entries it had."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zcard(self.key)
        pipe.unlink(self.key)
        return int(pipe.execute()[0])

    def retry_all(self, now: float | None = None) -> int:
        """Move every entry that names a queue to it, BATCH at a time (push, then remove); return how many.

        Entries that can't move (no queue, unreadable, a queue key of the wrong
        type) stay, in front. One pass: it looks at about as many entries as
        the set had when it began, so entries added meanwhile can't keep it going.
        """
        moved, skipped, budget = 0, 0, self.size() + BATCH
        while budget > 0:
            rows = self.redis.zrange(self.key, skipped, skipped + BATCH - 1)
            if not rows:
                break
            budget -= len(rows)
            queue_keys: dict[str, int] = {}
            args: list[Any] = []
            stamp = time.time() if now is None else now
            for raw in rows:
                entry = self._entry(raw, 0.0)
                if entry.parse_error or entry.queue is None:
                    skipped += 1
                    continue
                payload = dict(entry.payload, enqueued_at=stamp)
                payload.pop("at", None)
                index = queue_keys.setdefault(entry.queue, len(queue_keys) + 3)
                args += [raw, index, entry.queue, payloads.encode(payload)]
            if not args:
                continue
            keys = [self.key, self.keys.queues, *(self.keys.queue(q) for q in queue_keys)]
            batch_moved, failed = scripts.REQUEUE_FROM_ZSET_BATCH(self.redis, keys, args)
            moved += int(batch_moved)
            skipped += int(failed)
        return moved

    def dead_limits(self, now: float) -> tuple[Any, Any]:
        """(drop dead entries scored below this, keep at most this many), as the engine trims."""
        config = self._config
        if config is None:
            try:
                from .. import runtime

                config = runtime.get_config()
            except Exception:  # no Django settings (a bare shell): no trim, rather than refusing
                return "", ""
        return now - config.dead_timeout, config.dead_max_jobs


class ScheduledSet(SortedSet):
    """Jobs pushed with perform_in / perform_at, soonest first."""

    name = "schedule"


class RetrySet(SortedSet):
    """Failed jobs waiting for their next attempt, soonest first."""

    name = "retry"
    can_kill = True


class DeadSet(SortedSet):
    """Jobs that won't run again without a human, the latest death first."""

    name = "dead"
    newest_first = True
