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


class LaneKeys(NamedTuple):
    """A queue's lanes (grouped jobs taking turns, prioritized jobs in order: docs/fairness.md), named
    from its queue key (``<queue key> lane:...``, the queue's slot on a cluster; a queue name holds no
    space, so no queue's key is one of these). The fetch scripts build the same names from the queue
    key they are given (broker/scripts/lanes.py).

    ring     list  the groups with jobs waiting, and "" (the queue's ungrouped jobs' turn) while any
                   group has: the fetch takes the right end and puts it back at the left (LMOVE
                   ring ring RIGHT LEFT), one job a turn; a group leaves it when its list empties or
                   it is paused; the ring goes when "" is all it holds
    group    list  ``<group prefix><group id>``: one group's waiting payloads, LPUSH in, taken from
                   the right end, like a queue
    paused   set   the group ids paused in this queue: jobs still join their group's list, which
                   stays out of the ring until resumed
    prio     zset  payloads pushed with a priority, scored ``enqueued_at - priority * step`` (step:
                   PRIORITY_AGING seconds, or PRIORITY_STRICT_STEP without aging): the lowest score
                   runs first, and an ungrouped job of the queue list counts as priority 0
    """

    ring: str
    paused: str
    prio: str
    group_prefix: str

    def group(self, group_id: str) -> str:
        return self.group_prefix + group_id

    def expected(self) -> dict[str, Want]:
        """Each fixed key's type (a group's list is a list too)."""
        return {self.ring: Want("list"), self.paused: Want("set"), self.prio: Want("zset")}


def lane_keys(queue_key: str) -> LaneKeys:
    """The lanes of the queue whose list is ``queue_key``."""
    base = queue_key + " lane:"
    return LaneKeys(base + "ring", base + "paused", base + "prio", base + "g:")


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
