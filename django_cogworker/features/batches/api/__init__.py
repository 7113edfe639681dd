"""Batches as operators see them (``batches/`` makes and runs them): ``BatchSet``, the listing of
``keys.batches`` newest first, pruned of expired batches as it is read. One batch, its summary and
its detail (``BatchSummary``, ``BatchDetail``, ``BatchJob``, ``BatchCallback``), is read in
``detail.py`` and re-exported here, where it was defined before; its limits (JOB_LIMIT...) are
read there.
"""

from __future__ import annotations

from typing import cast

from ....api._base import _clamp_page, _defaults, _text
from ....api.records import Page
from ....broker.keys import Keys
from ....broker.quarantine import is_wrong_type
from ....broker.types import RedisClient
from .detail import (
    CALLBACK_LOOKUPS,
    CHILD_LIMIT,
    JOB_LIMIT,
    JOB_STATES,
    MEMBER_SCAN_LIMIT,
    STATES,
    BatchCallback,
    BatchDetail,
    BatchJob,
    BatchSummary,
)

__all__ = ["CALLBACK_LOOKUPS", "CHILD_LIMIT", "JOB_LIMIT", "JOB_STATES", "MEMBER_SCAN_LIMIT", "PAGE_ROUNDS",
           "PRUNE_CHUNK", "PRUNE_LIMIT", "STATES", "STATE_SAMPLE", "BatchCallback", "BatchDetail", "BatchJob",
           "BatchSet", "BatchSummary"]

PAGE_ROUNDS = 5  # reads of a listing page that found expired batches on it (each round prunes them)
PRUNE_CHUNK = 100  # bids ``prune`` looks at per round trip, from the oldest
PRUNE_LIMIT = 1_000  # bids one ``prune`` looks at at most
STATE_SAMPLE = 1_000  # the newest batches ``BatchSet.states`` counts (the metrics' sample)


class BatchSet:
    """``keys.batches``: every batch made (bid -> created_at), newest first. A bid whose data expired
    stays there until a read finds it gone (``page``, ``prune``, ``states``) and takes it off."""

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None):
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.batches

    def size(self) -> int:
        """Bids listed: those whose data expired count until a read takes them off (``prune``)."""
        return int(self.redis.zcard(self.key))

    def page(self, page: int = 1, per_page: int = 25) -> Page:
        """One page of ``BatchSummary``, newest first; expired ones met are taken off and the page read again."""
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        rows: list[BatchSummary | None] = []
        for _ in range(PAGE_ROUNDS):
            listed = self._range(start, start + per_page - 1)
            rows = BatchSummary.read([_text(member) for member, _ in listed], redis=self.redis, keys=self.keys)
            gone = [entry for entry, row in zip(listed, rows, strict=True) if row is None]
            if not gone or not self._forget(gone):
                break
        return Page([row for row in rows if row is not None], page, per_page, self.size())

    def get(self, bid: str) -> BatchDetail | None:
        return BatchDetail.read(bid, redis=self.redis, keys=self.keys)

    def prune(self, limit: int | None = None) -> int:
        """Take expired batches off the listing, from the oldest, PRUNE_CHUNK a round trip, until a chunk
        has none (expiry follows age, mostly) or ``limit`` (PRUNE_LIMIT) were looked at; return how many."""
        removed, rank, seen, limit = 0, 0, 0, PRUNE_LIMIT if limit is None else limit
        while seen < limit:
            listed = self._range(rank, rank + min(PRUNE_CHUNK, limit - seen) - 1, newest=False)
            if not listed:
                break
            seen += len(listed)
            gone = [entry for entry, there in zip(listed, self._there(listed), strict=True) if not there]
            forgotten = self._forget(gone) if gone else 0
            removed += forgotten
            if not gone or len(listed) < PRUNE_CHUNK:
                break
            rank += len(listed) - forgotten
        return removed

    def states(self, limit: int | None = None) -> dict[str, int]:
        """How many of the ``limit`` (STATE_SAMPLE) newest batches are in each of STATES, in one round trip
        after the listing's (the expired ones met are taken off, and not counted)."""
        listed = self._range(0, (STATE_SAMPLE if limit is None else limit) - 1)
        counts = dict.fromkeys(STATES, 0)
        pipe = self.redis.pipeline(transaction=False)
        for member, _ in listed:
            pipe.hmget(self.keys.batch(_text(member)).meta, ["created_at", "done_complete", "done_success"])
        gone = []
        for entry, meta in zip(listed, pipe.execute(raise_on_error=False), strict=True):
            if not isinstance(meta, list) or meta[0] is None:
                gone.append(entry)
            else:
                counts["succeeded" if meta[2] is not None else
                       "complete_with_failures" if meta[1] is not None else "incomplete"] += 1
        if gone:
            self._forget(gone)
        return counts

    def _range(self, start: int, stop: int, *, newest: bool = True) -> list[tuple[bytes, float]]:
        read = self.redis.zrevrange if newest else self.redis.zrange
        return cast(list[tuple[bytes, float]], read(self.key, start, stop, withscores=True))

    def _forget(self, entries: list[tuple[bytes, float]]) -> int:
        """Take these (bid, score) off the listing, then look again: a batch made anew meanwhile (a
        job run again makes its child batch again, with the same bid) is listed again as it was.
        Return how many stay off. (Its keys are in another slot on a cluster: no one script sees both.)"""
        self.redis.zrem(self.key, *(member for member, _ in entries))
        back = {member: score for (member, score), there in zip(entries, self._there(entries), strict=True) if there}
        if back:
            self.redis.zadd(self.key, back)
        return len(entries) - len(back)

    def _there(self, entries: list[tuple[bytes, float]]) -> list[bool]:
        """Whether each listed batch is still there (its meta hash holds its created_at), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for member, _ in entries:
            pipe.hexists(self.keys.batch(_text(member)).meta, "created_at")
        # (a meta of the wrong type: a batch poisoned, still there for its page to say so)
        return [is_wrong_type(there) or bool(there) for there in pipe.execute(raise_on_error=False)]
