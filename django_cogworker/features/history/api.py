"""Reading the metrics history back (the admin's Metrics page, ``manage.py cogworker metrics``),
and the deploy marks.

    from django_cogworker.features.history import api
    window = api.read(minutes=60, job_class="shop.jobs.Sync")   # or queue="mail"
    window.classes["shop.jobs.Sync"].p95                          # ms, from the buckets
    api.add_mark("deploy 1.4.2"); window.marks

A window of up to ``MINUTE_WINDOW`` minutes is read by the minute (one HGETALL a minute); a
longer one by the hour (the hours it touches, the current one included, so it may reach up to an
hour further back), at most 30 days. Everything is read in Redis's time, pipelined.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.loops import redis_time
from .buckets import B0, BUCKETS, MS, F, P, parse, percentile
from .recorder import HOUR_KEEP, MINUTE_KEEP, hour_stamp, minute_stamp

MINUTE_WINDOW = 6 * 60  # longest window read by the minute; longer ones by the hour
LONGEST = HOUR_KEEP // 60  # minutes: 30 days
CHUNK = 500  # HGETALLs a pipeline
MARK_LIMIT = 200  # characters of a mark's label
MARKS_KEPT = HOUR_KEEP  # seconds a mark is kept


@dataclasses.dataclass
class Point:
    start: float  # epoch seconds the slot (a minute or an hour) starts
    processed: int = 0
    failed: int = 0
    ms: float = 0.0


@dataclasses.dataclass
class ClassHistory:
    """One job class over a window: its counts, run time, buckets and a point per slot."""

    job_class: str
    processed: int = 0
    failed: int = 0
    ms_total: float = 0.0
    buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * BUCKETS)
    series: list[Point] = dataclasses.field(default_factory=list)

    @property
    def p50(self) -> float | None:
        return percentile(self.buckets, 0.50)

    @property
    def p95(self) -> float | None:
        return percentile(self.buckets, 0.95)

    @property
    def p99(self) -> float | None:
        return percentile(self.buckets, 0.99)

    @property
    def ms_mean(self) -> float | None:
        return round(self.ms_total / self.processed, 3) if self.processed else None

    def document(self) -> dict[str, Any]:
        return {"processed": self.processed, "failed": self.failed, "ms_p50": self.p50, "ms_p95": self.p95,
                "ms_p99": self.p99, "ms_mean": self.ms_mean, "ms_total": round(self.ms_total, 3)}


@dataclasses.dataclass
class Mark:
    at: float
    label: str


@dataclasses.dataclass
class Window:
    """The history over ``minutes`` up to ``end``: per class (busiest by run time first), the classes
    and queues seen in it (for the filters), and the deploy marks inside it."""

    minutes: int
    step: int  # 60 or 3600
    start: float
    end: float
    classes: dict[str, ClassHistory]
    all_classes: list[str]
    queues: list[str]
    marks: list[Mark]

    def document(self) -> dict[str, Any]:
        return {"classes": {name: c.document() for name, c in self.classes.items()}, "minutes": self.minutes,
                "resolution_seconds": self.step, "from": self.start, "to": self.end,
                "marks": [{"at": m.at, "label": m.label} for m in self.marks]}


def _defaults(redis: RedisClient | None, keys: Keys | None) -> tuple[RedisClient, Keys]:
    from ...api._base import _defaults as defaults

    return defaults(redis, keys)


def read(minutes: int = 60, job_class: str | None = None, queue: str | None = None, *,
         redis: RedisClient | None = None, keys: Keys | None = None, now: float | None = None) -> Window:
    """The last ``minutes`` (1 to 30 days' worth), of one class and/or one queue if given."""
    redis, keys = _defaults(redis, keys)
    minutes = max(1, min(int(minutes), LONGEST))
    now = redis_time(redis) if now is None else now
    step = 60 if minutes <= MINUTE_WINDOW else 3600
    slots = minutes if step == 60 else math.ceil(minutes / 60)
    last = int(now // step) * step
    starts = [last - step * i for i in range(slots - 1, -1, -1)]
    stamp = minute_stamp if step == 60 else hour_stamp
    names = [keys.history(("m:" if step == 60 else "h:") + stamp(s)) for s in starts]
    rows: list[Any] = []
    for i in range(0, len(names), CHUNK):
        pipe = redis.pipeline(transaction=False)
        for name in names[i:i + CHUNK]:
            pipe.hgetall(name)
        rows += pipe.execute(raise_on_error=False)
    classes: dict[str, ClassHistory] = {}
    all_classes: set[str] = set()
    queues: set[str] = set()
    for slot, row in enumerate(rows):
        if not isinstance(row, dict):  # (a key of the wrong type reads as empty: the key guard moves it)
            continue
        for raw, value in row.items():
            parsed = parse(raw)
            if parsed is None:
                continue
            q, name, what = parsed
            queues.add(q)
            all_classes.add(name)
            if (queue is not None and q != queue) or (job_class is not None and name != job_class):
                continue
            history = classes.get(name)
            if history is None:
                history = classes[name] = ClassHistory(name, series=[Point(s) for s in starts])
            _add(history, history.series[slot], what, float(value))
    ordered = dict(sorted(classes.items(), key=lambda item: (-item[1].ms_total, item[0])))
    return Window(minutes, step, starts[0], last + step, ordered, sorted(all_classes), sorted(queues),
                  marks(starts[0], last + step, redis=redis, keys=keys))


def _add(history: ClassHistory, point: Point, what: int, value: float) -> None:
    if what == P:
        history.processed += int(value)
        point.processed += int(value)
    elif what == F:
        history.failed += int(value)
        point.failed += int(value)
    elif what == MS:
        history.ms_total += value
        point.ms += value
    else:
        history.buckets[what - B0] += int(value)


def add_mark(label: str, *, redis: RedisClient | None = None, keys: Keys | None = None,
             now: float | None = None) -> Mark:
    """Mark now (Redis's time) with ``label`` ("deploy 1.4.2"); marks older than 30 days go."""
    redis, keys = _defaults(redis, keys)
    label = label.strip()[:MARK_LIMIT]
    if not label:
        raise ValueError("a mark needs a label")
    now = redis_time(redis) if now is None else now
    member = json.dumps({"label": label, "id": secrets.token_hex(4)})  # (the same label twice: two marks)
    pipe = redis.pipeline(transaction=False)
    pipe.zadd(keys.history_marks, {member: now})
    pipe.zremrangebyscore(keys.history_marks, "-inf", now - MARKS_KEPT)
    pipe.execute()
    return Mark(now, label)


def marks(start: float, end: float, *, redis: RedisClient | None = None, keys: Keys | None = None) -> list[Mark]:
    """The marks from ``start`` to ``end`` (epoch seconds), oldest first (at most 1,000)."""
    redis, keys = _defaults(redis, keys)
    try:
        found = redis.zrangebyscore(keys.history_marks, start, end, withscores=True, start=0, num=1000)
    except Exception as exc:  # (a key of the wrong type: no marks shown, the key guard moves it)
        if "WRONGTYPE" not in str(exc):
            raise
        return []
    shown = []
    for member, score in found:  # type: ignore[str-unpack]
        try:
            label = str(json.loads(member)["label"])  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError):
            label = member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
        shown.append(Mark(float(score), label))
    return shown


__all__ = ["MINUTE_KEEP", "ClassHistory", "Mark", "Point", "Window", "add_mark", "marks", "read"]
