"""The metrics history on the job's path: each run counted in memory as it ends (``after``),
written by the feature's heartbeat chore (one pipeline a beat) and once more at ``stop``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.hooks import Feature, JobRun, Outcome
from .recorder import Recorder

logger = logging.getLogger(__name__)


class History(Feature):
    """Made by features/standard.py (unless METRICS_HISTORY is off), one per worker process, shared
    by its processor threads; what it counts is in its Recorder until the next flush.

    Counts what the stats count (engine/settle/stats.py): a run that ended (succeeded or failed)
    and a job failed before its run (a ``before`` hook raised), not one a feature settled unrun
    (expired, cancelled, over its limit). Only classes this worker knows: the hashes grow with the
    project's code, not with whatever class names anyone pushes.
    """

    name = "history"

    def __init__(self, redis: RedisClient, keys: Keys, recorder: Recorder | None = None):
        self.redis = redis
        self.recorder = recorder or Recorder(keys)

    def applies(self, job_class: Any) -> bool:
        return job_class is not None

    def after(self, run: JobRun) -> None:
        decision = run.decision
        if decision is None or decision.outcome is Outcome.RESCHEDULED or not (run.ran or decision.failure):
            return
        self.recorder.record(run.unit.queue, run.payload["class"], run.elapsed, decision.failure)

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        def metrics_history(redis: RedisClient) -> None:
            self.recorder.flush(redis)

        return (metrics_history,)

    def start(self) -> None:
        try:
            self.recorder.anchor(self.recorder.redis_now(self.redis))
        except Exception as exc:  # (the first flush tries again)
            logger.warning("metrics history: Redis's TIME not read at start (%s: %s)", type(exc).__name__, exc)

    def stop(self) -> None:
        """Write what the last runs counted (the processors have stopped)."""
        self.recorder.flush(self.redis)
