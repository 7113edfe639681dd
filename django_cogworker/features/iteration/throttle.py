"""Throttles: when an iterable job should stop, save its cursor, give its thread back and come back
later, instead of holding a worker while it waits.

``throttle_on = [(condition, backoff), ...]`` on an IterableJob. Each entry is one of:

* ``(callable, backoff)``: the callable (no argument, or the job) is asked before each item; when
  it returns true (the database's replication lag is high), the job goes back to the schedule,
  due ``backoff`` seconds later (a number, or a callable of the same kind returning one). Asked
  before *each* item: a condition that costs a query should keep its answer a while itself.
* ``(limiter, backoff)`` or a bare ``limiter``: a :class:`~django_cogworker.Limiter` (one of the
  fleet-wide limiters, features/limits/) takes a place for each item, without waiting
  (``within(wait=0)``): a rate limiter one start per item, a concurrency limiter a place held for
  the item. Refused, the job goes back to the schedule after ``backoff`` (None: when the limiter
  says a place frees, else :data:`LIMITER_BACKOFF`). A limiter keyed by a function of the job's
  arguments is bound to them once per run.

A limiter's place is a round trip per item: for a rate a partner enforces per call, that is the
point; for "no more than N of these jobs at once", ``limits = [...]`` on the class takes one place
per run instead (features/limits/).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ...bounds import check_seconds, short_repr
from ...errors import InvalidArgument, OverLimit
from ..limits.limiter import Limiter

logger = logging.getLogger(__name__)

LIMITER_BACKOFF = 1.0  # seconds before a job a concurrency limiter refused comes back (it can't tell when)
# The shortest backoff: each time a throttled job comes back it begins a run (a round trip, its
# enumerator built, its length counted) and may be throttled again; a backoff of 0 made that a loop
# as fast as the poller could be woken, a thread and Redis kept busy for as long as the condition held.
MIN_BACKOFF = 1.0


@dataclass(frozen=True)
class Throttle:
    """One ``throttle_on`` entry, checked: a condition or a limiter, and its backoff."""

    condition: Callable[..., Any] | None
    limiter: Limiter | None
    backoff: float | Callable[..., Any] | None
    passes_job: bool = False  # the condition (and a callable backoff) takes the job


def _takes_job(function: Callable[..., Any], where: str) -> bool:
    """Whether ``function`` takes the job as its one argument (else none): InvalidArgument if neither."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # (a builtin without a signature: called as it is)
        return False
    try:
        signature.bind()
        return False
    except TypeError:
        pass
    try:
        signature.bind(None)
        return True
    except TypeError:
        raise InvalidArgument(f"{where} must take no argument, or the job, got {short_repr(function)}") from None


def check_throttles(value: Any, where: str) -> tuple[Throttle, ...]:
    """``throttle_on`` as kept: a tuple of Throttle; InvalidArgument naming ``where`` and the entry."""
    if value is None or value == ():
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgument(f"{where} must be a list of (condition, backoff) pairs or limiters, "
                              f"got {short_repr(value)}")
    checked = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if isinstance(entry, Throttle):
            checked.append(entry)
            continue
        if isinstance(entry, Limiter):
            entry = (entry, None)
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise InvalidArgument(f"{at} must be a (condition, backoff) pair or a Limiter, got {short_repr(entry)}")
        condition, backoff = entry
        if isinstance(condition, Limiter):
            if backoff is not None and not callable(backoff):
                _check_backoff(backoff, f"{at}'s backoff")
            checked.append(Throttle(None, condition, backoff,
                                    callable(backoff) and _takes_job(backoff, f"{at}'s backoff")))
            continue
        if not callable(condition):
            raise InvalidArgument(f"{at}'s condition must be a callable or a Limiter, got {short_repr(condition)}")
        passes = _takes_job(condition, f"{at}'s condition")
        if callable(backoff):
            if _takes_job(backoff, f"{at}'s backoff") != passes:
                raise InvalidArgument(f"{at}: its condition and its backoff must both take the job, or neither")
        else:
            _check_backoff(backoff, f"{at}'s backoff")
        checked.append(Throttle(condition, None, backoff, passes))
    return tuple(checked)


def _check_backoff(backoff: Any, where: str) -> None:
    check_seconds(backoff, where, none=False, zero=True)
    if backoff < MIN_BACKOFF:
        raise InvalidArgument(f"{where} must be at least {MIN_BACKOFF:g} seconds, got {backoff!r}")


class Throttles:
    """One run's throttles: its conditions (asked before each item) and its limiters (bound to the
    run's arguments). Made by the loop once per run; what it asks is the job's own code."""

    def __init__(self, throttles: Sequence[Throttle], job: Any, args: Sequence[Any], kwargs: dict[str, Any]):
        self.job = job
        self.conditions = [t for t in throttles if t.condition is not None]
        self.limiters = [(t, t.limiter.bind(*args, **kwargs) if t.limiter.key_fn is not None else t.limiter)
                         for t in throttles if t.limiter is not None]

    def held(self) -> float | None:
        """The backoff of the first condition that holds now, or None (go on)."""
        for throttle in self.conditions:
            condition = throttle.condition
            assert condition is not None
            if condition(self.job) if throttle.passes_job else condition():
                return self._backoff(throttle, None)
        return None

    def places(self) -> tuple[list[AbstractContextManager[Any]], float | None]:
        """Take a place in each limiter for one item: (the places entered, to exit after it; the
        backoff if one refused, its places already given back)."""
        entered: list[AbstractContextManager[Any]] = []
        for throttle, limiter in self.limiters:
            place = limiter.within(0.0)
            try:
                place.__enter__()
            except OverLimit as exc:
                release(entered)
                return [], self._backoff(throttle, exc.retry_after)
            except BaseException:  # (Redis away, a key function raising: the places taken go back first)
                release(entered)
                raise
            entered.append(place)
        return entered, None

    def _backoff(self, throttle: Throttle, retry_after: float | None) -> float:
        backoff = throttle.backoff
        if callable(backoff):
            backoff = backoff(self.job) if throttle.passes_job else backoff()
            check_seconds(backoff, f"{type(self.job).__qualname__}.throttle_on backoff", none=False, zero=True)
        if backoff is None:
            backoff = retry_after if retry_after is not None else LIMITER_BACKOFF
        return max(float(backoff), MIN_BACKOFF)  # (a callable's or a limiter's 0 too: see MIN_BACKOFF)


def release(places: list[AbstractContextManager[Any]]) -> None:
    """Give back the places taken for an item (the last taken first), each on its own: one whose
    release raises (Redis away: its lease ends it) is logged and the others are still given back,
    and the item's own outcome stands."""
    for place in reversed(places):
        try:
            place.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - a release never fails the item it followed
            logger.warning("a throttle's limiter place was not given back (%s: %s); its lease ends it",
                           type(exc).__name__, exc)
