"""The typed values a job's path passes through its phases (hooks.py): how an attempt ended
(:class:`Outcome`), what becomes of the job (:class:`Decision`), and the job on its way
(:class:`JobRun`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..settle.retry import Filing
from ..settle.settlement import Ack, Settlement

if TYPE_CHECKING:
    from ...push.scope import Running
    from ..fetch.contract import Unit


class Outcome(enum.Enum):
    """How a job's attempt ended, as the features and the run locks are told."""

    SUCCESS = "success"
    RETRY = "retry"  # filed in retry: it runs again
    DEAD = "dead"  # filed in dead, discarded (dead=False), or dropped without running
    RESCHEDULED = "rescheduled"  # back to the schedule, not counted as a failure (over a limit)

    @property
    def failed(self) -> bool:
        return self is Outcome.RETRY or self is Outcome.DEAD


@dataclass(slots=True, init=False)
class Decision:
    """What becomes of a job: its outcome, the settlement that carries it, and the error if any.

    Made with a bare ACK or Filing (``Decision(Outcome.DEAD, ACK)``), its settlement is that with
    no steps: a :class:`~..settle.settlement.Settlement` in every case.
    """

    outcome: Outcome
    settlement: Settlement
    error: BaseException | None
    # Why, for the log line a failure gets ("retry 1 in 17s", "dead: retries exhausted"); a Decision a
    # feature makes logs its own line and leaves this empty.
    fate: str
    # Filed by the core as a failure (the job raised, or a ``before`` hook did): counted as failed in
    # the stats. A feature's Decision (dropped, cancelled, rescheduled) is not.
    failure: bool

    def __init__(self, outcome: Outcome, settlement: Settlement | Ack | Filing, error: BaseException | None = None,
                 fate: str = "", failure: bool = False):
        self.outcome = outcome
        self.settlement = settlement if isinstance(settlement, Settlement) else Settlement(settlement)
        self.error = error
        self.fate = fate
        self.failure = failure


@dataclass(slots=True, eq=False)
class JobRun:
    """One fetched job on its way through the phases: what each phase reads, and what it leaves.

    ``job_class`` is None for a class this worker doesn't know (its run fails: UnknownJobError).
    ``notes`` holds what a feature keeps from one phase to the next, under its own name.
    """

    unit: Unit
    payload: dict[str, Any]
    job_class: Any
    jid: str  # printable: escaped once for every log line
    shown_class: str
    started: float | None = None  # monotonic, once it started (None: settled before it ran)
    job: Any = None
    value: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0
    scope: Running | None = None  # the job's own view of its run (push/scope.py): ``Job.cancelled`` reads it
    # How a timeout or a cancel with interrupt stops this run (engine/run/interrupts.py): set for a run
    # on the event loop (its task cancelled); None on a thread (the exception raised in it).
    interrupt: Any = None
    place: str | None = None  # the ledger's name of a run on the event loop ("cogworker-loop-<n>")
    decision: Decision | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def raw(self) -> bytes:
        return self.unit.raw

    @property
    def ran(self) -> bool:
        return self.started is not None
