"""The scheduled, retry and dead sets: ``SortedSet`` (paging, bounded filters and lookups, bulk actions)
and its three kinds ``ScheduledSet``, ``RetrySet``, ``DeadSet``. One entry and its own actions are
``sorted_entry.SortedEntry`` (re-exported here, where it was defined before).

The limits below are read from this module at call time: a test patches them here
(``monkeypatch.setattr(api.sorted_sets, "SCAN_LIMIT", ...)``), not on ``api``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..broker import crossings, scripts
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..conf import Config
from ..push import payload as payloads
from . import _base, records, removals
from ._base import ActionRefused, Poison, _clamp_page, _defaults, _score, reencode
from .records import DETAIL_BYTES, HEAD_BYTES, TAIL_BYTES, Page
from .sorted_entry import KILLED_REASON, SortedEntry, _retry_of, poison_letter

__all__ = ["BATCH", "KILLED_REASON", "MATCH_LIMIT", "RETRY_SOME_BUDGET", "RETRY_SOME_LIMIT", "SCAN_BUDGET",
           "SCAN_LIMIT", "SEARCH_WINDOW", "DeadSet", "Moved", "RetrySet", "ScheduledSet", "SortedEntry",
           "SortedSet", "poison_letter"]

SCAN_LIMIT = 50_000  # entries a filter or a jid lookup examines at most
# Seconds a filter or a jid lookup scans at most: the entry cap alone kept a page under 200 ms on
# one machine and not on a slower one (each ZSCAN call there took twice as long).
SCAN_BUDGET = 0.12
MATCH_LIMIT = 1_000  # matches a filter keeps at most
SEARCH_WINDOW = 65_536  # bytes at each end of a bigger entry a filter looks in (scripts.SCAN_PREVIEW)
BATCH = 500  # entries per script call of retry_all
# What one request of the admin's "Retry all" does at most (``retry_some``): over 1,000,000 dead
# entries it ran 23 s in one request, past a 30 s gateway's patience on a slower day.
RETRY_SOME_LIMIT = 100_000
RETRY_SOME_BUDGET = 10.0  # seconds; no batch starts after


@dataclasses.dataclass
class Moved:
    """What one ``retry_some`` did: moved to their queues, sent to dead as poison, left in place
    (``stuck``: no queue, unreadable, poison already in dead, a queue key of the wrong type), the
    rank to go on from (the stuck entries are in front), and how many entries are after it."""

    moved: int = 0
    buried: int = 0
    stuck: int = 0
    resume: int = 0
    left: int = 0


class SortedSet:
    """Base of the scheduled, retry and dead sets: paging, filters, lookups and bulk actions.

    Every read goes through ``scripts.PREVIEW`` or ``scripts.SCAN_PREVIEW``: a list reads
    HEAD_BYTES of each entry, a lookup by token DETAIL_BYTES (or all of it, ``whole``).
    """

    name: ClassVar[str]  # the Keys attribute
    newest_first: ClassVar[bool] = False
    can_kill: ClassVar[bool] = False

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None, config: Any = None):
        self.redis, self.keys = _defaults(redis, keys)
        self._config = config
        self.key = getattr(self.keys, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r}>"

    def size(self) -> int:
        return int(self.redis.zcard(self.key))

    def _entry(self, raw: bytes, score: float, **kwargs: Any) -> SortedEntry:
        return SortedEntry(self, raw, score, **kwargs)

    def _read(self, mode: str, first: int, count: int, head: int,
              score: float | None = None) -> tuple[int, list[SortedEntry]]:
        """(the set's size, up to ``count`` entries from ``first``), ``head`` bytes of each (0: all)."""
        return records.preview(self.redis, self.key, mode, first, count, head,
                               lambda raw, score, **kw: self._entry(raw, score, **kw), score)

    def page(self, page: int = 1, per_page: int = 25, job: str | None = None,
             substring: str | None = None) -> Page:
        """One page by rank; with ``job`` (a class name) or ``substring`` (in the stored JSON), a bounded filter."""
        if job or substring:
            return self._filtered_page(*_clamp_page(page, per_page), job or None, substring or None)
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        total, items = self._read("revrank" if self.newest_first else "rank", start, per_page, HEAD_BYTES)
        return Page(items, page, per_page, total)

    def _filtered_page(self, page: int, per_page: int, job: str | None, substring: str | None) -> Page:
        def wanted(entry: SortedEntry) -> bool:
            return job is None or entry.payload.get("class") == job

        needle = f'"class":{payloads.encode(job)}' if job else ""
        found, scanned, complete = self._scan((needle, substring or ""), wanted, MATCH_LIMIT)
        found.sort(key=lambda e: e.score, reverse=self.newest_first)
        start = (page - 1) * per_page
        return Page(found[start:start + per_page], page, per_page, len(found), filtered=True, scanned=scanned,
                    complete=complete)

    def _scan(self, needles: tuple[str, str], wanted: Callable[[SortedEntry], bool],
              limit: int) -> tuple[list[SortedEntry], int, bool]:
        """Entries holding both ``needles`` (literally) and ``wanted``, in rank order: up to ``limit``
        among at most SCAN_LIMIT examined, in SCAN_BUDGET s (``scripts.SCAN_PREVIEW``)."""
        mode = "revrank" if self.newest_first else "rank"
        rank, found, seen = 0, [], set()
        deadline = time.monotonic() + SCAN_BUDGET
        while True:
            reply = scripts.SCAN_PREVIEW(self.redis, [self.key], [mode, rank, _base.SCAN_COUNT, records.CALL_BYTES,
                                                                  HEAD_BYTES, TAIL_BYTES, SEARCH_WINDOW, *needles])
            rank, size, rows = int(reply[0]), int(reply[1]), reply[2:]
            for i in range(0, len(rows), 4):
                head, score, length, tail = rows[i:i + 4]
                if (head, score, length, tail) in seen:
                    continue  # an entry seen twice: the set moved between two calls
                seen.add((head, score, length, tail))
                entry = self._entry(head, score, size=length, tail=tail)
                if wanted(entry):
                    found.append(entry)
            if rank >= size:
                return found, size, True
            if rank >= SCAN_LIMIT or len(found) >= limit or time.monotonic() >= deadline:
                return found, rank, False

    def entry(self, ref: str | tuple[float, bytes | str]) -> SortedEntry | None:
        """The entry with this jid (a bounded scan), or this exact ``(score, raw)``; None if absent."""
        if isinstance(ref, tuple):
            score, raw = ref
            raw = raw if isinstance(raw, bytes) else raw.encode()
            stored = self.redis.zscore(self.key, raw)
            return self._entry(raw, stored) if stored is not None and float(stored) == float(score) else None
        found, _, _ = self._scan((f'"jid":{payloads.encode(ref)}', ""), lambda e: e.jid == ref, 1)
        return found[0] if found else None

    def find(self, token: str, *, whole: bool = False) -> SortedEntry | None:
        """The entry a ``SortedEntry.token`` names: exact, and O(log n) (by its score).

        Its first DETAIL_BYTES (all of it when ``whole``), for its page; an action reads it whole.
        Many entries may share a score (a bulk push scheduled for one time): those are read
        SCAN_COUNT at a time, HEAD_BYTES of each, at most SCAN_LIMIT of them.
        """
        score_text, sep, ident = token.partition("|")
        score = _score(score_text)
        if not sep or score is None:
            return None
        for offset in range(0, SCAN_LIMIT, _base.SCAN_COUNT):
            _, rows = self._read("score", offset, _base.SCAN_COUNT, HEAD_BYTES, score)
            for i, entry in enumerate(rows):
                if entry.ident == ident:
                    if entry.complete:
                        return entry
                    _, again = self._read("score", offset + i, 1, 0 if whole else DETAIL_BYTES, score)
                    return again[0] if again and again[0].ident == ident else None
            if len(rows) < _base.SCAN_COUNT:
                break
        return None

    def delete_all(self) -> int:
        """Empty the set; return how many entries it had. The jobs a feature holds something for (a
        keep_last_if_active job's state) go first, one by one, and it is told (api/removals.py)."""
        told = 0 if self.name == "dead" else removals.remove_held(self.redis, self.keys, self.key, "zset")
        pipe = self.redis.pipeline(transaction=True)
        pipe.zcard(self.key)
        pipe.unlink(self.key)
        return told + int(pipe.execute()[0])

    def retry_all(self, now: float | None = None) -> int:
        """Move every entry that names a queue to it, BATCH at a time (push, then remove); return how many.

        Entries that can't move (no queue, unreadable, a queue key of the wrong type, poison
        already in dead) stay, in front; poison elsewhere goes to dead with the reason. One pass:
        it looks at about as many entries as the set had when it began, so entries added
        meanwhile can't keep it going. Unbounded in time: the admin calls ``retry_some``.
        """
        return self.retry_some(limit=self.size() + BATCH, budget=math.inf, now=now).moved

    def retry_some(self, *, start: int = 0, limit: int | None = None, budget: float | None = None,
                   now: float | None = None) -> Moved:
        """``retry_all`` from rank ``start`` (the stuck entries a previous call left in front), over at
        most ``limit`` entries (RETRY_SOME_LIMIT), starting no batch after ``budget`` seconds.

        Each batch goes on after the last entry the one before looked at, found anew by its score
        and bytes (``scripts.ENTRIES_AFTER``), not by rank: entries that leave the set or join it
        meanwhile make no entry that was there from the start be skipped.
        """
        limit = RETRY_SOME_LIMIT if limit is None else limit
        deadline = time.monotonic() + (RETRY_SOME_BUDGET if budget is None else budget)
        done, examined, rank = Moved(), 0, max(int(start), 0)
        last: SortedEntry | None = None  # the last entry looked at
        while examined < limit and time.monotonic() < deadline:
            _, rank, rows = self._after(last, rank, min(BATCH, limit - examined))
            if not rows:
                break
            examined += len(rows)
            last = rows[-1]
            stamp = time.time() if now is None else now
            moves: list[tuple[Any, str, str, str]] = []  # (raw, queue key, queue, payload to push)
            scores: list[float] = []
            stuck = 0
            for entry in rows:
                if (special := _retry_of(entry)) is not None:
                    try:
                        done.moved += special(entry, stamp)
                    except ActionRefused:
                        stuck += 1
                    continue
                if entry.parse_error or entry.queue is None:
                    stuck += 1
                    continue
                payload = dict(entry.payload, enqueued_at=stamp)
                payload.pop("at", None)
                try:
                    text = reencode(payload)
                except Poison as exc:
                    if self.name == "dead":
                        stuck += 1  # stays, shown as poison on its row
                    else:
                        entry.bury(exc.reason, stamp)
                        done.buried += 1
                    continue
                moves.append((entry.raw, self.keys.queue(entry.queue), entry.queue, text))
                scores.append(entry.score)
            if moves and self.keys.spread:  # (a cluster: each queue in its slot; leased, pushed, removed)
                outcomes = crossings.zset_to_queues(self.redis, self.keys, self.key,
                                                    [(raw, score, queue, text) for (raw, _key, queue, text), score
                                                     in zip(moves, scores, strict=True)], stamp)
                done.moved += outcomes.count(crossings.MOVED)
                stuck += sum(isinstance(outcome, Exception) for outcome in outcomes)
            elif moves:
                keys, args = scripts.requeue_from_zset_batch_args(self.key, self.keys.queues, moves)
                moved, failed = scripts.REQUEUE_FROM_ZSET_BATCH(self.redis, keys, args)
                done.moved += int(moved)
                stuck += int(failed)
            done.stuck += stuck
        size, done.resume, _ = self._after(last, rank, 0)  # (the stuck entries are in front of it)
        done.left = max(size - done.resume, 0)
        return done

    def _after(self, last: SortedEntry | None, rank: int, count: int) -> tuple[int, int, list[SortedEntry]]:
        """(the set's size, the rank of the first entry after ``last`` (with None: ``rank``), up to
        ``count`` entries from there, whole: CALL_BYTES of them a call, past one)."""
        where = ["rank", rank, ""] if last is None else ["after", repr(last.score), last.raw]
        reply = scripts.ENTRIES_AFTER(self.redis, [self.key], [*where, count, records.CALL_BYTES])
        rows = reply[2:]
        return int(reply[0]), int(reply[1]), [self._entry(rows[i], rows[i + 1]) for i in range(0, len(rows), 2)]

    def dead_limits(self, now: float) -> tuple[Any, Any]:
        """(drop dead entries scored below this, keep at most this many), as the engine trims."""
        config = self._settings()
        if config is None:  # no Django settings (a bare shell): no trim, rather than refusing
            return "", ""
        return now - config.dead_timeout, config.dead_max_jobs

    def batch_ttl(self) -> float:
        """BATCH_TTL (its default without Django settings)."""
        config = self._settings()
        return config.batch_ttl if config is not None else Config.batch_ttl

    def _settings(self) -> Any:
        if self._config is not None:
            return self._config
        try:
            from ..push import runtime

            return runtime.get_config()
        except Exception:
            return None


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
