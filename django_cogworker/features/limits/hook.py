"""The limits feature on the job's path: places taken before a run, given back after, and a job
that meets its limit inside its run (``within``) sent back to the schedule.

Two hooks, as their jobs differ: :class:`ClassLimits` only for a class that declares ``limits``
(all a plain job pays is not being in its Plan), :class:`InlineLimits` for every class (any job
may call ``Limiter.within`` and raise OverLimit from its run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...broker.types import RedisClient
from ...engine.run.hooks import Decision, Feature, JobRun, Outcome
from ...engine.settle.settlement import StepRunner
from ...errors import OverLimit
from . import upkeep
from .gate import LimitGate, Release, Releases, Rescheduled, Ticket

NOTE = "limits"  # run.notes: the Ticket of the places taken, or the Rescheduled to park once settled


class ClassLimits(Feature):
    """Takes the places of a class's ``limits`` before its run (one round trip), gives them back after."""

    name = "limits"

    def __init__(self, gate: LimitGate):
        self.gate = gate

    def applies(self, job_class: Any) -> bool:
        return bool(getattr(job_class, "limits", None))

    def before(self, run: JobRun) -> Decision | None:
        taken = self.gate.take(run.payload, run.job_class.limits)
        if taken is None:
            return None
        run.notes[NOTE] = taken
        if isinstance(taken, Rescheduled):
            return Decision(Outcome.RESCHEDULED, taken.filing)
        return None

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        # (Its places go back with its ack, riding the round trip that carries it: gate.py's Release.)
        taken = run.notes.get(NOTE)
        if isinstance(taken, Ticket):
            decision.settlement = Release(taken, run.jid, decision.settlement)
            del run.notes[NOTE]
        return decision

    def after(self, run: JobRun) -> None:
        _after(self.gate, run)

    def step_runners(self) -> Mapping[type, StepRunner]:
        return {Release: Releases(self.gate)}

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        return (self.renew,)

    def renew(self, redis: RedisClient) -> None:
        """Renew the leases of the limiter places held here; index the limiter keys used (upkeep.py)."""
        upkeep.beat(redis, self.gate.keys)


class InlineLimits(Feature):
    """A job whose run raised OverLimit (``within``): back to the schedule with a backoff, its
    retry count untouched, until OVER_LIMIT_MAX; then filed as its failure."""

    name = "limits"

    def __init__(self, gate: LimitGate):
        self.gate = gate

    def decide(self, run: JobRun) -> Decision | None:
        if not isinstance(run.error, OverLimit):
            return None
        rescheduled = self.gate.reschedule(run.payload, run.error, counted=False)
        if rescheduled is None:
            return None  # (filed as its failure, by the core)
        run.notes[NOTE + ".inline"] = rescheduled
        return Decision(Outcome.RESCHEDULED, rescheduled.filing, run.error)

    def after(self, run: JobRun) -> None:
        rescheduled = run.notes.get(NOTE + ".inline")
        if rescheduled is not None:
            self.gate.park(rescheduled)


def _after(gate: LimitGate, run: JobRun) -> None:
    taken = run.notes.get(NOTE)
    if isinstance(taken, Ticket):
        taken.release()
    elif isinstance(taken, Rescheduled):
        gate.park(taken)
