"""The collapse feature on the job's path: a keep_last_if_active run marks its state running as it
starts (a push then keeps a follow-up instead of writing nothing), its state is kept alive while it
runs (``chores``: after each heartbeat), and its settlement carries a :class:`RunEnded` step, seen
through before the ack or filing, that writes the follow-up kept during the run (or releases the
state, or keeps it until the retry). A debounced job lets its state go as it starts (a push then
starts a new job), or, replaced while it waited in its queue, is dropped unrun. Throttled jobs need
nothing here: their push did it all. A job that dies off the job's path (``died``, declaration.py)
ends as a run that ended for good does.

Crash-safe by the order: the step goes before the ack, so a worker killed between them leaves the
job in its in-progress list, and orphan recovery runs it again; the step run again finds the state
naming the follow-up, not this job, and writes nothing twice. A worker killed mid-run: the job comes
back (reliable fetch), its state still names it, and its next run's end writes the follow-up.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from ...engine.run.hooks import Decision, Feature, JobRun, Outcome
from ...engine.settle.retry import Filing
from ...engine.settle.settlement import ACK
from ...errors import CogworkerError
from ...push import payload as payloads
from .scripts import RUN_BEGINS, RUN_ENDED, STILL_RUNNING

logger = logging.getLogger(__name__)
WRONG_TYPE = "is no collapse state (the wrong type)"


class Replaced(CogworkerError):
    """A debounced job an equal push replaced while it waited in its queue: dropped, never run."""


def _mode(payload: dict[str, Any]) -> str | None:
    spec = payload.get("collapse")
    if isinstance(spec, list) and len(spec) == 3 and isinstance(spec[2], str) and isinstance(payload.get("jid"), str):
        return spec[0] if spec[0] in ("keep_last", "debounce") else None
    return None


class RunEnded(NamedTuple):
    """A step of a settlement: a keep_last_if_active run ended (``final``: for good, not to run again;
    ``due``: else when it is due again, epoch seconds, or None)."""

    jid: str
    digest: str
    queue: str
    final: bool
    due: float | None = None

    @property
    def holdable(self) -> bool:
        return False  # (it writes a job: seen through at once, before the ack)


class RunEnds:
    """Runs RunEnded steps (the Settler's runner for them); raises while Redis refuses (kept, run again)."""

    def __init__(self, redis: RedisClient, keys: Keys, ttl: float | None):
        self.redis = redis
        self.keys = keys
        self.ttl_ms = None if ttl is None else max(int(ttl * 1000), 1)  # (None: the state's own TTL)

    def run(self, step: RunEnded) -> None:
        keys = self.keys
        state = keys.collapse(step.digest)
        where = [state, keys.schedule]
        if not keys.spread:  # (on a cluster the queue is in a slot of its own: the follow-up goes through the schedule)
            where += [keys.queue(step.queue), keys.queues]
        args = [step.jid, "1" if step.final else "0", "" if step.due is None else repr(step.due),
                "" if self.ttl_ms is None else self.ttl_ms, step.queue, keys.schedule_wake]
        reply = RUN_ENDED(self.redis, where, args)
        if isinstance(reply, list):  # (a state of the wrong type: moved aside, its follow-up with it)
            quarantine_key(self.redis, keys, state, "hash", WRONG_TYPE)
        elif reply == 2:
            logger.info("jid=%s ended: its follow-up pushed to %r", step.jid, step.queue)

    def run_many(self, steps: Sequence[RunEnded]) -> None:
        for step in steps:
            self.run(step)


def died(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """A keep_last_if_active job that died off the job's path (orphaned too often, killed from the
    admin): it ended for good, so its kept follow-up is written now, as after a run that ended (Sidekiq
    and BullMQ users expect the follow-up once the job is out of the way), or its state goes."""
    if _mode(payload) != "keep_last":
        return
    step = RunEnded(payload["jid"], payload["collapse"][2], str(payload.get("queue")), True)
    RunEnds(redis, keys, None).run(step)


def removed(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """A job removed without running (deleted from a set or its queue, discarded off the job's path):
    keep_last_if_active, as ``died`` (its follow-up, a push of its own, is written: it was never the
    deleted job's to take along); debounce, its state lets it go as its start would (a push then
    writes a job and says "pushed", not "replaced" a job that is gone), or, replaced already, its
    mark is stamped to be pruned. Best effort: the job is gone already; a state Redis refuses
    (logged) is left to its TTL."""
    mode = _mode(payload)
    try:
        if mode == "keep_last":
            died(redis, keys, payload)
        elif mode == "debounce":
            # ("": marks pruned an hour after their drop, the default UNIQUE_LOCK_TTL's: no config here)
            RUN_BEGINS(redis, [keys.collapse(payload["collapse"][2])], [payload["jid"], "", "debounce"])
    except Exception as exc:  # noqa: BLE001 - a Redis refusal or outage: the state lasts its TTL
        logger.error("%s jid=%s removed, its state not released (it expires): %s: %s", mode, payload.get("jid"),
                     type(exc).__name__, payloads.printable(exc))


class KeepLast(Feature):
    """Every class may push with ``keep_last_if_active`` or ``debounce`` (``set(...)``): the payload
    says which do."""

    name = "collapse"
    fields = ("collapse",)

    def __init__(self, redis: RedisClient, keys: Keys, ttl: float):
        self.redis = redis
        self.keys = keys
        self.ends = RunEnds(redis, keys, ttl)
        # The states of the keep_last runs under way here: state key -> jid (refreshed by ``chores``).
        self._running: dict[str, str] = {}
        self._lock = threading.Lock()

    def before(self, run: JobRun) -> Decision | None:
        payload = run.payload
        mode = _mode(payload)
        if mode is None:
            return None
        state = self.keys.collapse(payload["collapse"][2])
        try:
            began = RUN_BEGINS(self.redis, [state], [payload["jid"], self.ends.ttl_ms, mode])
            if not isinstance(began, int):
                quarantine_key(self.redis, self.keys, state, "hash", WRONG_TYPE)
        except Exception as exc:  # (it runs all the same: a push meanwhile writes nothing, as if it waited)
            logger.error("%s: jid=%s not marked running: %s: %s", mode, run.jid, type(exc).__name__,
                         payloads.printable(exc))
            began = None
        if began == 2:
            logger.info("debounced jid=%s class=%s: replaced by an equal push while it waited in its queue; "
                        "dropped, never run", run.jid, run.shown_class)
            return Decision(Outcome.DEAD, ACK, Replaced("replaced by an equal push while it waited in its queue"))
        if mode == "keep_last":
            with self._lock:
                self._running[state] = payload["jid"]
            run.notes[self.name] = state
        return None

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        payload = run.payload
        if _mode(payload) == "keep_last":
            final = decision.outcome is Outcome.SUCCESS or decision.outcome is Outcome.DEAD
            end = decision.settlement.end
            due = end.score if isinstance(end, Filing) and not final else None
            decision.settlement = decision.settlement.first(
                RunEnded(payload["jid"], payload["collapse"][2], str(payload.get("queue")), final, due))
        return decision

    def after(self, run: JobRun) -> None:
        state = run.notes.pop(self.name, None)
        if state is not None:
            with self._lock:
                if self._running.get(state) == run.payload.get("jid"):
                    del self._running[state]

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        return (self.refresh,)

    def refresh(self, redis: RedisClient) -> None:
        """Keep the states of the keep_last runs under way here alive another UNIQUE_LOCK_TTL: a run
        longer than that keeps its follow-up. (A process that dies stops refreshing: its states
        live one TTL from the last beat, long enough for orphan recovery to bring the job back.)"""
        with self._lock:
            running = list(self._running.items())
        if running:
            STILL_RUNNING(redis, [state for state, _ in running], [self.ends.ttl_ms, *(jid for _, jid in running)])

    def step_runners(self) -> Mapping[type, Any]:
        return {RunEnded: self.ends}
