"""keep_last_if_active on the job's path: a run marks its state running as it starts (a push then
keeps a follow-up instead of writing nothing), and its settlement carries a :class:`RunEnded` step,
seen through before the ack or filing, that writes the follow-up kept during the run (or releases
the state). Debounced and throttled jobs need nothing here: their push did it all.

Crash-safe by the order: the step goes before the ack, so a worker killed between them leaves the
job in its in-progress list, and orphan recovery runs it again; the step run again finds the state
naming the follow-up, not this job, and writes nothing twice. A worker killed mid-run: the job comes
back (reliable fetch), its state still names it, and its next run's end writes the follow-up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from ...engine.run.hooks import Decision, Feature, JobRun, Outcome
from ...push import payload as payloads
from .scripts import RUN_ENDED, RUN_STARTED

logger = logging.getLogger(__name__)


def _keeps_last(payload: dict[str, Any]) -> bool:
    spec = payload.get("collapse")
    return isinstance(spec, list) and len(spec) == 3 and spec[0] == "keep_last" and isinstance(spec[2], str)


class RunEnded(NamedTuple):
    """A step of a settlement: a keep_last_if_active run ended (``final``: for good, not to run again)."""

    jid: str
    digest: str
    queue: str
    final: bool

    @property
    def holdable(self) -> bool:
        return False  # (it writes a job: seen through at once, before the ack)


class RunEnds:
    """Runs RunEnded steps (the Settler's runner for them); raises while Redis refuses (kept, run again)."""

    def __init__(self, redis: RedisClient, keys: Keys, ttl: float):
        self.redis = redis
        self.keys = keys
        self.ttl_ms = max(int(ttl * 1000), 1)

    def run(self, step: RunEnded) -> None:
        keys = self.keys
        state = keys.collapse(step.digest)
        if keys.spread:  # (the queue is in a slot of its own: the follow-up goes through the schedule)
            where, score = [keys.schedule], repr(_now(self.redis))
        else:
            where, score = [keys.queue(step.queue), keys.queues], ""
        args = ["1" if step.final else "0", score, self.ttl_ms, step.queue, keys.schedule_wake]
        reply = RUN_ENDED(self.redis, [state, *where], [step.jid, *args])
        if isinstance(reply, list):  # (a state of the wrong type: moved aside, its follow-up with it)
            quarantine_key(self.redis, keys, state, "hash", "is no collapse state (the wrong type)")
        elif reply == 2:
            logger.info("jid=%s ended: its follow-up pushed to %r", step.jid, step.queue)

    def run_many(self, steps: Sequence[RunEnded]) -> None:
        for step in steps:
            self.run(step)


def _now(redis: RedisClient) -> float:
    seconds, micro = redis.time()
    return seconds + micro / 1_000_000


class KeepLast(Feature):
    """Every class may push with ``keep_last_if_active`` (``set(...)``): the payload says which do."""

    name = "collapse"
    fields = ("collapse",)

    def __init__(self, redis: RedisClient, keys: Keys, ttl: float):
        self.redis = redis
        self.keys = keys
        self.ends = RunEnds(redis, keys, ttl)

    def before(self, run: JobRun) -> Decision | None:
        payload = run.payload
        if not _keeps_last(payload):
            return None
        state = self.keys.collapse(payload["collapse"][2])
        try:
            marked = RUN_STARTED(self.redis, [state], [payload["jid"], self.ends.ttl_ms])
            if not isinstance(marked, int):
                quarantine_key(self.redis, self.keys, state, "hash", "is no collapse state (the wrong type)")
        except Exception as exc:  # (it runs all the same: a push meanwhile writes nothing, as if it waited)
            logger.error("keep_last_if_active: jid=%s not marked running: %s: %s", run.jid,
                         type(exc).__name__, payloads.printable(exc))
        return None

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        payload = run.payload
        if _keeps_last(payload) and isinstance(payload.get("jid"), str):
            final = decision.outcome is Outcome.SUCCESS or decision.outcome is Outcome.DEAD
            decision.settlement = decision.settlement.first(
                RunEnded(payload["jid"], payload["collapse"][2], str(payload.get("queue")), final))
        return decision

    def step_runners(self) -> Mapping[type, Any]:
        return {RunEnded: self.ends}
