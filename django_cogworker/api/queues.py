"""Queues: ``Queue``, one queue's waiting jobs (size, latency, paging) and its pause flag; ``QueueRow``,
what the listings show of one, read for many queues in one pipeline; and the pruning of empty names."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

from ..broker import scripts
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..declarations import provided
from . import lanes as lane_counts
from . import records, removals
from ._base import _clamp_page, _defaults
from .records import HEAD_BYTES, TAIL_BYTES, JobRecord, Page

PRUNE_BATCH = 1_000  # names per PRUNE_QUEUES call: one call must not hold Redis up for long


class Queue:
    """One queue: its waiting jobs, and whether processes fetch from it.

    ``name`` is text; a name in ``queues`` that isn't UTF-8 (or is empty) is built from its
    bytes (``Queue.from_member``), reads as ``name`` with backslash escapes, and is named in
    forms by ``hex``: it can be shown, cleared, unpaused and pruned like any other.
    """

    def __init__(self, name: str | bytes, *, redis: RedisClient | None = None, keys: Keys | None = None):
        if isinstance(name, bytes):
            self.member = name
            self.name = name.decode("utf-8", "backslashreplace")
        elif isinstance(name, str) and name:
            self.member = name.encode("utf-8", "backslashreplace")
            self.name = name
        else:
            raise ValueError(f"a queue name must be a non-empty string, got {name!r}")
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.queue_member_key(self.member)
        # A name the pages can put in a URL and a form as text (else they use ``hex``).
        try:
            self.readable = bool(self.member.decode("utf-8"))
        except UnicodeDecodeError:
            self.readable = False

    @classmethod
    def from_member(cls, member: bytes, *, redis: RedisClient | None = None, keys: Keys | None = None) -> Queue:
        return cls(member, redis=redis, keys=keys)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    @property
    def hex(self) -> str:
        return self.member.hex()

    @classmethod
    def members(cls, *, redis: RedisClient | None = None, keys: Keys | None = None) -> list[bytes]:
        """Every name in ``queues`` and ``paused_queues``, as stored, sorted."""
        redis, keys = _defaults(redis, keys)
        # (a bytes client: names as stored, which may not be UTF-8)
        names = cast(set[bytes], redis.smembers(keys.queues)) | cast(set[bytes], redis.smembers(keys.paused_queues))
        return sorted(names)

    @classmethod
    def all(cls, *, redis: RedisClient | None = None, keys: Keys | None = None) -> list[Queue]:
        redis, keys = _defaults(redis, keys)
        return [cls(member, redis=redis, keys=keys) for member in cls.members(redis=redis, keys=keys)]

    @classmethod
    def page(cls, page: int = 1, per_page: int = 50, *, redis: RedisClient | None = None, keys: Keys | None = None,
             now: float | None = None) -> Page:
        """One page of ``QueueRow``, by name: 10,000 queue names made one page of them all 7 MB."""
        redis, keys = _defaults(redis, keys)
        members = cls.members(redis=redis, keys=keys)
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        shown = [cls(m, redis=redis, keys=keys) for m in members[start:start + per_page]]
        return Page(QueueRow.read(shown, now=now), page, per_page, len(members))

    @classmethod
    def prune(cls, *, redis: RedisClient | None = None, keys: Keys | None = None) -> int:
        """Take off ``queues`` every name whose list is empty and that isn't paused (``PRUNE_QUEUES``,
        atomic per batch: a push meanwhile keeps its name); return how many were removed."""
        redis, keys = _defaults(redis, keys)
        members = sorted(redis.smembers(keys.queues))
        if keys.spread:
            return _prune_across_slots(redis, keys, [cls(m, redis=redis, keys=keys) for m in members])
        removed = 0
        for i in range(0, len(members), PRUNE_BATCH):
            batch = members[i:i + PRUNE_BATCH]
            lane_keys = [key for m in batch for key in _with_lanes(cls(m, redis=redis, keys=keys).key)]
            removed += int(scripts.PRUNE_QUEUES(redis, [keys.queues, keys.paused_queues, *lane_keys], batch))
        return removed

    def size(self) -> int:
        """The jobs waiting: in its list, and in its lanes (its groups' lists, its priorities: api/lanes.py).
        A key of the wrong type counts as empty (the key guard moves it aside)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.key)
        size = pipe.execute(raise_on_error=False)[0]
        return self.lanes().size(size if isinstance(size, int) else 0)

    def lanes(self) -> lane_counts.Lanes:
        """Its groups (each one's waiting count), its paused groups, its prioritized jobs' count."""
        return lane_counts.read(self.redis, [self.key])[0]

    def groups(self, page: int = 1, per_page: int = 25) -> Any:
        """Its groups, the busiest first: a ``GroupPage`` (its ``page`` of ``QueueGroup``: id, waiting,
        paused; the groups' total, the jobs grouped and prioritized; the fairness feature's,
        features/fairness/api.py)."""
        return provided("queue_groups")(self, page, per_page)

    def pause_group(self, group: str | int) -> bool:
        """Stop fetching group ``group``'s jobs from this queue (they keep waiting; new ones join them);
        return whether it wasn't paused already."""
        return bool(provided("pause_group")(self, group))

    def resume_group(self, group: str | int) -> bool:
        """Fetch group ``group``'s jobs again; return whether it was paused."""
        return bool(provided("resume_group")(self, group))

    def exists(self) -> bool:
        """Whether the name was ever pushed to (and not pruned), is paused, or holds jobs."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.sismember(self.keys.queues, self.member)  # type: ignore[arg-type]
        pipe.sismember(self.keys.paused_queues, self.member)  # type: ignore[arg-type]
        pipe.exists(self.key)
        return any(pipe.execute())

    def latency(self, now: float | None = None) -> float:
        """Seconds the oldest waiting job has waited (0 when empty or unreadable)."""
        _, oldest = self._read(-1, 1)
        return _waited(oldest[0] if oldest else None, now)

    def _read(self, first: int, count: int) -> tuple[int, list[JobRecord]]:
        """(the list's length, ``count`` jobs from index ``first``), HEAD_BYTES of each."""
        return records.preview(self.redis, self.key, "list", first, count, HEAD_BYTES,
                               lambda raw, _score, **kw: JobRecord(raw, **kw))

    @property
    def paused(self) -> bool:
        return bool(self.redis.sismember(self.keys.paused_queues, self.member))  # type: ignore[arg-type]

    def pause(self) -> None:
        """No process fetches from this queue once its next heartbeat has read the paused set."""
        self.redis.sadd(self.keys.paused_queues, self.member)

    def unpause(self) -> None:
        self.redis.srem(self.keys.paused_queues, self.member)

    def clear(self) -> int:
        """Delete every waiting job, its lanes' too (its groups' and priorities'; its paused groups stay
        paused); return how many there were. The jobs of its list a feature holds something for (a
        keep_last_if_active job's state) go first, one by one, and it is told (api/removals.py)."""
        told = removals.remove_held(self.redis, self.keys, self.key, "list")
        in_lanes = lane_counts.clear(self.redis, self.key, watch=not self.keys.spread)
        pipe = self.redis.pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0]) + in_lanes + told

    def jobs(self, page: int = 1, per_page: int = 25) -> Page:
        """Waiting jobs by rank, the newest first (the fetch takes from the other end): HEAD_BYTES of each."""
        page, per_page = _clamp_page(page, per_page)
        total, items = self._read((page - 1) * per_page, per_page)
        return Page(items, page, per_page, total)


def _with_lanes(key: bytes) -> list[bytes]:
    """A queue's list and the lanes PRUNE_QUEUES reads beside it (ring, priorities, paused groups)."""
    return [key, *(lane_counts.lane_key(key, suffix) for suffix in (lane_counts.RING, lane_counts.PRIO,
                                                                     lane_counts.PAUSED))]


def _prune_across_slots(redis: RedisClient, keys: Keys, queues: list[Queue]) -> int:
    """``prune`` on a cluster, where each list is in its queue's slot and the listing in the home
    slot: no one script sees both. Names seen empty and unpaused are removed, then their lists
    read again: a push that landed between the two lists its name again here (as PUSH would)."""
    paused = cast(set[bytes], redis.smembers(keys.paused_queues))
    candidates = [q for q in queues if q.member not in paused]
    pipe = redis.pipeline(transaction=False)
    for q in candidates:
        pipe.llen(q.key)
        pipe.exists(*_with_lanes(q.key)[1:])  # (its lanes: jobs in its groups or priorities, paused groups)
    replies = pipe.execute(raise_on_error=False)
    empty = [q for i, q in enumerate(candidates) if replies[2 * i] == 0 and replies[2 * i + 1] == 0]
    removed = 0
    for i in range(0, len(empty), PRUNE_BATCH):
        batch = empty[i:i + PRUNE_BATCH]
        removed += int(redis.srem(keys.queues, *(q.member for q in batch)))
        pipe = redis.pipeline(transaction=False)
        for q in batch:
            pipe.llen(q.key)
        pushed = [q.member for q, size in zip(batch, pipe.execute(raise_on_error=False), strict=True) if size != 0]
        if pushed:
            redis.sadd(keys.queues, *pushed)
            removed -= len(pushed)
    return max(removed, 0)


def _waited(oldest: JobRecord | None, now: float | None) -> float:
    enqueued = oldest.time("enqueued_at") if oldest is not None else None  # (None unless finite)
    if enqueued is None:
        return 0.0
    return max((time.time() if now is None else now) - enqueued, 0.0)


@dataclasses.dataclass
class QueueRow:
    """What a listing shows of a queue: its size (its lanes' jobs included), latency and pause flag
    (and, when the listing has read them, how many live processes fetch from it:
    ``ProcessSet.readers``); ``lanes``: its groups and priorities (api/lanes.py)."""

    queue: Queue
    size: int
    latency: float
    paused: bool
    readers: int | None = None
    lanes: lane_counts.Lanes | None = None

    @classmethod
    def read(cls, queues: list[Queue], now: float | None = None) -> list[QueueRow]:
        """The rows of ``queues``, in one round trip (the queues page made three per queue: 33 s
        for 100,000 names)."""
        if not queues:
            return []
        redis, keys = queues[0].redis, queues[0].keys
        pipe = redis.pipeline(transaction=False)
        pipe.smembers(keys.paused_queues)
        for q in queues:
            # The oldest job: the list's last (PREVIEW's "list" takes an index from the front).
            pipe.llen(q.key)
            scripts.PREVIEW.in_pipeline(pipe, [q.key], ["list", -1, 1, HEAD_BYTES, TAIL_BYTES, "",
                                                        records.CALL_BYTES])
        replies = pipe.execute(raise_on_error=False)
        paused = replies[0] if isinstance(replies[0], set) else set()
        lanes = lane_counts.read(redis, [q.key for q in queues])
        rows = []
        for i, q in enumerate(queues):
            size, oldest = replies[1 + 2 * i], replies[2 + 2 * i]
            size = int(size) if isinstance(size, int) else 0  # a key of the wrong type: the key guard moves it
            record = None
            if isinstance(oldest, list) and len(oldest) == 6:
                record = JobRecord(oldest[2], size=oldest[4], tail=oldest[5])
            rows.append(cls(q, lanes[i].size(size), _waited(record, now), q.member in paused, lanes=lanes[i]))
        return rows
