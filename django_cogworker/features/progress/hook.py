"""Progress on the job's path: a run's last report written at its end, the report deleted with
the job.

Once a run is settled (``after``):

* it succeeded, or died for good (dead, discarded, dropped): ``progress:<jid>`` is deleted (one
  DEL), if this run reported progress or an earlier run may have (a retried job: its payload
  has a ``retry_count``). A plain job that never reports pays nothing;
* it goes on later (a retry; rescheduled: over a limit, an iterable job back to its queue with its
  cursor): its last report is written if it wasn't (``flush(force=True)``), and the key is kept,
  so the bar of a resumed job goes on from where it stood.

What a worker can't settle (a process killed mid-run) leaves the key to its TTL (tracker.py:
a day past its last write), or to the run that recovers the job.
"""

from __future__ import annotations

import logging

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.hooks import Feature, JobRun, Outcome
from .api import NAME

logger = logging.getLogger(__name__)

ENDED = (Outcome.SUCCESS, Outcome.DEAD)


class Progress(Feature):
    """Made by features/standard.py; one per worker process, shared by its processor threads (what
    it knows of a run is in the run's ``Running.extras``)."""

    name = "progress"

    def __init__(self, redis: RedisClient, keys: Keys):
        self.redis = redis
        self.keys = keys

    def after(self, run: JobRun) -> None:
        tracker = run.scope.extras.get(NAME) if run.scope is not None else None
        decision = run.decision
        if decision is None:
            return
        try:
            if decision.outcome in ENDED:
                if tracker is not None:
                    tracker.delete()
                elif "retry_count" in run.payload:
                    self.redis.delete(self.keys.progress(str(run.payload.get("jid"))))
            elif tracker is not None:
                tracker.flush(force=True)
        except Exception as exc:  # (Redis away: the key's TTL ends it; the job is settled all the same)
            logger.warning("jid=%s: its progress could not be %s: %s", run.jid,
                           "deleted" if decision.outcome in ENDED else "written", exc)
