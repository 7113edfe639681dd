"""The Prometheus run-time histogram per job class, ``cogworker_job_duration_seconds``.

Read from ``metrics:total`` (the buckets and run time the history's flushes add up, never
expiring: a histogram's buckets are counters since counting began). Each sample of a class comes
from that one hash, so ``le="+Inf"`` is always its ``_count``, as Prometheus requires; a class
the history hasn't counted (METRICS_HISTORY off, or runs counted before it was on) gets its
``_sum`` and ``_count`` from the per-class stats and its ``+Inf`` bucket alone. The classes are
those the other per-class series show (metrics/collect.py: the busiest, ``api.stats.CLASS_LIMIT``),
and only their fields of the hash are read (it counts every class ever run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...metrics.exposition import Family, number
from .buckets import BOUNDS_MS, BUCKETS, encode

HELP = "Time the runs of the job class took (since counting began)."
_READ = ("ms", *(f"b{i}" for i in range(BUCKETS)))  # a class's fields in the totals hash, as totals() reads them


def totals(redis: RedisClient, keys: Keys, classes: Sequence[str]) -> dict[str, tuple[list[int], float]]:
    """class -> (runs per bucket, seconds summed) of those of ``classes`` the totals hash counts: one
    HMGET of their fields alone. The hash holds every class ever counted and never expires (a
    project's renamed and removed classes, a tenant's per-customer ones); a scrape shows the
    CLASS_LIMIT busiest, and reads no more of it than their fields."""
    if not classes:
        return {}
    fields = [f"{encode(job_class)}|{name}" for job_class in classes for name in _READ]
    try:
        values = redis.hmget(keys.history_totals, fields)
    except Exception as exc:  # (a key of the wrong type: none shown; the key guard moves it)
        if "WRONGTYPE" not in str(exc):
            raise
        return {}
    found: dict[str, tuple[list[int], float]] = {}
    width = len(_READ)
    for n, job_class in enumerate(classes):
        row = values[n * width:(n + 1) * width]
        if all(value is None for value in row):
            continue  # (not counted by the history: the per-class stats give its sum and count)
        found[job_class] = ([int(float(value or 0)) for value in row[1:]], float(row[0] or 0) / 1000.0)
    return found


def duration_family(rows: Sequence[Any], redis: RedisClient, keys: Keys) -> Family:
    """The histogram of ``rows`` (api.JobClassStats: job_class, processed, seconds)."""
    family = Family("cogworker_job_duration_seconds", "histogram", HELP)
    counted = totals(redis, keys, [row.job_class for row in rows])
    for row in rows:
        label = {"class": row.job_class}
        buckets, seconds = counted.get(row.job_class, (None, row.seconds))
        if buckets is None:
            count = row.processed
        else:
            count = 0
            for bound, runs in zip(BOUNDS_MS, buckets, strict=False):
                count += runs
                family.add(count, "_bucket", **label, le=number(bound / 1000.0))
            count += buckets[-1]
        family.add(count, "_bucket", **label, le="+Inf")
        family.add(round(seconds, 6), "_sum", **label)
        family.add(count, "_count", **label)
    return family
