"""The outbox's metrics, per database: ``cogworker_outbox_waiting``, ``cogworker_outbox_oldest_seconds``."""

from __future__ import annotations

from ..metrics.exposition import Family
from . import api


def families(now: float) -> list[Family]:
    waiting = Family("cogworker_outbox_waiting", "gauge",
                     "Jobs of committed transactions waiting in the database's outbox for Redis.")
    oldest = Family("cogworker_outbox_oldest_seconds", "gauge",
                    "Seconds the oldest job of the database's outbox has waited (0 when empty).")
    for state in api.states(now):
        if state.error is None:  # (a database that can't be read has no figure: not a 0 that looks fine)
            waiting.add(state.waiting, database=state.database)
            oldest.add(round(state.oldest_age or 0.0, 3), database=state.database)
    return [waiting, oldest]
