"""What a scrape reads of batches (metrics/collect.py calls it): their number, and the states of the
newest ``api.STATE_SAMPLE`` (1,000) only: a field of each read, one pipeline, not a batch's sets.
"""

from __future__ import annotations

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...metrics.exposition import Family
from . import api


def families(redis: RedisClient, keys: Keys) -> list[Family]:
    batches = api.BatchSet(redis=redis, keys=keys)
    # Expired batches off the listing first, the oldest (a bid stays listed after its data expires,
    # until a read meets it): else the count would grow with every batch ever made.
    batches.prune()
    sample = api.STATE_SAMPLE  # (read now: a test patches it)
    by_state = Family("cogworker_recent_batches", "gauge",
                      f"Of the newest {sample} batches, how many are incomplete, complete with failures (every job "
                      f"ran, some are failing or dead), or succeeded.")
    for state, count in batches.states(sample).items():
        by_state.add(count, state=state)
    listed = Family("cogworker_batches", "gauge", "Batches listed (those whose data expired are taken off as the "
                                                  "listing is read, the oldest first).")
    return [listed.add(batches.size()), by_state]
