"""A queue's lanes as the listings count them: the jobs waiting in its groups' lists and in its
priorities (broker/keys/families.py's LaneKeys), which the queue's own list doesn't hold.

A grouped job leaves the queue's list for its group's at its first fetch, and a prioritized one is
never in it: a size read from the list alone showed 0 while 5,000 waited. Every size the admin, the
CLI and the metrics show is :meth:`Lanes.size` (``Queue.size``, ``QueueRow``, ``Stats``): the list's
jobs (a doorbell the fetch drops is none) and the lanes'.

A queue's groups are its ring's members and its paused set's (a paused group is out of the ring,
its jobs still wait). They are counted in Redis, by LANE_SIZES (broker/scripts/lane_sizes.py): one
script call a queue, all queues' calls pipelined, returns its groups' count, the jobs in them, the
prioritized, and when asked its busiest groups; a queue of more than BUDGET groups takes a call more
per BUDGET groups (each call holds Redis a few milliseconds). Reading a group's lengths from Python
took an LLEN per group: 3.8 s for the admin's page of a queue of 100,000 groups. A lane key of the
wrong type is counted as empty and named in ``poisoned`` (the key guard moves it aside:
engine/recovery/key_guard.py); nothing here raises on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..broker.keys.families import lane_keys
from ..broker.scripts.lane_sizes import BUDGET, LANE_SIZES
from ..broker.types import RedisClient

CLEAR_CHUNK = 1_000  # group lists deleted per MULTI by clear
QUEUE_BATCH = 10_000  # queues read per pipeline (a script call and two LINDEX each), as api/stats.py's sizes

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
class GroupSize:
    """One group as a read saw it: its id as stored, its jobs waiting, whether it is paused, and what
    its list holds instead of jobs (None: nothing wrong)."""

    id: bytes
    waiting: int
    paused: bool
    poisoned: str | None = None


@dataclasses.dataclass
class Lanes:
    """One queue's lanes: how many groups (waiting or paused) and paused groups it has, the jobs
    waiting in its groups and with a priority, the busiest groups when the read asked for them
    (``busiest``, the most waiting first, then by id), and which lane keys hold the wrong type (each
    said as "ring", "paused", "prio" or "group <id>", with the type found when it was read)."""

    group_count: int = 0
    paused_count: int = 0
    grouped: int = 0  # jobs waiting in its groups' lists
    prioritized: int = 0
    busiest: list[GroupSize] = dataclasses.field(default_factory=list)
    poisoned: list[str] = dataclasses.field(default_factory=list)
    poisoned_groups: dict[bytes, str] = dataclasses.field(default_factory=dict)  # group id -> what it held
    bells: int = 0  # doorbells seen at either end of the queue's list: entries, not jobs (at most one)

    @property
    def waiting(self) -> int:
        """The jobs waiting in the lanes: every group's, and the prioritized."""
        return self.grouped + self.prioritized

    def size(self, list_length: int) -> int:
        """The queue's jobs waiting, its list being ``list_length`` long: the list's jobs (a doorbell
        is no job) and the lanes'."""
        return max(list_length - self.bells, 0) + self.waiting


def rank(group: GroupSize) -> tuple[int, bytes]:
    """The order the listings show groups in: the most waiting first, then by id."""
    return -group.waiting, group.id


def read(redis: RedisClient, queue_keys: Sequence[bytes | str], busiest: int = 0) -> list[Lanes]:
    """The lanes of each queue (by its list's key), with its ``busiest`` busiest groups: one
    LANE_SIZES call a queue, pipelined, in one round trip up to BUDGET groups a queue (one more per
    BUDGET groups of the largest queue past that; a few more past QUEUE_BATCH queues)."""
    found = [Lanes() for _ in queue_keys]
    cursors: dict[int, bytes] = dict.fromkeys(range(len(queue_keys)), b"")
    first = True
    while cursors:
        pending = list(cursors)
        replies: list[Any] = []
        for i in range(0, len(pending), QUEUE_BATCH):
            pipe = redis.pipeline(transaction=False)
            for index in pending[i:i + QUEUE_BATCH]:
                key = queue_keys[index]
                LANE_SIZES.in_pipeline_by_sha(pipe, _keys(key), _args(key, busiest, cursors[index]))
                if first:
                    # A doorbell is written only into an empty list (a push with a lane, a resume): it
                    # is at one end until a fetch drops it, unless a job came back to the fetched end
                    # and one was pushed at the other meanwhile (no fetcher running): then it is
                    # counted as a job.
                    pipe.lindex(key, 0)
                    pipe.lindex(key, -1)
            replies += pipe.execute(raise_on_error=False)
        step = 3 if first else 1
        for n, index in enumerate(pending):
            reply = replies[step * n]
            if isinstance(reply, NoScriptError):  # (a Redis restart or SCRIPT FLUSH: this loads it)
                key = queue_keys[index]
                reply = LANE_SIZES(redis, _keys(key), _args(key, busiest, cursors[index]))
            elif isinstance(reply, Exception):
                raise reply
            lanes = found[index]
            if first:
                lanes.bells = int(any(isinstance(end, bytes) and end.startswith(BELL)
                                      for end in replies[step * n + 1:step * n + 3]))
            _merge(lanes, reply, busiest, first=first)
            if reply[0]:
                cursors[index] = reply[0]
            else:
                del cursors[index]
        first = False
    return found


def _keys(queue_key: bytes | str) -> list[bytes]:
    return [lane_key(queue_key, RING), lane_key(queue_key, PAUSED), lane_key(queue_key, PRIO)]


def _args(queue_key: bytes | str, busiest: int, cursor: bytes) -> list[Any]:
    return [lane_key(queue_key, GROUP), busiest, cursor, BUDGET]


def _merge(lanes: Lanes, reply: list[Any], busiest: int, *, first: bool) -> None:
    """Add one LANE_SIZES reply to what the earlier calls for the queue found."""
    _cursor, groups, paused, prioritized, grouped, errors, poisoned, top = reply
    if first:
        lanes.group_count, lanes.paused_count, lanes.prioritized = int(groups), int(paused), int(prioritized)
        lanes.poisoned += [f"{name} ({error.decode()})" for name, error in zip(("ring", "paused", "prio"), errors,
                                                                               strict=True) if error]
    lanes.grouped += int(grouped)
    for group, error in zip(poisoned[::2], poisoned[1::2], strict=True):
        if group not in lanes.poisoned_groups:
            lanes.poisoned_groups[group] = error.decode()
            lanes.poisoned.append(f"group {group.decode('utf-8', 'backslashreplace')} ({error.decode()})")
    if busiest:
        seen = {g.id: g for g in lanes.busiest}  # (a group the ring turned past the cursor: seen twice)
        for i in range(0, len(top), 4):
            group, waiting, is_paused, error = top[i:i + 4]
            seen[group] = GroupSize(group, int(waiting), bool(is_paused), error.decode() or None)
        lanes.busiest = sorted(seen.values(), key=rank)[:busiest]


def clear(redis: RedisClient, queue_key: bytes | str) -> int:
    """Delete every job waiting in a queue's lanes (its groups' lists, its priorities, its ring);
    return how many there were (less a doorbell in its list, which the caller deletes with it). The
    paused groups stay paused: a pause is a setting, not a job.

    No WATCH: every fetch turns the ring, so a watch on it broke on any busy grouped queue (1,000
    groups and two fetchers: five retries lost, the clear raised). Instead one MULTI reads the ring's
    and paused set's members and deletes the ring and the priorities; then the groups' lists are
    deleted CLEAR_CHUNK at a time. Between the two, a push to a list not yet deleted either finds it
    holding jobs (it joins them, and goes with it) or finds it gone (a fresh list, in a new ring):
    no list is left holding jobs outside a ring. (Every key here is in the queue's slot: on a cluster
    the MULTIs are of that slot.)"""
    ring_key, paused_key, prio_key = (lane_key(queue_key, suffix) for suffix in (RING, PAUSED, PRIO))
    with redis.pipeline(transaction=True) as pipe:
        pipe.lrange(ring_key, 0, -1)
        pipe.smembers(paused_key)
        pipe.zcard(prio_key)
        pipe.lindex(queue_key, 0)
        pipe.lindex(queue_key, -1)
        pipe.delete(ring_key, prio_key)
        ring, paused, prioritized, head, tail, _deleted = pipe.execute(raise_on_error=False)
    # (A key of the wrong type: read as empty; the ring and the priorities are deleted all the same.)
    members = [g for g in dict.fromkeys([*(ring if isinstance(ring, list) else []),
                                         *sorted(paused if isinstance(paused, set) else set())]) if g]
    cleared = prioritized if isinstance(prioritized, int) else 0
    for i in range(0, len(members), CLEAR_CHUNK):
        with redis.pipeline(transaction=True) as pipe:
            for group in members[i:i + CLEAR_CHUNK]:
                pipe.llen(group_key(queue_key, group))
                pipe.delete(group_key(queue_key, group))
            cleared += sum(n for n in pipe.execute(raise_on_error=False)[::2] if isinstance(n, int))
    bells = any(isinstance(end, bytes) and end.startswith(BELL) for end in (head, tail))
    return cleared - int(bells)  # (the bell deleted with the list is no job)
