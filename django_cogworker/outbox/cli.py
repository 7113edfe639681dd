"""``manage.py cogworker outbox [--json]``: each database's outbox, rows waiting and the oldest's age
(ERROR: why a database can't be read, or rows dated ahead of this host's clock: api.OutboxState.note)."""

from __future__ import annotations

import math
from typing import Any

from ..cli.listings import Listing
from ..cli.output import seconds
from . import api


def listing() -> Listing:
    """One row per outbox database (not paged: one per database in DATABASES, at the most)."""
    states = api.states()
    items: list[dict[str, Any]] = [{"database": s.database, "waiting": s.waiting,
              "oldest_age": None if s.oldest_age is None else round(s.oldest_age, 3), "error": s.error,
              "ahead": None if s.ahead is None or s.ahead == math.inf else round(s.ahead, 3), "note": s.note}
             for s in states]
    rows = [[i["database"], i["waiting"], seconds(i["oldest_age"]), i["note"]] for i in items]
    return Listing(["DATABASE", "WAITING", "OLDEST", "ERROR"], rows,
                   {"waiting": sum(i["waiting"] for i in items), "databases": items})
