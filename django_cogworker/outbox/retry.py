"""The dead set's "retry" of an outbox unit (a batch's or a workflow's block: units.py).

A unit names no queue: the dead set's retry, which moves an entry to its queue, would leave it
where it is. It goes back to the outbox instead, as a row of its own, and runs from there.

Why a row, and not ``units.run`` on the entry straight from the dead set: a unit's steps must not
run twice at once (two operators, "Retry now" and "Retry all" together), and a row is what the
outbox runs one at a time (its claim, a relay's lock); and the entry leaves the dead set only once
its row is written, so a retry cut short (the admin's process killed, Redis away) loses nothing.
What the row holds is what the unit had left when it died (``units.left``, written by the relay
into the dead entry): its recorded progress and its jobs' marks run out after MARK_TTL, and a
dead entry may wait for days, so resuming from them would run its first steps again.

Plugged into the object model by the app (apps.py: ``retries.register``): the API,
the admin's dead set (retry now, retry all) and ``manage.py cogworker dead --retry`` all use it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import router

from ..push import payload as payloads
from .models import OutboxJob
from .store import CLAIM, Outbox, _insert

logger = logging.getLogger(__name__)

# The dead entry's own fields, not the unit's: its row holds the unit as it was pushed.
DEAD_FIELDS = ("error_class", "error_message", "error_backtrace", "failed_at", "dead_reason", "retried_at")


def retry_unit(entry: Any, now: float) -> bool:
    """Hand dead unit ``entry`` (an api SortedEntry, read whole) back to the outbox and run it now;
    False if it was no longer in the dead set (another retry took it, or it was deleted).

    Its row is written claimed (no relay takes it), then the entry removed from the dead set (only
    one retry removes it: the others delete their rows), then the unit run under that claim. Redis
    refusing it then leaves the row to a worker's relay, which sends the unit back to dead with the
    reason if it can't run."""
    unit = {k: v for k, v in entry.payload.items() if k not in DEAD_FIELDS}
    alias = router.db_for_write(OutboxJob)
    outbox = Outbox()
    raw = payloads.encode(unit)
    rows = OutboxJob.objects.using(alias)
    # (A row of this unit already there: a retry before cut short between its row and the removal.
    # Its row runs; a second would run the unit's steps again.)
    before = rows.filter(jid=unit["jid"]).exists()
    pk = None if before else _insert(alias, OutboxJob(jid=unit["jid"], payload=raw, jobs=1, created=now,
                                                      claimed_by="retry", claimed_until=now + CLAIM))
    parent = entry.parent
    if not parent.redis.zrem(parent.key, entry.raw):
        if pk is not None:
            rows.filter(pk=pk).delete()
        return False
    if pk is None:
        return True
    from ..push import runtime

    if outbox.run_claimed(alias, pk, raw, runtime.get_client().hand_over, when="retried from dead"):
        logger.info("outbox unit %s (of %s) retried from dead: its %d step(s) ran", unit["jid"],
                    unit.get("unit_of", unit["jid"]), len(unit.get("unit", ())))
    return True
