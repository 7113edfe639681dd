"""The limits feature on the job's path: places taken before a run, given back after, and a job
that meets its limit inside its run (``within``) sent back to the schedule.

It rides the round trips the core makes anyway: the takes of the jobs one fetch brings go in one
script call on the fetcher thread (``fetched``, which also keeps each payload it decoded for the
processor), and a run's places go back with its ack, held for the
fetcher's next round trip (``settling``: a Release step). A job dropped before its turn here (an
expired one), or handed back unrun, gives back what the fetch took for it.

Three hooks, as their jobs differ: :class:`ClassLimits` only for a class that declares ``limits``
(all a plain job pays is not being in its Plan), :class:`InlineLimits` for every class (any job
may call ``Limiter.within`` and raise OverLimit from its run), :class:`RefusalCount` only for a
job whose payload counts refusals (``over_limit``: a failure makes them count afresh).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...broker.types import RedisClient
from ...engine.fetch.contract import Unit
from ...engine.run.hooks import DECODED, Decision, Feature, JobRun, Outcome
from ...engine.settle.retry import Filing
from ...engine.settle.settlement import StepRunner
from ...errors import OverLimit
from ...push import payload as payloads
from ...push.job import registered, registry
from . import upkeep
from .gate import LimitGate, Release, Releases, Rescheduled, Ticket

NOTE = "limits"  # run.notes: the Ticket of the places taken, or the Rescheduled to park once settled
FETCHED = "limits.fetched"  # unit.notes: what the fetch's takes got the job (gate.py's Taken)


class ClassLimits(Feature):
    """Takes the places of a class's ``limits`` for the jobs a fetch brings, in one round trip
    (``fetched``), or for one job before its run (``before``, when the fetch's didn't); gives them
    back with the job's ack (``settling``: a Release step).

    ``also``: limiters a job takes beside its class's ``limits``, found from its payload (the
    fairness feature's per-group limits: features/fairness/limits.py), taken with them, all or none;
    an object with ``applies(job_class)`` and ``limits(payload, job_class)``."""

    name = "limits"

    def __init__(self, gate: LimitGate, also: Any = None):
        self.gate = gate
        self.also = also
        self._names: tuple[bytes, ...] | None = None

    def applies(self, job_class: Any) -> bool:
        return bool(getattr(job_class, "limits", None)) or (self.also is not None and self.also.applies(job_class))

    def limits_of(self, payload: dict, job_class: Any) -> tuple[Any, ...]:
        """The limiters a job takes: its class's, and ``also``'s for its payload."""
        own = tuple(getattr(job_class, "limits", None) or ())
        if self.also is None or job_class is None or not self.also.applies(job_class):
            return own
        return own + tuple(self.also.limits(payload, job_class))

    def fetched(self, units: Sequence[Unit]) -> None:
        wanted: list[tuple[dict, Any]] = []
        holders: list[Unit] = []
        names = self._limited_names()
        for unit in units:
            # (A payload names its class as JSON text: one that names no limited class is skipped
            # unread. A false match is read, and skipped then.)
            if not names or not any(name in unit.raw for name in names):
                continue
            try:
                payload = payloads.decode(unit.raw)
            except payloads.PayloadError:
                continue  # (buried by the processor)
            if unit.notes is None:
                unit.notes = {}
            unit.notes[DECODED] = payload  # (the processor's, not decoded again)
            limits = self.limits_of(payload, registered(str(payload.get("class"))))
            if limits:
                wanted.append((payload, limits))
                holders.append(unit)
        if not wanted:
            return
        for unit, taken in zip(holders, self.gate.take_many(wanted), strict=True):
            if unit.notes is not None:  # (set above)
                unit.notes[FETCHED] = taken

    def _limited_names(self) -> tuple[bytes, ...]:
        """The JSON text of each registered class name with ``limits`` (read once: a worker's classes
        are all registered before its first fetch)."""
        if self._names is None:
            self._names = tuple(json.dumps(name).encode() for name, cls in registry().items()
                                if self.applies(cls))
        return self._names

    def returned(self, units: Sequence[Unit]) -> None:
        for unit in units:
            taken = unit.notes.pop(FETCHED, None) if unit.notes else None
            if isinstance(taken, Ticket):
                taken.release()

    def before(self, run: JobRun) -> Decision | None:
        notes = run.unit.notes
        if notes is not None and FETCHED in notes:
            taken = self.gate.resolve(run.payload, notes.pop(FETCHED))
        else:
            limits = self.limits_of(run.payload, run.job_class)
            if not limits:  # (a class with group limits only, pushed ungrouped: none to take)
                return None
            taken = self.gate.take(run.payload, limits)
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
            decision.settlement = decision.settlement.first(Release(taken, run.jid))
            del run.notes[NOTE]
        return decision

    def after(self, run: JobRun) -> None:
        _after(self.gate, run)
        self.returned([run.unit])  # (taken at the fetch for a job dropped before its turn here: expired, say)

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


class RefusalCount(Feature):
    """A job sent back to the schedule by a limit counts its refusals in its payload (``over_limit``,
    the gate's: past OVER_LIMIT_MAX the next fails it). A failure the core files (retry or dead)
    makes them count afresh: its retry's refusals start again from 0."""

    name = "limits"
    fields = ("over_limit",)  # (a job never refused has none: it runs without this hook)

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        end = decision.settlement.end
        if decision.failure and isinstance(end, Filing):
            end.payload.pop("over_limit", None)
        return decision


def _after(gate: LimitGate, run: JobRun) -> None:
    taken = run.notes.get(NOTE)
    if isinstance(taken, Ticket):
        taken.release()
    elif isinstance(taken, Rescheduled):
        gate.park(taken)
