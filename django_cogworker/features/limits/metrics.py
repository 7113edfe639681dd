"""What a scrape reads of limiters (metrics/collect.py calls it): per family (the label ``limiter``),
summed over its keys: a limiter keyed by customer has a key per customer, a series each would be
unbounded. The FAMILY_LIMIT families with the most grants keep series; the keys read are the
``api.FAMILY_KEY_LIMIT`` most recently used.
"""

from __future__ import annotations

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...metrics.exposition import Family
from . import api

FAMILY_LIMIT = 100  # limiter families with series of their own, those with the most grants first


def families(redis: RedisClient, keys: Keys) -> list[Family]:
    found = api.LimitSet(redis=redis, keys=keys).families(api.FAMILY_KEY_LIMIT)  # (read now: a test patches it)
    kept = sorted(found, key=lambda f: (-f.totals["granted"], f.family))[:FAMILY_LIMIT]
    in_use = Family("cogworker_limit_in_use", "gauge", "Places of the limiter taken now, over its keys: holders "
                                                       "(concurrent), starts in the bucket or window, a leaky "
                                                       "bucket's level.")
    size = Family("cogworker_limit_size", "gauge", "The limiter's size (a limiter of one static name only).")
    waiting = Family("cogworker_limit_waiting", "gauge", "Jobs a concurrency limiter refused that wait for a place "
                                                         "given back, over its keys.")
    counters = [(name, Family(f"cogworker_limit_{name}_total", "counter", text)) for name, text in (
        ("granted", "Places the limiter granted, over its keys."),
        ("over", "Times the limiter refused (at fetch, or a within() block that waited in vain), over its keys."),
        ("rescheduled", "Jobs sent back to the schedule by the limiter, over its keys."),
        ("expired", "Concurrency leases of the limiter that lapsed (their holder died), over its keys."))]
    for family in sorted(kept, key=lambda f: f.family):
        in_use.add(family.in_use, limiter=family.family)
        waiting.add(family.waiting, limiter=family.family)
        if family.size is not None:
            size.add(family.size, limiter=family.family)
        for name, counter in counters:
            counter.add(family.totals[name], limiter=family.family)
    return [in_use, size, waiting, *(counter for _, counter in counters)]
