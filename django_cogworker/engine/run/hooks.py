"""The named phases of a job's path, where features plug in, and the per-class lists of them.

The core (:mod:`.processor`) does the same for every job: decode, look up the class, record it as
running, run it through the server middleware, settle exactly one settlement, release. A feature
(batches, limits, cancellation, expiry, results and timeouts, run locks, encryption, or one of a
project's own: docs/extending.md) is a :class:`Feature` that overrides the phases it needs:

``fetched(units)`` / ``returned(units)``
    On the fetcher thread, once per fetch, with the jobs it brought, before any runs: work done for
    all of them in one round trip (a limit's takes), kept in ``unit.notes``; and, for jobs fetched
    that never run here, what it took given back.
``before(run)``
    Before the job starts, in the features' order. Return a :class:`Decision` to settle it without
    running it (dropped: expired, cancelled; rescheduled: over a limit). Raise to fail it unrun:
    filed like a job that raised (retry, then dead). May keep what it took on ``run`` (a limit's
    places), for ``after`` to give back.
``around(run, call)``
    Around the run, the first feature outermost, the server middleware (``CloseOldConnections``
    first) innermost: return ``call()``'s value, or what to keep of it.
``around_async(run, call)``
    The same around a job run on the event loop (engine/loop/runner.py): ``await call()``. A job
    class whose ``perform`` is ``async def`` runs on the loop only when every feature its plan uses
    that has an ``around`` has this form too (and the server middleware, each an ``acall``: see
    push/middleware.py); else it runs on a processor thread, as a sync job does, its coroutine
    driven by ``async_to_sync`` (a sync ``around`` can't be wrapped around an awaited run: what
    it sets up would be torn down before the job's first await). Decided per plan, once:
    ``Plan.on_loop``.
``decide(run)``
    Once a run ended (``run.error`` set, or a value): claim the end as the feature's own and say what
    becomes of the job (a cancelled run: dead, never retried; a job that met its limit inside its
    run: rescheduled). The first Decision wins; with none, the core acks a success and files a
    failure through the retry policy.
``settling(run, decision)``
    What the settlement carries, in the features' order: record the outcome (a result), or add a
    step of the feature's own that goes through before the ack or filing
    (``decision.settlement = decision.settlement.first(step)``: a batch step, a limit's release).
    Returns the decision, changed or not.
``after(run)``
    Once settled, whatever happened, in reverse order: give back what ``before`` took, release
    locks, count. Never raises into the core (logged).

Which phases a feature takes part in is read once from the methods it overrides, and which
features a job class uses once from :meth:`Feature.applies` (``Plans``): a job pays only for the
features its class uses. A hook that raises costs no processor and no job: in ``applies``,
``before`` or ``decide`` it fails the job (retry, then dead; ``applies`` and ``decide`` as a
:class:`~...errors.FeatureError` naming the feature and the hook), in ``around`` it is the job's
failure, in ``settling``, ``after``, ``fetched`` and ``returned`` it is logged and the job settles
as it would have. A feature whose use depends on the payload (a job of a batch, one with a
unique lock) names its fields (``Feature.fields``): a job whose payload has none of them runs
through its class's plan without that feature.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import FeatureError
from ..settle.retry import Filing
from ..settle.settlement import Ack, Settlement

if TYPE_CHECKING:
    from ...broker.keys import Keys
    from ...broker.types import RedisClient
    from ...conf import Config
    from ...push.scope import Running
    from ..fetch.contract import Unit
    from ..settle.retry import RetryPolicy
    from ..settle.settlement import StepRunner

logger = logging.getLogger(__name__)


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


Call = Callable[[], Any]
AsyncCall = Callable[[], Awaitable[Any]]


class Feature:
    """Base of every feature: override the phases it takes part in (see the module's header).

    ``name`` says which feature a log line or a note is about. A feature is made once per worker
    process (the Launcher's, or the project's ``COGWORKER["FEATURES"]``) and shared by its
    processor threads: whatever it keeps per job goes in ``run.notes``.
    """

    name = "feature"
    # The payload fields whose presence makes this feature act (a batch's ``bid``, a unique job's
    # digest): a job whose payload has none of them runs without its hooks. Empty: every job of
    # the classes it applies to.
    fields: tuple[str, ...] = ()

    def applies(self, job_class: Any) -> bool:
        """Whether jobs of ``job_class`` (None: a class this worker doesn't know) use this feature;
        asked once per class."""
        return True

    def fetched(self, units: Sequence[Unit]) -> None:
        """On the fetcher thread, once per fetch, with the jobs it brought, before any of them runs:
        what a feature does for all of them in one round trip (a limit's takes). What it keeps for a
        job goes in ``unit.notes``, for its ``before`` to find. One that raises is logged, and each
        job's ``before`` does the work alone."""
        return None

    def returned(self, units: Sequence[Unit]) -> None:
        """Jobs a fetch brought that never run here (handed back at quiet or stop; taken back by
        orphan recovery after a stall): give back what ``fetched`` took for them."""
        return None

    def before(self, run: JobRun) -> Decision | None:
        return None

    def around(self, run: JobRun, call: Call) -> Any:
        return call()

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        return await call()

    def decide(self, run: JobRun) -> Decision | None:
        return None

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        return decision

    def after(self, run: JobRun) -> None:
        return None

    # -- the services a feature asks of the worker: none, unless it overrides them ---------------

    def chores(self) -> Sequence[Callable[[RedisClient], None]]:
        """Work after each heartbeat, called with the Redis client on the features' chore thread
        (engine/process/chores.py: never delaying a beat) (a limit's leases renewed, the cancel
        requests read); one that raises is logged, and the round after the next beat calls it again."""
        return ()

    def housekeeping(self) -> Sequence[tuple[str, Callable[[], object]]]:
        """Steps of the poller's timed rounds, each named for the log (a batch's closings swept); on
        the poller's thread, after the core's. A step times itself (most need not run every round)."""
        return ()

    def start(self) -> None:
        """Start what the feature runs beside the processors (a thread of its own: the timeout
        watcher); called by the Launcher once the first beat went through, before any job runs."""
        return None

    def stop(self) -> None:
        """At shutdown, once the processors stopped: stop its thread, write what it kept through an
        outage (lock releases). One that raises is logged (stop_features)."""
        return None

    def requeued(self, payload: dict[str, Any]) -> None:
        """A job handed back to its queue at shutdown (one running or not yet started): what it holds
        while it waits again (a periodic run keeps its lock)."""
        return None

    def step_runners(self) -> Mapping[type, StepRunner]:
        """The runners of the steps this feature's ``settling`` adds, by the step's type
        (the Settler runs each step through its runner before the job's ack or filing)."""
        return {}


@dataclass(frozen=True)
class WorkerParts:
    """What a worker process hands the features it is built with (``COGWORKER["FEATURES"]``: each
    entry is called with these and returns a Feature, or several). A feature makes the services it
    needs from them (the cancel requests it reads, the timeout watcher's thread, the lock releases
    it keeps through an outage) and asks the worker to drive them through its ``chores``,
    ``housekeeping``, ``start`` and ``stop``: the worker names none of them."""

    config: Config
    redis: RedisClient
    keys: Keys
    identity: str
    retry: RetryPolicy
    # Whether a supervisor (``--processes``) replaces this process when asked: a job stuck past its
    # timeout can then be ended with its process (engine/run/timeouts.py).
    supervised: bool = False


def feature_error(feature: Any, phase: str, error: BaseException,
                  job_error: BaseException | None = None) -> FeatureError:
    """The failure a job is filed with when ``feature``'s ``phase`` hook raised ``error`` (a hook's
    feature, if a hook is given), caused by it; ``job_error``: what the job's run had raised, if it had."""
    from ...push import payload as payloads

    feature = getattr(feature, "__self__", feature)  # (a Plan's hooks are the features' bound methods)
    kind = type(feature)
    said = (f"feature {getattr(feature, 'name', '?')!r} ({kind.__module__}.{kind.__qualname__}) raised in {phase}: "
            f"{payloads.error_class(error)}: {payloads.error_message(error)}")
    if job_error is not None:
        said += f" (the job had raised {payloads.error_class(job_error)}: {payloads.error_message(job_error)})"
    failure = FeatureError(said)
    failure.__cause__ = error  # (as ``raise ... from error``: the hook's traceback is shown with it)
    failure.__suppress_context__ = True
    return failure

