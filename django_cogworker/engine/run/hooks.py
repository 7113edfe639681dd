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
through its class's plan without that feature (``Plan.for_payload``: one plan per set of fields present).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import FeatureError
from .outcomes import Decision, JobRun, Outcome

__all__ = ["AsyncCall", "Call", "Decision", "Feature", "FetchHooks", "JobRun", "Outcome", "Plan", "Plans",
           "WorkerParts", "feature_error", "is_coroutine_class"]

if TYPE_CHECKING:
    from ...broker.keys import Keys
    from ...broker.types import RedisClient
    from ...conf import Config
    from ..fetch.contract import Unit
    from ..settle.retry import RetryPolicy
    from ..settle.settlement import StepRunner

logger = logging.getLogger(__name__)


Call = Callable[[], Any]
AsyncCall = Callable[[], Awaitable[Any]]


# unit.notes: the payload a ``fetched`` hook decoded, for the processor to take instead of decoding
# it again (a limited job's was decoded twice: a tenth of a take's worker CPU). Read-only until then.
DECODED = "payload"


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


PHASES = ("fetched", "returned", "before", "around", "decide", "settling", "after")


def _overrides(feature: Feature, phase: str) -> bool:
    return getattr(type(feature), phase) is not getattr(Feature, phase)


def is_coroutine_class(job_class: Any) -> bool:
    """Whether ``job_class``'s ``perform`` is ``async def`` (a class this worker doesn't know: no)."""
    return job_class is not None and inspect.iscoroutinefunction(getattr(job_class, "perform", None))


class FetchHooks:
    """The ``fetched`` and ``returned`` hooks of every feature that has them, for the fetcher (a
    fetch brings jobs of several classes: these are per process, not per class). Never raises."""

    def __init__(self, features: Sequence[Feature]):
        self._fetched = [f.fetched for f in features if _overrides(f, "fetched")]
        self._returned = [f.returned for f in features if _overrides(f, "returned")]

    def fetched(self, units: Sequence[Unit]) -> None:
        for hook in self._fetched:
            _quietly(hook, units)

    def returned(self, units: Sequence[Unit]) -> None:
        if units:
            for hook in self._returned:
                _quietly(hook, units)


def _quietly(hook: Callable[[Sequence[Unit]], None], units: Sequence[Unit]) -> None:
    try:
        hook(units)
    except Exception:
        logger.exception("%s failed for %d job(s)", getattr(hook, "__qualname__", repr(hook)), len(units))


@dataclass(frozen=True, slots=True)
class Plan:
    """The hooks one job class uses, phase by phase (built once per class; a plan a feature's
    ``applies`` raised for, ``refused``, is built again for each job until it builds)."""

    job_class: Any
    before: tuple[Callable[[JobRun], Decision | None], ...]
    around: tuple[Callable[[JobRun, Call], Any], ...]
    decide: tuple[Callable[[JobRun], Decision | None], ...]
    settling: tuple[Callable[[JobRun, Decision], Decision], ...]
    after: tuple[Callable[[JobRun], None], ...]
    # The payload fields of the features used only when present (Feature.fields), and this plan
    # without those features: what a job whose payload has none of them runs through.
    fields: frozenset[str] = frozenset()
    bare: Plan | None = None
    # This plan with only the features whose fields a payload has, by those fields present (built
    # on first sight by ``narrow``): a job of a batch ran every such feature's hooks (an expiry's, a
    # unique lock's, an encryption's, a profile's...), 70-90 µs of worker CPU a job for nothing.
    narrowed: dict[frozenset[str], Plan] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    narrow: Callable[[frozenset[str]], Plan] | None = dataclasses.field(default=None, compare=False, repr=False)
    refused: bool = False
    # The ``around_async`` hooks, and whether a job of this plan runs on the event loop: its perform is
    # ``async def`` and every around hook it uses (and the server middleware) has an async form.
    around_async: tuple[Callable[[JobRun, AsyncCall], Any], ...] = ()
    on_loop: bool = False

    def for_payload(self, payload: dict[str, Any]) -> Plan:
        """This plan without the features none of whose fields ``payload`` has: its ``bare`` one for
        a payload with none of them. (A dict set from two threads at worst builds one twice.)"""
        bare = self.bare
        if bare is None:
            return self
        present = self.fields.intersection(payload)
        if not present:
            return bare
        plan = self.narrowed.get(present)
        if plan is None:
            plan = self.narrowed[present] = self.narrow(present) if self.narrow is not None else self
        return plan

    def run_through(self, run: JobRun, innermost: Call) -> Any:
        """``innermost()`` run inside every ``around`` hook, the first outermost."""
        around = self.around
        if len(around) == 1:  # (most classes: one hook, no closure to build per job)
            return around[0](run, innermost)
        call = innermost
        for hook in reversed(around):
            call = _bind(hook, run, call)
        return call()

    async def run_through_async(self, run: JobRun, innermost: AsyncCall) -> Any:
        """``await innermost()`` inside every ``around_async`` hook, the first outermost."""
        call = innermost
        for hook in reversed(self.around_async):
            call = _bind(hook, run, call)
        return await call()


def _bind(hook: Callable[[JobRun, Any], Any], run: JobRun, call: Any) -> Any:
    return lambda: hook(run, call)


class Plans:
    """The Plan of each job class, made on first sight and kept (one lock, taken only then).

    ``async_chain``: whether the server middleware has an async form (push/middleware.py); without
    one, no job runs on the event loop."""

    def __init__(self, features: Sequence[Feature], async_chain: bool = True):
        self.features = tuple(features)
        self.async_chain = async_chain
        self._plans: dict[Any, Plan] = {}
        self._lock = threading.Lock()

    def plan(self, job_class: Any) -> Plan:
        """The Plan for ``job_class`` (None: a class this worker doesn't know)."""
        try:
            return self._plans[job_class]
        except KeyError:
            pass
        with self._lock:
            plan = self._plans.get(job_class)
            if plan is None:
                plan = self._build(job_class)
                if not plan.refused:
                    self._plans[job_class] = plan
            return plan

    def _build(self, job_class: Any) -> Plan:
        """The class's plan. A feature whose ``applies`` raises gives a ``refused`` plan, of the
        features that answered, whose first ``before`` fails the job naming that feature: raised
        to the processor, it killed the thread on every job of the class, none ever filed.
        (Not kept: a plan lives as long as the process, and an ``applies`` that failed for a
        moment, a database away, would have failed every job of its class until a restart.)"""
        used: list[Feature] = []
        refusal: tuple[Callable[[JobRun], Decision | None], ...] = ()
        for feature in self.features:
            try:
                if feature.applies(job_class):
                    used.append(feature)
            except BaseException as exc:  # noqa: BLE001 - a feature's bug: its jobs are filed, no thread dies
                refusal = refusal or (_refuse(feature, exc),)
        fields = frozenset(field for f in used for field in f.fields)
        loop = self.async_chain and is_coroutine_class(job_class)
        full = _plan(job_class, used, refusal, loop)
        if loop and not full.on_loop:  # (said once per class: a job pushed with a field only, said once too)
            sync_only = [f for f in used if _overrides(f, "around") and not _overrides(f, "around_async")]
            logger.info("%s: an async perform run on a thread (async_to_sync), not the event loop%s: feature(s) "
                        "%s have no around_async", getattr(job_class, "__qualname__", job_class),
                        " when its payload asks for them" if all(f.fields for f in sync_only) else "",
                        ", ".join(repr(f.name) for f in sync_only))
        if not fields:
            return full
        def narrow(present: frozenset[str]) -> Plan:
            return _plan(job_class, [f for f in used if not present.isdisjoint(f.fields) or not f.fields],
                         refusal, loop)

        return dataclasses.replace(full, fields=fields, narrow=narrow,
                                   bare=_plan(job_class, [f for f in used if not f.fields], refusal, loop))


def _refuse(feature: Feature, error: BaseException) -> Callable[[JobRun], Decision | None]:
    def refuse(run: JobRun) -> Decision | None:
        raise feature_error(feature, "applies", error)  # (a new one each time: a raise grows its traceback)

    return refuse


def _plan(job_class: Any, used: list[Feature], refusal: tuple[Callable[[JobRun], Decision | None], ...] = (),
          loop: bool = False) -> Plan:
    def hooks(phase: str) -> tuple[Any, ...]:
        return tuple(getattr(f, phase) for f in used if _overrides(f, phase))

    sync_only = any(_overrides(f, "around") and not _overrides(f, "around_async") for f in used)
    return Plan(job_class, refusal + hooks("before"), hooks("around"), hooks("decide"), hooks("settling"),
                tuple(reversed(hooks("after"))), refused=bool(refusal), around_async=hooks("around_async"),
                on_loop=loop and not sync_only)
