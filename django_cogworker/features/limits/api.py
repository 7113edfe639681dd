"""Limiters as operators see them (``limits/`` makes and enforces them): ``LimitSet``, every limiter
key in ``keys.limits``, the most recently used first; ``LimitState``, one key: its spec, how much of
it is in use now, its live holders, its totals and its recent refusals and reschedules.

"Now" is Redis's TIME, never this machine's clock: holders' leases and buckets are scored by the
workers in Redis time, and a web host whose clock runs a minute behind showed expired leases as
live. What "in use" means follows the kind (the data model: features/limits/scripts.py):

- concurrent: live holders (lease end > now) in ``holders``;
- bucket: ``bc``, the starts of bucket ``bn`` of ``state``, when ``bn`` is the current bucket
  (floor(now / per)), else 0;
- window: starts in ``starts`` within the last ``per`` seconds;
- leaky: places the theoretical arrival time (``tat`` of ``state``) is ahead of now, in emission
  intervals (``per / size``), at most ``size``.

The recent figures come from the ring the scripts keep in ``stats`` (``o<slot>``, ``r<slot>``,
and ``m<slot>`` the minute each slot counts, slot = minute % 60): a slot whose minute is past
the last RECENT_LONG counts for nothing.

A key of the limiter of the wrong type reads as empty and is named in ``poisoned`` (the next
take, release or beat that meets it moves it to quarantine); one moved there already is named
in ``lost`` (its ``lost:<name>`` note in ``stats``). Neither is ever an error.

Bounded whatever the fleet: a page reads its keys (at most MAX_PER_PAGE) in three round trips,
and lists at most HOLDER_LIMIT holders of a key (``in_use`` still counts them all).
``LimitSet.families`` (the metrics) reads the FAMILY_KEY_LIMIT most recently used keys, a
pipeline per FAMILY_CHUNK.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

from ...api._base import _clamp_page, _defaults, _number, _text
from ...api.records import Page
from ...broker.keys import Keys, LimitKeys
from ...broker.quarantine import is_wrong_type
from ...broker.types import RedisClient

HOLDER_LIMIT = 500  # holders a key's page lists at most (in_use counts them all)
LISTED_HOLDERS = 5  # holders a listing row shows
RECENT_SHORT, RECENT_LONG = 5, 60  # minutes summed for the "recent" figures (the ring holds 60)
TOTALS = ("granted", "over", "rescheduled", "expired", "failed")
KINDS = ("concurrent", "bucket", "window", "leaky")
FAMILY_KEY_LIMIT = 10_000  # the most recently used keys ``families`` reads
FAMILY_CHUNK = 500  # keys per pipeline in ``families``


def redis_now(redis: RedisClient) -> float:
    """Redis's clock (TIME), in epoch seconds."""
    seconds, micros = redis.time()
    return int(seconds) + int(micros) / 1_000_000


@dataclasses.dataclass
class Holder:
    """A live holder of a concurrency limit: the job (None for a ``within`` block outside a job),
    the process that holds it, since when, and when its lease lapses unless renewed."""

    jid: str | None
    process: str
    since: float | None
    expires_at: float


@dataclasses.dataclass
class Recent:
    """Refusals (``over``) and jobs sent back to the schedule (``rescheduled``) in the last
    RECENT_SHORT and RECENT_LONG minutes (the current minute included)."""

    over_5m: int = 0
    over_60m: int = 0
    rescheduled_5m: int = 0
    rescheduled_60m: int = 0


@dataclasses.dataclass
class LimitState:
    """One limiter key now. ``kind`` is "unknown" for a key whose spec isn't stored (a worker of
    an older version used it, or ``limit_specs`` was cleared): its totals still read."""

    key: str
    kind: str
    size: int | None
    per: float | None
    lease: float | None
    family: str
    in_use: int
    holders: list[Holder]
    waiting: int  # (concurrent) jobs refused, parked until a place is given back

    totals: dict[str, int]
    recent: Recent
    last_used: float | None
    now: float  # Redis time of the read
    lost: list[str] = dataclasses.field(default_factory=list)  # its keys moved to quarantine (LimitKeys names)
    poisoned: list[str] = dataclasses.field(default_factory=list)  # its keys of the wrong type now: read as empty

    @property
    def full(self) -> bool:
        return self.size is not None and self.in_use >= self.size

    @property
    def percent(self) -> float:
        """Of its size in use now, 0 to 100 (a lease not yet expired past a lowered size reads 100)."""
        if not self.size:
            return 0.0
        return round(min(100.0 * self.in_use / self.size, 100.0), 1)

    @property
    def level(self) -> str:
        """For the bar's colour: "full", "high" (80 % or more) or "ok"."""
        return "full" if self.full else "high" if self.percent >= 80 else "ok"

    @property
    def more_holders(self) -> int:
        """Live holders not listed (concurrent keys hold ``in_use`` of them)."""
        return max(self.in_use - len(self.holders), 0) if self.kind == "concurrent" else 0

    @classmethod
    def read(cls, keys_used: list[tuple[str, float | None]], *, holders: int = HOLDER_LIMIT,
             redis: RedisClient | None = None, keys: Keys | None = None,
             now: float | None = None) -> list[LimitState]:
        """The states of these (key, last used) in two round trips: their specs, then the rest."""
        redis, keys = _defaults(redis, keys)
        if not keys_used:
            return []
        now = redis_now(redis) if now is None else now
        names = [key for key, _ in keys_used]
        pipe = redis.pipeline(transaction=False)
        pipe.hmget(keys.limit_specs, names)
        (stored,) = pipe.execute(raise_on_error=False)  # (of the wrong type: every spec unknown)
        specs = [_spec(raw) for raw in (stored if isinstance(stored, list) else [None] * len(names))]
        pipe = redis.pipeline(transaction=False)
        listing = []  # whether each key's holders are read (the replies are cut by position)
        read: list[list[str]] = []  # which of its keys each reply reads (LimitKeys names)
        for key, spec in zip(names, specs, strict=True):
            lk = keys.limit(key)
            pipe.hgetall(lk.stats)
            read.append(["stats", _queue_in_use(pipe, lk, spec, now), "waiting"])
            pipe.zcard(lk.waiting)
            listing.append(spec["kind"] in ("concurrent", "unknown") and holders > 0)
            if listing[-1]:
                read[-1].append("holders")
                pipe.zrangebyscore(lk.holders, f"({now!r}", "+inf", start=0, num=holders, withscores=True)
        replies = iter(pipe.execute(raise_on_error=False))
        states = []
        for (key, used), spec, listed, names_read in zip(keys_used, specs, listing, read, strict=True):
            got = [next(replies) for _ in names_read]
            stats, in_use, waiting = got[:3]
            state = cls._from(key, used, spec, stats, in_use, got[3] if listed else [], now, _count(waiting))
            state.poisoned = sorted({name for name, reply in zip(names_read, got, strict=True) if is_wrong_type(reply)})
            states.append(state)
        return states

    @classmethod
    def _from(cls, key: str, used: float | None, spec: dict[str, Any], stats: Any, in_use: Any, listed: Any,
              now: float, waiting: int = 0) -> LimitState:
        # (not a dict: an error reply, a key of the wrong type)
        stats = {_text(field): value for field, value in stats.items()} if isinstance(stats, dict) else {}
        totals = {name: _count(stats.get(name)) for name in TOTALS}
        lost = [name for name in LimitKeys._fields if f"lost:{name}" in stats]
        return cls(key, spec["kind"], spec["size"], spec["per"], spec["lease"], spec["family"] or key,
                   _in_use(spec, in_use, now), _holders(listed), waiting, totals, _recent(stats, now), used, now,
                   lost)


def _recent(stats: dict[str, Any], now: float) -> Recent:
    """Sum the ring's slots (``m<slot>``: the minute the slot counts) of the last minutes."""
    minute, shown = math.floor(now / 60), Recent()
    for slot in range(60):
        counted = _number(stats.get(f"m{slot}"))
        if counted is None or not 0 <= minute - counted < RECENT_LONG:
            continue  # (never used, or a slot of an hour ago: not yet written over)
        over, rescheduled = _count(stats.get(f"o{slot}")), _count(stats.get(f"r{slot}"))
        shown.over_60m += over
        shown.rescheduled_60m += rescheduled
        if minute - counted < RECENT_SHORT:
            shown.over_5m += over
            shown.rescheduled_5m += rescheduled
    return shown


def _spec(raw: Any) -> dict[str, Any]:
    """A stored spec (JSON), read leniently: what is missing or wrong reads as None ("unknown" kind)."""
    try:
        found = json.loads(raw) if raw is not None else {}
    except ValueError:
        found = {}
    found = found if isinstance(found, dict) else {}
    size, per, lease = (_number(found.get(name)) for name in ("size", "per", "lease"))
    family = found.get("family")
    return {"kind": found.get("kind") if found.get("kind") in KINDS else "unknown",
            "size": int(size) if size is not None else None, "per": per if per and per > 0 else None,
            "lease": lease, "family": family if isinstance(family, str) and family else None}


def _queue_in_use(pipe: Any, lk: Any, spec: dict[str, Any], now: float) -> str:
    """Queue the one command whose reply ``_in_use`` reads, by kind; return the name of its key."""
    kind, per = spec["kind"], spec["per"]
    if kind == "bucket":
        pipe.hmget(lk.state, ["bn", "bc"])
        return "state"
    if kind == "window" and per:
        pipe.zcount(lk.starts, f"({now - per!r}", "+inf")
        return "starts"
    if kind == "leaky":
        pipe.hget(lk.state, "tat")
        return "state"
    pipe.zcount(lk.holders, f"({now!r}", "+inf")  # concurrent, or unknown: its live holders, if any
    return "holders"


def _in_use(spec: dict[str, Any], reply: Any, now: float) -> int:
    if spec["kind"] == "bucket":  # (bc counts bucket bn: an older bucket's count is no use now)
        bucket, count = reply if isinstance(reply, list) else (None, None)
        current = spec["per"] and _number(bucket) == math.floor(now / spec["per"])
        return _count(count) if current else 0
    if spec["kind"] != "leaky":
        return _count(reply)
    tat, size, per = _number(reply), spec["size"], spec["per"]
    if tat is None or not size or not per or tat <= now:
        return 0
    # (rounded first: 2.0000000001 intervals ahead is 2 places, not 3)
    return min(math.ceil(round((tat - now) / (per / size), 6)), size)


def _holders(reply: Any) -> list[Holder]:
    found = []
    for member, score in reply if isinstance(reply, list) else []:
        try:
            holder = json.loads(member)
        except ValueError:
            holder = None
        holder = holder if isinstance(holder, dict) else {"process": _text(member)}
        jid = holder.get("jid")
        found.append(Holder(jid if isinstance(jid, str) and jid else None, _text(holder.get("process", "?")),
                            _number(holder.get("since")), float(score)))
    return found


def _count(value: Any) -> int:
    """A counter as stored (bytes, int, None); 0 when it isn't one."""
    number = _number(value)
    return int(number) if number is not None else 0


@dataclasses.dataclass
class FamilyTotals:
    """One limiter family, summed over its keys (the metrics' rows). ``size``: the static name's
    size (a family of one key named as the family), else None (each key may be sized alike, but
    their sum means nothing)."""

    family: str
    keys: int = 0
    in_use: int = 0
    waiting: int = 0
    size: int | None = None
    totals: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(TOTALS, 0))


class LimitSet:
    """``keys.limits``: every limiter key a worker used (key -> when last used, Redis time), the
    most recently used first; ``limit_specs`` holds each one's spec."""

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None):
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.limits

    def size(self) -> int:
        return int(self.redis.zcard(self.key))

    def page(self, page: int = 1, per_page: int = 25, *, holders: int = LISTED_HOLDERS) -> Page:
        """One page of ``LimitState``, the most recently used first, each with ``holders`` listed."""
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.zrevrange(self.key, start, start + per_page - 1, withscores=True)
        pipe.zcard(self.key)
        (seconds, micros), listed, total = pipe.execute()
        rows = LimitState.read([(_text(member), score) for member, score in listed], holders=holders,
                               redis=self.redis, keys=self.keys, now=int(seconds) + int(micros) / 1_000_000)
        return Page(rows, page, per_page, int(total))

    def get(self, key: str, *, holders: int = HOLDER_LIMIT) -> LimitState | None:
        """Key ``key`` with up to ``holders`` holders; None when neither listed nor specified."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zscore(self.key, key)
        pipe.hexists(self.keys.limit_specs, key)
        used, specified = pipe.execute(raise_on_error=False)
        used = None if isinstance(used, Exception) else used  # (the index of the wrong type: unknown)
        if used is None and not (specified is True or is_wrong_type(specified)):
            return None
        (state,) = LimitState.read([(key, used)], holders=holders, redis=self.redis, keys=self.keys)
        return state

    def families(self, limit: int | None = None) -> list[FamilyTotals]:
        """Every family of the ``limit`` (FAMILY_KEY_LIMIT) most recently used keys, summed, by name."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.zrevrange(self.key, 0, (FAMILY_KEY_LIMIT if limit is None else limit) - 1, withscores=True)
        (seconds, micros), listed = pipe.execute()
        now = int(seconds) + int(micros) / 1_000_000
        found: dict[str, FamilyTotals] = {}
        for chunk in _chunks([(_text(member), score) for member, score in listed], FAMILY_CHUNK):
            for state in LimitState.read(chunk, holders=0, redis=self.redis, keys=self.keys, now=now):
                family = found.setdefault(state.family, FamilyTotals(state.family))
                family.keys += 1
                family.in_use += state.in_use
                family.waiting += state.waiting
                for name, count in state.totals.items():
                    family.totals[name] += count
                if state.key == state.family:
                    family.size = state.size
        for family in found.values():
            family.size = family.size if family.keys == 1 else None
        return sorted(found.values(), key=lambda f: f.family)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
