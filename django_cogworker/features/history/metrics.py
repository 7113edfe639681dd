"""The Prometheus run-time histogram per job class, ``cogworker_job_duration_seconds``.

Read from ``metrics:total`` (the buckets and run time the history's flushes add up, never
expiring: a histogram's buckets are counters since counting began). Each sample of a class comes
from that one hash, so ``le="+Inf"`` is always its ``_count``, as Prometheus requires; a class
the history hasn't counted (METRICS_HISTORY off, or runs counted before it was on) gets its
``_sum`` and ``_count`` from the per-class stats and its ``+Inf`` bucket alone. The classes are
those the other per-class series show (metrics/collect.py: the busiest, ``api.stats.CLASS_LIMIT``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...metrics.exposition import Family, number
from .buckets import BOUNDS_MS, BUCKETS, decode

HELP = "Time the runs of the job class took (since counting began)."


def totals(redis: RedisClient, keys: Keys) -> dict[str, tuple[list[int], float]]:
    """class -> (runs per bucket, seconds summed), from the totals hash (one HGETALL)."""
    try:
        raw = redis.hgetall(keys.history_totals)
    except Exception as exc:  # (a key of the wrong type: none shown; the key guard moves it)
        if "WRONGTYPE" not in str(exc):
            raise
        return {}
    found: dict[str, tuple[list[int], float]] = {}
    for name, value in raw.items():
        text = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
        job_class, _, what = text.rpartition("|")
        if not job_class:
            continue
        buckets, seconds = found.get(decode(job_class), ([0] * BUCKETS, 0.0))
        if what == "ms":
            seconds += float(value) / 1000.0
        elif what.startswith("b") and what[1:].isdigit() and int(what[1:]) < BUCKETS:
            buckets[int(what[1:])] += int(float(value))
        found[decode(job_class)] = (buckets, seconds)
    return found


def duration_family(rows: Sequence[Any], redis: RedisClient, keys: Keys) -> Family:
    """The histogram of ``rows`` (api.JobClassStats: job_class, processed, seconds)."""
    family = Family("cogworker_job_duration_seconds", "histogram", HELP)
    counted = totals(redis, keys)
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
