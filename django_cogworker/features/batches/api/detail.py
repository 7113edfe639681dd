"""One batch as operators see it: ``BatchSummary``, its counts and state (read for a page of them
in one pipeline), and ``BatchDetail``, the whole of it: its summary, its jobs where they are now
(``BatchJob``), its child batches and where its callbacks are (``BatchCallback``). The listing of
every batch is ``BatchSet`` (api/__init__.py).

Bounded whatever the batch's size. A summary reads counts (SCARD, HLEN) and a few fields of the
meta hash, never the hash of failures (``batches.read_status`` reads it whole: 100,000 jobs failing
after an outage are 30 MB of records). A detail lists at most JOB_LIMIT jobs, the dead and failing
first with their errors, and counts the rest; at most CHILD_LIMIT child batches; it walks at most
MEMBER_SCAN_LIMIT members for each; and looks for at most CALLBACK_LOOKUPS fired callbacks in retry
and dead (``SortedSet.entry``, a bounded scan). The limits are read here at call time: a test
patches them on this module.

Where a job is comes from the batch's sets, with no look-up per job: in ``jobs`` only, it succeeded;
in ``pending``, it waits or runs; in ``failed`` too, its last run failed (it waits in retry, or was
discarded: ``dead=False``); in ``dead`` too, it is in the dead set.

A key of the batch of the wrong type is read as empty and named in ``poisoned`` (the next worker
step that meets it moves it to quarantine); one moved there already is named in ``lost`` (its
``lost:<name>`` note in meta): what it counted is gone (docs/batches.md). Neither is ever an error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from ....api._base import _Budget, _defaults, _number, _text, _walk
from ....api.records import read_leniently
from ....api.sorted_entry import SortedEntry
from ....api.sorted_sets import DeadSet, RetrySet
from ....broker.keys import BatchKeys, Keys
from ....broker.quarantine import is_wrong_type
from ....broker.types import RedisClient
from ....push import payload as payloads
from ...encryption import codec
from ...results import records as results
from ..batch import EVENTS

JOB_LIMIT = 500  # jobs a detail lists at most (the counts say how many more)
CHILD_LIMIT = 100  # child batches a detail lists at most
MEMBER_SCAN_LIMIT = 50_000  # members a detail walks at most finding its jobs, and again its children
CALLBACK_LOOKUPS = 12  # fired callbacks a detail looks for in retry and dead (each a bounded scan)
STATES = ("incomplete", "complete_with_failures", "succeeded")
JOB_STATES = ("dead", "failing", "waiting", "succeeded")
_FIELDS = ("description", "created_at", "parent", "committed", "done_complete", "done_success", "done_death",
           *(f"lost:{name}" for name in BatchKeys._fields))


def _json(text: bytes) -> Any:
    """The JSON in ``text``; None if it isn't."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _int(value: Any) -> int:  # (a count from a pipeline's reply; 0 for an error: a key of the wrong type)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclasses.dataclass
class BatchSummary:
    """One batch's counts and state, as ``Batch.status`` has them (its field names), without its failures."""

    bid: str
    description: str
    created_at: float | None
    parent: str | None
    total: int  # jobs and child batches ever added
    pending: int  # not succeeded yet
    failures: int  # pending whose last run failed (the dead among them)
    dead: int
    committed: bool  # a jobs() block closed: its events may fire (one still open holds them)
    complete: bool
    success: bool
    death: bool
    completed_at: float | None = None
    succeeded_at: float | None = None
    died_at: float | None = None
    lost: list[str] = dataclasses.field(default_factory=list)  # keys moved to quarantine: their counts gone
    poisoned: list[str] = dataclasses.field(default_factory=list)  # keys of the wrong type now: read as empty

    @property
    def succeeded(self) -> int:
        return max(self.total - self.pending, 0)

    @property
    def failing(self) -> int:
        """Failing and not dead: waiting in retry (or discarded)."""
        return max(self.failures - self.dead, 0)

    @property
    def waiting(self) -> int:
        """Pending and not failing: waiting in a queue or scheduled, or running."""
        return max(self.pending - self.failures, 0)

    @property
    def state(self) -> str:
        """One of STATES: "succeeded", "complete_with_failures" (every job ran, some are failing or
        dead: it may still succeed, as retries do), or "incomplete"."""
        return "succeeded" if self.success else "complete_with_failures" if self.complete else "incomplete"

    @property
    def bar(self) -> list[tuple[str, float, int]]:
        """A progress bar's segments: (kind, percent of the total, count) of succeeded, failing, dead."""
        return [(kind, round(100.0 * count / (self.total or 1), 1), count)
                for kind, count in (("succeeded", self.succeeded), ("failing", self.failing), ("dead", self.dead))]

    @classmethod
    def read(cls, bids: list[str], *, redis: RedisClient | None = None,
             keys: Keys | None = None) -> list[BatchSummary | None]:
        """The summaries of ``bids``, in one round trip; None for a batch whose data expired."""
        redis, keys = _defaults(redis, keys)
        if not bids:
            return []
        pipe = redis.pipeline(transaction=False)
        for bid in bids:
            bk = keys.batch(bid)
            pipe.hmget(bk.meta, _FIELDS)
            pipe.scard(bk.jobs)
            pipe.scard(bk.pending)
            pipe.hlen(bk.failed)
            pipe.scard(bk.dead)
        replies = pipe.execute(raise_on_error=False)
        return [cls._from(bid, *replies[5 * i:5 * i + 5]) for i, bid in enumerate(bids)]

    @classmethod
    def _from(cls, bid: str, meta: Any, total: Any, pending: Any, failures: Any, dead: Any) -> BatchSummary | None:
        poisoned = [name for name, reply in (("meta", meta), ("jobs", total), ("pending", pending),
                                             ("failed", failures), ("dead", dead)) if is_wrong_type(reply)]
        meta = [None] * len(_FIELDS) if "meta" in poisoned else meta
        if not isinstance(meta, list):
            return None
        description, created_at, parent, committed, complete, success, death = meta[:7]
        lost = [name for name, note in zip(BatchKeys._fields, meta[7:], strict=True) if note is not None]
        if created_at is None and not lost and "meta" not in poisoned:  # (expired, or a stray step's field)
            return None
        return cls(bid, _text(description or b""), _number(created_at), _text(parent) if parent else None,
                   _int(total), _int(pending), _int(failures), _int(dead), committed == b"1",
                   complete is not None, success is not None, death is not None,
                   _number(complete), _number(success), _number(death), lost, poisoned)


@dataclasses.dataclass
class BatchJob:
    """One job of a batch where it is now: ``state`` one of JOB_STATES; ``failure`` its last failure
    ({class, error, message, at}) while it is failing or dead."""

    jid: str  # a jid, or "b:<bid>" for a child batch
    state: str
    failure: dict[str, Any] | None = None

    @property
    def child(self) -> str | None:
        """The bid of the child batch this member stands for, or None for a job."""
        return self.jid[2:] if self.jid.startswith("b:") else None


@dataclasses.dataclass
class BatchCallback:
    """A callback of a batch and where it is: ``state`` "not fired", "fired" (written to the batch's
    outbox, not in its queue yet) or "pushed"; once pushed, ``where`` it was found ("retry" or
    "dead", with ``entry``), or None (waiting, running, done; or not looked for: ``looked``)."""

    event: str
    jid: str
    queue: str
    job_class: str
    options: dict[str, Any] | str  # ("(encrypted)" for a callback whose job encrypts: features/encryption/codec.py)
    state: str
    fired_at: float | None = None
    where: str | None = None
    entry: SortedEntry | None = None
    result: results.JobResult | None = None
    looked: bool = False


@dataclasses.dataclass
class BatchDetail:
    """One batch, bounded (the module's header): ``jobs`` the dead, failing, waiting, then succeeded
    ones, at most JOB_LIMIT; ``children`` (bid, summary, None when expired); ``callbacks``."""

    summary: BatchSummary
    jobs: list[BatchJob]
    children: list[tuple[str, BatchSummary | None]]
    callbacks: list[BatchCallback]
    complete: bool  # every member was walked (else the counts still hold; the lists may lack some)

    def tally(self) -> list[tuple[str, int, int]]:
        """(state, how many jobs are in it, how many of those are listed) for each of JOB_STATES."""
        s = self.summary
        counts = {"dead": s.dead, "failing": s.failing, "waiting": s.waiting, "succeeded": s.succeeded}
        return [(state, counts[state], sum(job.state == state for job in self.jobs)) for state in JOB_STATES]

    @classmethod
    def read(cls, bid: str, *, redis: RedisClient | None = None, keys: Keys | None = None) -> BatchDetail | None:
        """Batch ``bid``, or None when it never was or its data expired."""
        redis, keys = _defaults(redis, keys)
        (summary,) = BatchSummary.read([bid], redis=redis, keys=keys)
        if summary is None:
            return None
        bk, budget = keys.batch(bid), _Budget(MEMBER_SCAN_LIMIT)
        jobs = _jobs(redis, bk, summary, budget)
        children, walked = _children(redis, keys, bk, summary)
        return cls(summary, jobs, children, _callbacks(redis, keys, bk, summary), budget.complete and walked)


def _jobs(redis: RedisClient, bk: BatchKeys, summary: BatchSummary, budget: _Budget) -> list[BatchJob]:
    """Up to JOB_LIMIT jobs: the dead, then the failing (the latest failure first of each), then
    the waiting (or running), then the succeeded."""
    rows: list[BatchJob] = []
    readable = set(BatchKeys._fields) - set(summary.poisoned)  # (one of the wrong type is read as empty)
    if "dead" in readable:
        _fill(rows, redis, bk.dead, budget, "dead", lambda jids: jids)
    failing: dict[str, Any] = {}
    listed = {row.jid for row in rows}
    walked = summary.failing and len(rows) < JOB_LIMIT and "failed" in readable
    for pairs in _walk(redis, bk.failed, budget, hash_=True) if walked else ():
        failing.update((_text(jid), record) for jid, record in pairs if _text(jid) not in listed)
        if len(rows) + len(failing) >= JOB_LIMIT:
            break
    records = redis.hmget(bk.failed, [row.jid for row in rows]) if rows and "failed" in readable else []
    for row, record in zip(rows, records, strict=False):
        row.failure = _failure(record)
    rows += [BatchJob(jid, "failing", _failure(record)) for jid, record in failing.items()]
    rows.sort(key=lambda row: (row.state != "dead", -(_number((row.failure or {}).get("at")) or 0.0)))
    del rows[JOB_LIMIT:]
    if summary.waiting and "pending" in readable:
        every_failing_read = len(failing) >= summary.failing  # (else a pending one may be failing, unread)
        _fill(rows, redis, bk.pending, budget, "waiting",
              lambda jids: jids if every_failing_read else _absent(redis, bk.failed, jids, hash_=True))
    if summary.succeeded and {"jobs", "pending"} <= readable:
        _fill(rows, redis, bk.jobs, budget, "succeeded", lambda jids: _absent(redis, bk.pending, jids))
    return rows


def _failure(record: Any) -> dict[str, Any] | None:
    """A failure's record (JSON {class, error, message, at}), read leniently; None for none."""
    return None if record is None else read_leniently(record) or {"message": _text(record)}


def _fill(rows: list[BatchJob], redis: RedisClient, key: str, budget: _Budget, state: str,
          keep: Callable[[list[str]], list[str]]) -> None:
    """Add to ``rows``, up to JOB_LIMIT, the members of ``key`` not listed yet that ``keep`` keeps."""
    listed = {row.jid for row in rows}
    if len(rows) >= JOB_LIMIT:
        return
    for members in _walk(redis, key, budget):
        fresh = [m for m in dict.fromkeys(_text(m) for m in members) if m not in listed]
        kept = keep(fresh)[:JOB_LIMIT - len(rows)] if fresh else []
        rows += [BatchJob(jid, state) for jid in kept]
        listed.update(kept)
        if len(rows) >= JOB_LIMIT:
            return


def _absent(redis: RedisClient, key: str, jids: list[str], *, hash_: bool = False) -> list[str]:
    """Those of ``jids`` that the set (or the hash's fields) ``key`` doesn't hold, in one round trip."""
    there = redis.hmget(key, jids) if hash_ else redis.smismember(key, jids)
    return [jid for jid, found in zip(jids, there, strict=True) if not found]


def _children(redis: RedisClient, keys: Keys, bk: BatchKeys,
              summary: BatchSummary) -> tuple[list[tuple[str, BatchSummary | None]], bool]:
    """(up to CHILD_LIMIT child batches with their summaries, whether every member was walked)."""
    budget = _Budget(MEMBER_SCAN_LIMIT)
    bids: list[str] = []
    for members in _walk(redis, bk.jobs, budget, match="b:*") if "jobs" not in summary.poisoned else ():
        bids += [m for m in (_text(member)[2:] for member in members) if m not in bids]
        if len(bids) >= CHILD_LIMIT:
            break
    bids = sorted(bids[:CHILD_LIMIT])
    return list(zip(bids, BatchSummary.read(bids, redis=redis, keys=keys), strict=True)), budget.complete


def _callbacks(redis: RedisClient, keys: Keys, bk: BatchKeys, summary: BatchSummary) -> list[BatchCallback]:
    """Every callback of the batch, and, for those pushed, where it is now (when found)."""
    pipe = redis.pipeline(transaction=False)
    pipe.hmget(bk.meta, [f"cb:{event}" for event in EVENTS])
    pipe.lrange(bk.outbox, 0, -1)
    stored, outbox = pipe.execute(raise_on_error=False)
    summary.poisoned += [name for name, reply in (("meta", stored), ("outbox", outbox))
                         if is_wrong_type(reply) and name not in summary.poisoned]
    stored = stored if isinstance(stored, list) else [None] * len(EVENTS)
    waiting = {entry[1] for entry in map(_json, outbox if isinstance(outbox, list) else [])
               if isinstance(entry, list) and len(entry) == 3}
    fired = {"complete": (summary.complete, summary.completed_at), "success": (summary.success, summary.succeeded_at),
             "death": (summary.death, summary.died_at)}
    found = []
    for event, text in zip(EVENTS, stored, strict=True):
        entries = _json(text) if text else []
        for queue, jid, template in entries if isinstance(entries, list) else []:
            payload = read_leniently(template.encode())
            state = "not fired" if not fired[event][0] else "fired" if jid in waiting else "pushed"
            kwargs = payload.get("kwargs")
            options = codec.SHOWN if codec.FIELD in payload else kwargs if isinstance(kwargs, dict) else {}
            found.append(BatchCallback(event, jid, queue, str(payload.get("class", payloads.UNPARSEABLE_CLASS)),
                                       options, state, fired[event][1]))
    retries, dead = RetrySet(redis=redis, keys=keys), DeadSet(redis=redis, keys=keys)
    for callback in [c for c in found if c.state == "pushed"][:CALLBACK_LOOKUPS]:
        callback.looked = True
        for name, zset in (("retry", retries), ("dead", dead)):
            callback.entry = zset.entry(callback.jid)
            if callback.entry is not None:
                callback.where = name
                break
        callback.result = results.read(redis, keys, callback.jid)
    return found

