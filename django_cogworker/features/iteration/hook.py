"""Iteration on the job's path, for IterableJob classes only (:meth:`Iteration.applies`).

* ``around``: the run's :class:`~.loop.Run` made (its state in Redis, its checkpoint cadence, the
  worker's stopping event) and put where the job's loop finds it (``Running.extras["iteration"]``).
* ``decide``: a run that stopped between two items with its cursor saved (the worker stopping,
  ``max_iteration_runtime``, a throttle) is RESCHEDULED: filed in the schedule, due now (after its
  backoff for a throttle), atomically with its ack on every fetch (the schedule is a filing target
  each fetch's settle script already writes atomically, basic, reliable and cluster alike; a new
  "back to its queue" target would have to be added to each). The poller moves it to its queue
  when due: at once when this worker's poller runs (woken for it, as for a retry), else within a
  poll of another worker's (POLL_INTERVAL_AVERAGE). Same jid; its payload without ``expires_at``
  (an iterable job that began is never dropped as expired mid-walk; measured from its first push,
  expiry only ever drops a job that never started), and without ``orphan_count`` once the run did
  an item (MAX_ORPHANINGS counts kills in a row, not over a long walk's life). A cancelled run is
  the cancellation feature's to decide (dead, never retried): its ``decide`` comes first. A failure
  is the core's (retry, then dead), its cursor already saved by the loop.
* ``after``: the poller woken for a job rescheduled now; ``iteration:<jid>`` kept ENDED_KEEP more
  once the job ends for good outside the dead set (succeeded, cancelled, discarded: its ack may
  still be on its way, and a run again after a kill -9 resumes from its end), kept otherwise (a retry, a
  reschedule, a death: a retry from the dead set resumes).
* ``start``: at a worker's startup, a WARNING for each class whose longest iteration so far
  (``iteration:longest``) is past SHUTDOWN_TIMEOUT: a TERM may not wait for its item to end.

The other features see an iterable job as one job: a batch counts it once, when it succeeds (a
RESCHEDULED decision takes no batch step); a unique job keeps its lock across its reschedules, and a
periodic run its running lock, held for the wait (features/locks/: a run RESCHEDULED is "requeued");
its result record reads READY between two runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...conf import Config
from ...engine.run.hooks import Call, Decision, Feature, JobRun, Outcome
from ...engine.settle.retry import Filing, RetryPolicy
from ...engine.settle.settlement import Ack
from ...push import payload as payloads
from .errors import IterationError
from .loop import INTERRUPTED, NAME, Run
from .state import ENDED_KEEP, State, longest_by_class

logger = logging.getLogger(__name__)

WHY = {"stopped": "the worker is stopping", "max_runtime": "max_iteration_runtime reached", "throttled": "throttled"}


class Iteration(Feature):
    """Made by features/standard.py with the worker's parts and its encryption ring (a sealed job's
    cursor is sealed with it); shared by the processor threads (a run's state lives on the run)."""

    name = NAME

    def __init__(self, redis: RedisClient, keys: Keys, config: Config, retry: RetryPolicy | None = None,
                 ring: Any = None, clock: Any = time.time):
        self.redis = redis
        self.keys = keys
        self.config = config
        self.retry = retry
        self.ring = ring
        self.clock = clock

    def applies(self, job_class: Any) -> bool:
        return bool(getattr(job_class, "_cogworker_iterable", False))

    def start(self) -> None:
        """Warn of the classes whose longest iteration is past SHUTDOWN_TIMEOUT (a TERM can't wait for it)."""
        try:
            longest = longest_by_class(self.redis, self.keys)
        except Exception as exc:  # (a warning's read: never worth the startup)
            logger.warning("could not read %s: %s: %s", self.keys.iteration_longest, type(exc).__name__, exc)
            return
        limit = self.config.shutdown_timeout
        for name, seconds in sorted(longest.items()):
            if seconds > limit:
                logger.warning("iterable job %s has taken up to %.1fs for one iteration, longer than SHUTDOWN_TIMEOUT "
                               "(%.1fs): a TERM during such an item hands the job back unfinished, and it does "
                               "that item again", payloads.printable(name), seconds, limit)

    def around(self, run: JobRun, call: Call) -> Any:
        cls, payload, scope = run.job_class, run.payload, run.scope
        assert scope is not None  # (set before any around hook)
        ring = None
        if "encrypted" in payload:  # (the payload schema's SEALED field: its cursor is sealed too)
            if not self.ring:
                raise IterationError(f"{cls.name}: its arguments are sealed and this worker has no key to seal its "
                                     f"cursor with")
            ring = self.ring
        state = State(self.redis, self.keys, str(payload.get("jid")), cls.name, self.config.dead_timeout, ring)
        interval = cls.iteration_checkpoint
        if interval is None:
            interval = self.config.iteration_checkpoint
        scope.extras[NAME] = run.notes[NAME] = Run(state, interval, cls.checkpoint_every, cls.max_iteration_runtime,
                                                   scope.stopping, scope.extras)
        return call()

    def decide(self, run: JobRun) -> Decision | None:
        it: Run | None = run.notes.get(NAME)
        if it is None or run.error is not None or it.end not in INTERRUPTED:
            return None
        payload = dict(run.payload)
        payload.pop("expires_at", None)
        if it.items:
            # (A run that moved its cursor on: the kills before it were no poison job's doing. Its
            # count kept, an hour-long walk killed by MAX_ORPHANINGS + 1 deploys over its life went
            # dead with its work progressing; a job that kills its process at once never gets here.)
            payload.pop("orphan_count", None)
        due = self.clock() + it.backoff
        logger.info("%s jid=%s class=%s after %d item(s) this run: back to the schedule, due %s, with its cursor",
                    WHY[it.end], run.jid, run.shown_class, it.items,
                    "now" if not it.backoff else f"in {it.backoff:.1f}s")
        return Decision(Outcome.RESCHEDULED, Filing("schedule", due, payload))

    def after(self, run: JobRun) -> None:
        decision = run.decision
        if decision is None:
            return
        end = decision.settlement.end
        if decision.outcome is Outcome.RESCHEDULED and run.notes.get(NAME) is not None:
            if self.retry is not None and isinstance(end, Filing):
                self.retry.wake(end.score, run.jid)  # (the poller wakes when it is due)
            return
        if decision.outcome is Outcome.SUCCESS or (decision.outcome is Outcome.DEAD and isinstance(end, Ack)):
            # (Not deleted: its ack may still ride the next fetch; a kill -9 before it lands runs the
            # job again, which must resume from its saved end, not start over: state.ENDED_KEEP.)
            try:
                self.redis.expire(self.keys.iteration(str(run.payload.get("jid"))), ENDED_KEEP)
            except Exception as exc:  # (it expires at its TTL)
                logger.warning("jid=%s: its iteration state's expiry was not shortened (%s: %s)", run.jid,
                               type(exc).__name__, payloads.printable(exc))

