"""What operators see of the outbox, and "relay now": for the admin page, ``manage.py cogworker
outbox`` and the metrics. Read from each outbox database (not Redis: the rows are there)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from django.db import DatabaseError

from .relay import BATCH, FRESH, outbox_aliases, relay_once, waiting

logger = logging.getLogger(__name__)

# Rows "relay now" takes at the most, in rounds of BATCH: a click is an HTTP request.
RELAY_NOW_MAX = 20 * BATCH


@dataclasses.dataclass(frozen=True)
class OutboxState:
    """One database's outbox: rows waiting, the oldest's age; ``error``: why it couldn't be read;
    ``ahead``: how far ahead of this host's clock the latest row is dated, when more than the relay's
    grace (FRESH): a pushing host's clock ahead (the relays take such rows at once; the ages of
    the others are as wrong as that clock)."""

    database: str
    waiting: int
    oldest_age: float | None  # seconds (None: no row)
    error: str | None = None
    ahead: float | None = None  # seconds

    @property
    def note(self) -> str:
        """What an operator should know besides the figures ("": nothing)."""
        if self.error:
            return self.error
        if self.ahead == math.inf:
            return "a row dated in no time a clock gives (NaN, Infinity): relayed at once, said in the relay's log"
        if self.ahead is not None:
            return (f"rows dated up to {self.ahead:.0f}s ahead of this host's clock (a pushing host's clock ahead?): "
                    f"relayed at once, their ages unknown")
        return ""


def states(now: float | None = None) -> list[OutboxState]:
    """The outbox of each database that has one (see relay.outbox_aliases)."""
    now = time.time() if now is None else now
    found = []
    for alias in outbox_aliases():
        try:
            count, oldest, newest = waiting(alias)
        except DatabaseError as exc:  # (a database away, or not migrated: said on its line)
            found.append(OutboxState(alias, 0, None, f"{type(exc).__name__}: {exc}"))
            continue
        # (A date no clock gives, NaN or Infinity on PostgreSQL, is "ahead" without end: never a figure.)
        ahead = (None if newest is None else math.inf if not math.isfinite(newest)
                 else newest - now if newest - now > FRESH else None)
        age = None if oldest is None or not math.isfinite(oldest) else max(0.0, now - oldest)
        found.append(OutboxState(alias, count, age, ahead=ahead))
    return found


def relay_now(limit: int = RELAY_NOW_MAX) -> int:
    """Relay what waits in every outbox database now, however fresh, up to ``limit`` rows; return
    how many were taken. Raises what stopped it (Redis away: the rows stay)."""
    from ..broker.keys import for_config
    from ..push import runtime

    client, redis = runtime.get_client(), runtime.get_redis()
    keys = for_config(runtime.get_config())
    taken = 0
    for alias in outbox_aliases():
        while taken < limit:
            done = relay_once(alias, client.hand_over, redis, keys, now=time.time(), fresh=0.0,
                              limit=min(BATCH, limit - taken))
            taken += done
            if not done:
                break
    logger.info("outbox: %d job(s) relayed now (asked by an operator)", taken)
    return taken
