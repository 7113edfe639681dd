"""The run-time buckets, the names of the history's hash fields, and percentiles read from buckets.

Buckets (upper bounds, ms): 5, 10, 25, 50, 100, 250, 500, 1,000, 2,500, 5,000, 10,000, 30,000,
60,000, then +inf: the 1-2.5-5 ladder Prometheus' own defaults use, from a no-op job (under 5 ms)
to a minute. Each is 2 to 2.5 times the one before, so a percentile read from them (interpolated
inside its bucket, as Prometheus' ``histogram_quantile`` does) is off by less than that factor,
and usually far less; 14 counters a class a minute is what that costs. Past a minute a job is
"slow" whatever its exact time: the +inf bucket counts it, and the run time summed still gives
its mean.

A field is ``<queue>|<class>|<what>`` (``p`` runs, ``f`` failed, ``ms`` run time, ``b<i>``
bucket i), queue and class percent-encoded (``quote``, lone surrogates included): a class named
``a|b`` or holding a newline can't break a field apart or into another's, and every field is
ASCII. The totals hash (Prometheus) has ``<class>|<what>``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from urllib.parse import quote, unquote

BOUNDS_MS: tuple[float, ...] = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000)
BUCKETS = len(BOUNDS_MS) + 1  # (the last: +inf)
# runs, failed, ms, then the buckets: one list of counts per (minute, queue, class) in memory.
P, F, MS, B0 = 0, 1, 2, 3
WIDTH = B0 + BUCKETS
NAMES = ("p", "f", "ms", *(f"b{i}" for i in range(BUCKETS)))
INDEX = {name: i for i, name in enumerate(NAMES)}


def bucket_of(ms: float) -> int:
    """The bucket a run of ``ms`` milliseconds falls in (an upper bound is inclusive)."""
    return bisect.bisect_left(BOUNDS_MS, ms)


def encode(name: str) -> str:
    return quote(name, safe="", errors="surrogatepass")


def decode(text: str) -> str:
    return unquote(text, errors="surrogatepass")


def field(queue: str, job_class: str, what: str) -> str:
    return f"{encode(queue)}|{encode(job_class)}|{what}"


def parse(raw: bytes | str) -> tuple[str, str, int] | None:
    """(queue, class, index in NAMES) of a field, or None for one this package didn't write."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    parts = text.split("|")
    if len(parts) != 3 or parts[2] not in INDEX:
        return None
    return decode(parts[0]), decode(parts[1]), INDEX[parts[2]]


def percentile(buckets: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of the runs counted in ``buckets``, in ms; None with no runs.

    Interpolated inside the bucket it falls in, from its lower bound to its upper one (the first
    from 0); one in the +inf bucket reads as the last finite bound (60,000: "a minute or more").
    """
    total = sum(buckets)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, count in enumerate(buckets):
        if count and seen + count >= rank:
            if i >= len(BOUNDS_MS):
                return float(BOUNDS_MS[-1])
            low = 0.0 if i == 0 else float(BOUNDS_MS[i - 1])
            return round(low + (BOUNDS_MS[i] - low) * max(rank - seen, 0.0) / count, 3)
        seen += count
    return float(BOUNDS_MS[-1])  # (not reached: rank <= total)


def finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0
