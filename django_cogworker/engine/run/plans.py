"""The hooks of the features each job class uses, phase by phase, built once per class (a Plan), and
the per-process hooks of a whole fetch (FetchHooks). The phases themselves: hooks.py."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .hooks import AsyncCall, Call, Decision, Feature, JobRun, feature_error

if TYPE_CHECKING:
    from ..fetch.contract import Unit

logger = logging.getLogger(__name__)

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
    refused: bool = False
    # The ``around_async`` hooks, and whether a job of this plan runs on the event loop: its perform is
    # ``async def`` and every around hook it uses (and the server middleware) has an async form.
    around_async: tuple[Callable[[JobRun, AsyncCall], Any], ...] = ()
    on_loop: bool = False

    def for_payload(self, payload: dict[str, Any]) -> Plan:
        """This plan, or its ``bare`` one for a payload with none of its features' fields."""
        bare = self.bare
        return bare if bare is not None and self.fields.isdisjoint(payload) else self

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
        return dataclasses.replace(full, fields=fields,
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
