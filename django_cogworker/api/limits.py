"""Limiters as operators see them (``limits/`` makes and enforces them): ``LimitSet``, every limiter
key in ``keys.limits``, the most recently used first; ``LimitState``, one key: its spec, how much of
it is in use now, its live holders, its totals and its recent refusals and reschedules.

"Now" is Redis's TIME, never this machine's clock: holders' leases and buckets are scored by the
workers in Redis time, and a web host whose clock runs a minute behind showed expired leases as
live. What "in use" means follows the kind (the data model: broker/keys.py, ``Keys.limit``):

- concurrent: live holders (lease expiry > now) in ``holders``;
- bucket: starts counted in the current bucket, ``count:<floor(now / per)>``;
- window: starts in ``starts`` within the last ``per`` seconds;
- leaky: places the theoretical arrival time ``tat`` is ahead of now, in emission intervals
  (``per / size``), at most ``size``.

Bounded whatever the fleet: a page reads its keys (at most MAX_PER_PAGE) in three round trips,
lists at most HOLDER_LIMIT holders of a key (``in_use`` still counts them all), and sums the
``recent:<minute>`` hashes of the last RECENT_LONG minutes. ``LimitSet.families`` (the metrics)
reads the FAMILY_KEY_LIMIT most recently used keys, a pipeline per FAMILY_CHUNK.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any, cast

from ..broker.keys import Keys
from ..broker.types import RedisClient
from ._base import _clamp_page, _defaults, _number, _text
from .records import Page

HOLDER_LIMIT = 500  # holders a key's page lists at most (in_use counts them all)
LISTED_HOLDERS = 5  # holders a listing row shows
RECENT_SHORT, RECENT_LONG = 5, 60  # minutes summed for the "recent" figures
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
    totals: dict[str, int]
    recent: Recent
    last_used: float | None
    now: float  # Redis time of the read

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
    def read(cls, keys_used: list[tuple[str, float | None]], *, holders: int = HOLDER_LIMIT, recent: bool = True,
             redis: RedisClient | None = None, keys: Keys | None = None,
             now: float | None = None) -> list[LimitState]:
        """The states of these (key, last used) in two round trips: their specs, then the rest.
        Without ``recent`` the recent figures read 0 (the metrics: 60 reads a key is too many a scrape)."""
        redis, keys = _defaults(redis, keys)
        if not keys_used:
            return []
        now = redis_now(redis) if now is None else now
        names = [key for key, _ in keys_used]
        specs = [_spec(raw) for raw in cast(list[Any], redis.hmget(keys.limit_specs, names))]
        minute = math.floor(now / 60)
        minutes = range(minute - RECENT_LONG + 1, minute + 1) if recent else range(0)
        pipe = redis.pipeline(transaction=False)
        listing = []  # whether each key's holders are read (the replies are cut by position)
        for key, spec in zip(names, specs, strict=True):
            lk = keys.limit(key)
            pipe.hgetall(lk.stats)
            _queue_in_use(pipe, lk, spec, now)
            listing.append(spec["kind"] in ("concurrent", "unknown") and holders > 0)
            if listing[-1]:
                pipe.zrangebyscore(lk.holders, f"({now!r}", "+inf", start=0, num=holders, withscores=True)
            for m in minutes:
                pipe.hmget(lk.recent(m), ["over", "rescheduled"])
        replies = iter(pipe.execute(raise_on_error=False))
        states = []
        for (key, used), spec, listed in zip(keys_used, specs, listing, strict=True):
            stats, in_use = next(replies), next(replies)
            holder_reply = next(replies) if listed else []
            states.append(cls._from(key, used, spec, stats, in_use, holder_reply,
                                    [next(replies) for _ in minutes], now))
        return states

    @classmethod
    def _from(cls, key: str, used: float | None, spec: dict[str, Any], stats: Any, in_use: Any, listed: Any,
              recent: list[Any], now: float) -> LimitState:
        # (not a dict: an error reply, a key of the wrong type)
        stats = {_text(field): value for field, value in stats.items()} if isinstance(stats, dict) else {}
        totals = {name: _count(stats.get(name)) for name in TOTALS}
        shown = Recent()
        for age, pair in enumerate(reversed(recent)):  # (age 0: the current minute)
            over, rescheduled = pair if isinstance(pair, list) else (None, None)
            shown.over_60m += _count(over)
            shown.rescheduled_60m += _count(rescheduled)
            if age < RECENT_SHORT:
                shown.over_5m += _count(over)
                shown.rescheduled_5m += _count(rescheduled)
        return cls(key, spec["kind"], spec["size"], spec["per"], spec["lease"], spec["family"] or key,
                   _in_use(spec, in_use, now), _holders(listed), totals, shown, used, now)


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


def _queue_in_use(pipe: Any, lk: Any, spec: dict[str, Any], now: float) -> None:
    """Queue the one command whose reply ``_in_use`` reads, by kind."""
    kind, per = spec["kind"], spec["per"]
    if kind == "bucket" and per:
        pipe.get(lk.count(math.floor(now / per)))
    elif kind == "window" and per:
        pipe.zcount(lk.starts, f"({now - per!r}", "+inf")
    elif kind == "leaky":
        pipe.get(lk.tat)
    else:  # concurrent, or unknown: its live holders, if it has any
        pipe.zcount(lk.holders, f"({now!r}", "+inf")


def _in_use(spec: dict[str, Any], reply: Any, now: float) -> int:
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
        used, specified = pipe.execute()
        if used is None and not specified:
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
            for state in LimitState.read(chunk, holders=0, recent=False, redis=self.redis, keys=self.keys, now=now):
                family = found.setdefault(state.family, FamilyTotals(state.family))
                family.keys += 1
                family.in_use += state.in_use
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
