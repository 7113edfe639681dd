"""A queue's lanes as the listings count them: the jobs waiting in its groups' lists and in its
priorities (broker/keys/families.py's LaneKeys), which the queue's own list doesn't hold.

A grouped job leaves the queue's list for its group's at its first fetch, and a prioritized one is
never in it: a size read from the list alone showed 0 while 5,000 waited. Every size the admin, the
CLI and the metrics show is :meth:`Lanes.size` (``Queue.size``, ``QueueRow``, ``Stats``): the list's
jobs (a doorbell the fetch drops is none) and the lanes'.

A queue's groups are its ring's members and its paused set's (a paused group is out of the ring,
its jobs still wait). Reading them takes two round trips for any number of queues: the ring, the
paused set and the priorities' count of each, then the length of each group's list. A lane key of
the wrong type is counted as empty and named in ``poisoned`` (the key guard moves it aside:
engine/recovery/key_guard.py); nothing here raises on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..broker.keys.families import lane_keys
from ..broker.types import RedisClient

BATCH = 10_000  # group lengths read per pipeline
QUEUE_BATCH = 10_000  # queues read per pipeline (five commands each), as api/stats.py's sizes

# The lanes' names are their queue key with these suffixes (families.py's lane_keys): applied to the
# queue key as bytes, a queue name that isn't UTF-8 has its lanes read too.
_SUFFIX = lane_keys("")
RING, PAUSED, PRIO, GROUP = (s.encode() for s in (_SUFFIX.ring, _SUFFIX.paused, _SUFFIX.prio, _SUFFIX.group_prefix))


BELL = b'{"lane":"bell"'  # (the doorbell's opening text: broker/scripts/lanes.py)


def lane_key(queue_key: bytes | str, suffix: bytes) -> bytes:
    return (queue_key.encode() if isinstance(queue_key, str) else queue_key) + suffix


def group_key(queue_key: bytes | str, group: bytes) -> bytes:
    return lane_key(queue_key, GROUP) + group


@dataclasses.dataclass
class Lanes:
    """One queue's lanes: each group's waiting count (its id as stored -> its list's length), the
    paused group ids, the prioritized jobs' count, and which lane keys hold the wrong type (each
    said as "ring", "paused", "prio" or "group <id>", with the type found when it was read)."""

    groups: dict[bytes, int] = dataclasses.field(default_factory=dict)
    paused: set[bytes] = dataclasses.field(default_factory=set)
    prioritized: int = 0
    poisoned: list[str] = dataclasses.field(default_factory=list)
    poisoned_groups: dict[bytes, str] = dataclasses.field(default_factory=dict)  # group id -> what it held
    bells: int = 0  # doorbells seen at either end of the queue's list: entries, not jobs (at most one)

    @property
    def waiting(self) -> int:
        """The jobs waiting in the lanes: every group's, and the prioritized."""
        return sum(self.groups.values()) + self.prioritized

    def size(self, list_length: int) -> int:
        """The queue's jobs waiting, its list being ``list_length`` long: the list's jobs (a doorbell
        is no job) and the lanes'."""
        return max(list_length - self.bells, 0) + self.waiting


def read(redis: RedisClient, queue_keys: Sequence[bytes | str]) -> list[Lanes]:
    """The lanes of each queue (by its list's key), in two pipelined round trips (a few more past
    BATCH commands)."""
    first: list[Any] = []
    for i in range(0, len(queue_keys), QUEUE_BATCH):
        pipe = redis.pipeline(transaction=False)
        for key in queue_keys[i:i + QUEUE_BATCH]:
            pipe.lrange(lane_key(key, RING), 0, -1)
            pipe.smembers(lane_key(key, PAUSED))
            pipe.zcard(lane_key(key, PRIO))
            # A doorbell is written only into an empty list (a push with a lane, a resume): it is at
            # one end until a fetch drops it, unless a job came back to the fetched end and one was
            # pushed at the other meanwhile (no fetcher running): then it is counted as a job.
            pipe.lindex(key, 0)
            pipe.lindex(key, -1)
        first += pipe.execute(raise_on_error=False)
    found: list[Lanes] = []
    wanted: list[tuple[Lanes, bytes, bytes]] = []  # (its queue's Lanes, group id, group key)
    for index, key in enumerate(queue_keys):
        ring, paused, prio, head, tail = first[5 * index:5 * index + 5]
        lanes = Lanes(bells=int(any(isinstance(end, bytes) and end.startswith(BELL) for end in (head, tail))))
        if isinstance(ring, Exception):
            lanes.poisoned.append(f"ring ({_wrong(ring)})")
            ring = []
        if isinstance(paused, Exception):
            lanes.poisoned.append(f"paused ({_wrong(paused)})")
            paused = set()
        if isinstance(prio, Exception):
            lanes.poisoned.append(f"prio ({_wrong(prio)})")
        else:
            lanes.prioritized = int(prio)
        lanes.paused = set(paused)
        for group in dict.fromkeys([*ring, *sorted(paused)]):
            if group:  # ("" is the ungrouped jobs' turn: they wait in the queue's own list)
                wanted.append((lanes, group, group_key(key, group)))
        found.append(lanes)
    replies: list[Any] = []
    for i in range(0, len(wanted), BATCH):
        pipe = redis.pipeline(transaction=False)
        for _lanes, _group, key in wanted[i:i + BATCH]:
            pipe.llen(key)
        replies += pipe.execute(raise_on_error=False)
    for (lanes, group, _key), size in zip(wanted, replies, strict=True):
        if isinstance(size, Exception):
            lanes.poisoned.append(f"group {group.decode('utf-8', 'backslashreplace')} ({_wrong(size)})")
            lanes.poisoned_groups[group] = _wrong(size)
            size = 0
        lanes.groups[group] = int(size)
    return found


def _wrong(error: Exception) -> str:
    """What a read of a lane key got, said short: a key of the wrong type is the usual."""
    text = str(error)
    return "holds another type" if "WRONGTYPE" in text else text[:80]


def clear(redis: RedisClient, queue_key: bytes | str, *, watch: bool = True) -> int:
    """Delete every job waiting in a queue's lanes (its groups' lists, its priorities, its ring);
    return how many there were (less a doorbell in its list, which the caller deletes with it). The
    paused groups stay paused: a pause is a setting, not a job.

    The ring and the paused set are WATCHed between reading the groups and deleting them: a group
    the fetch adds meanwhile would have lost its ring entry with its list left, its jobs then in no
    turn (tried again up to 5 times). On a cluster (``watch`` False: its pipelines take no WATCH)
    the deletes are one MULTI of the queue's slot, unwatched."""
    import redis as redis_lib

    ring_key, paused_key = lane_key(queue_key, RING), lane_key(queue_key, PAUSED)
    for _attempt in range(5):
        with redis.pipeline(transaction=True) as pipe:
            try:
                if watch:
                    pipe.watch(ring_key, paused_key)
                lanes = read(redis, [queue_key])[0]
                pipe.multi()
                for group in lanes.groups:
                    pipe.delete(group_key(queue_key, group))
                pipe.delete(ring_key, lane_key(queue_key, PRIO))
                pipe.execute()
                return lanes.waiting - lanes.bells  # (the bell deleted with the list is no job)
            except redis_lib.WatchError:
                continue
    raise RuntimeError("the queue's groups changed five times while it was being cleared: try again")
