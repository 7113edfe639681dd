"""Limiters: how many at once, or how many starts per period, fleet-wide.

A :class:`Limiter` is a definition (kind, name, size, period, lease); its state lives in Redis
under the limiter's key (features/limits/scripts.py), so every process and host on the same Redis
shares it. Two ways to use one:

* ``limits = [...]`` on a job class: the processor takes a place in each before the job runs
  (features/limits/gate.py); a job over a limit goes back to the schedule, never failed at once;
* ``with limiter.within(wait=5):`` in any code (``async with`` in async code): waits up to ``wait``
  seconds for a place, then raises :class:`~django_cogworker.errors.OverLimit` (in a job, that
  reschedules it too).

A limiter's name may be a function of the job's arguments (``lambda customer_id, *_:
f"customer:{customer_id}"``): each key it returns is a limiter of its own, of the same kind and
size, grouped under its ``family`` in the admin and the metrics.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from ...bounds import MAX_SECONDS, MAX_SECONDS_TEXT, check_seconds, check_size
from ...broker.keys import Keys
from ...errors import CogworkerError, InvalidArgument, LimitKeyError
from .held import HELD, SEEN, holder_token, wake  # noqa: F401 - (importers: gate.py, upkeep.py, the tests)
from .within import Within

logger = logging.getLogger(__name__)

KINDS = ("concurrent", "bucket", "window", "leaky")
DEFAULT_LEASE = 60.0
KEY_MAX = 200  # characters of a limiter key: it is part of four Redis key names

_defined: dict[str, Limiter] = {}  # static name or family= -> the first limiter defined with it
_all: list[Limiter] = []
_defined_lock = threading.Lock()


class Limiter:
    """One limiter definition. Build it with :meth:`concurrent`, :meth:`bucket`, :meth:`window` or
    :meth:`leaky`; a definition is cheap and holds no connection."""

    def __init__(self, kind: str, name: str | Callable[..., str], size: int, *, per: float | None = None,
                 lease: float | None = None, family: str | None = None):
        if kind not in KINDS:
            raise CogworkerError(f"a limiter's kind is one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.family_given = family is not None
        if callable(name):
            self.name: str | None = None
            self.key_fn: Callable[..., str] | None = name
            self.family = family if family is not None else f"{name.__module__}.{name.__qualname__}"
        else:
            self.name = check_key(name, "a limiter's name")
            self.key_fn = None
            self.family = family if family is not None else self.name
        where = f"{kind} limiter {self.family!r}"
        if family is not None:  # (a family names the keys' group in the admin's URLs and the metrics, as a key does)
            check_key(family, f"{where}: family")
        self.size = check_size(size, f"{where}: size")
        if kind == "concurrent":
            if per is not None:
                raise CogworkerError(f"{where}: a concurrency limit has no period (per); did you mean bucket?")
            self.per: float | None = None
            self.lease: float | None = _seconds(DEFAULT_LEASE if lease is None else lease, f"{where}: lease")
        else:
            if lease is not None:
                raise CogworkerError(f"{where}: only a concurrency limit has a lease")
            self.per = _seconds(per, f"{where}: per")
            self.lease = None
        _register(self)

    @classmethod
    def concurrent(cls, name: str | Callable[..., str], size: int, lease: float = DEFAULT_LEASE, *,
                   family: str | None = None) -> Limiter:
        """At most ``size`` holders at once; a holder that dies frees its place ``lease`` seconds
        after its last renewal (every heartbeat renews the leases of what runs)."""
        return cls("concurrent", name, size, lease=lease, family=family)

    @classmethod
    def bucket(cls, name: str | Callable[..., str], size: int, per: float = 1.0, *,
               family: str | None = None) -> Limiter:
        """At most ``size`` starts in each period of ``per`` seconds, periods aligned to the clock."""
        return cls("bucket", name, size, per=per, family=family)

    @classmethod
    def window(cls, name: str | Callable[..., str], size: int, per: float, *, family: str | None = None) -> Limiter:
        """At most ``size`` starts in any ``per`` seconds (a sliding window)."""
        return cls("window", name, size, per=per, family=family)

    @classmethod
    def leaky(cls, name: str | Callable[..., str], size: int, per: float = 1.0, *,
              family: str | None = None) -> Limiter:
        """A leaky bucket: ``size`` per ``per`` seconds, spaced out (one each ``per / size`` once a
        burst of ``size`` is spent)."""
        return cls("leaky", name, size, per=per, family=family)

    def __repr__(self) -> str:
        detail = f", per={self.per:g}" if self.per is not None else f", lease={self.lease:g}"
        return f"Limiter.{self.kind}({self.family!r}, {self.size}{detail})"

    def spec(self) -> tuple[str, int, float | None, float | None]:
        return self.kind, self.size, self.per, self.lease

    def describe(self) -> str:
        """The spec as the ``limit_specs`` hash stores it (JSON)."""
        return json.dumps({"kind": self.kind, "size": self.size, "per": self.per, "lease": self.lease,
                           "family": self.family}, sort_keys=True)

    def argv(self) -> list[Any]:
        """This limiter's four ARGV entries in the limiter scripts."""
        return [self.kind, self.size, "" if self.per is None else repr(self.per),
                "" if self.lease is None else repr(self.lease)]

    def key_for(self, args: Any = (), kwargs: Any = None) -> str:
        """The key this limiter counts under for a job with these arguments.

        Raises LimitKeyError when the key function raises or returns something other than a
        non-empty string (the job is then filed as a failure with that error, never dropped).
        """
        if self.key_fn is None:
            return self.name  # type: ignore[return-value]
        try:
            key = self.key_fn(*(args or ()), **(kwargs or {}))
        except Exception as exc:
            raise LimitKeyError(f"the key function of limiter {self.family!r} raised {type(exc).__name__}: "
                                f"{exc}") from exc
        try:
            return check_key(key, f"the key function of limiter {self.family!r}")
        except CogworkerError as exc:
            raise LimitKeyError(str(exc)) from None

    def bind(self, *args: Any, **kwargs: Any) -> Limiter:
        """This limiter at the key its function gives for these arguments (for ``within``)."""
        return self.at(self.key_for(args, kwargs))

    def at(self, key: str) -> Limiter:
        """This limiter counted under ``key``, in its family (a group's own key: features/fairness/limits.py)."""
        bound = object.__new__(Limiter)
        bound.__dict__.update(self.__dict__)
        bound.name, bound.key_fn = key, None
        return bound

    def within(self, wait: float = 0.0, *, redis: Any = None, keys: Keys | None = None) -> Within:
        """Hold a place for the block (``with``, or ``async with`` in async code: its waits then
        ``await`` and hold no thread): wait up to ``wait`` seconds for one, else raise OverLimit.

        A concurrency place is given back when the block ends; in a worker process its lease is
        renewed by the heartbeat meanwhile, elsewhere it lasts ``lease`` seconds at most.
        """
        if self.key_fn is not None:
            raise TypeError(f"limiter {self.family!r} is keyed by a function: use "
                            f"{self.family}.bind(*args).within(...) with the arguments its key needs")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
            raise InvalidArgument(f"within(wait=...) takes seconds, 0 or more, got {wait!r}")
        if wait > MAX_SECONDS:  # (10**400 raised OverflowError)
            raise InvalidArgument(f"within(wait=...) takes at most {MAX_SECONDS_TEXT}, got {wait!r}")
        return Within(self, wait, redis, keys)


def check_key(key: Any, where: str) -> str:
    """``key`` if it can name a limiter (a string of 1 to KEY_MAX printable characters, no braces:
    a brace would move its keys' slot on a cluster); else InvalidArgument naming ``where``."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{where} must be a non-empty string, got {key!r}")
    if len(key) > KEY_MAX or not key.isprintable() or "{" in key or "}" in key:
        raise InvalidArgument(f"{where} must be at most {KEY_MAX} printable characters without braces, "
                              f"got {key[:KEY_MAX + 1]!r}")
    return key


def defined() -> list[Limiter]:
    """Every limiter defined so far (one of each name and spec), for ``manage.py check``."""
    with _defined_lock:
        first: dict[tuple, Limiter] = {}
        for limiter in _all:
            first.setdefault((limiter.family, limiter.spec()), limiter)
        return list(first.values())


def _register(limiter: Limiter) -> None:
    """Refuse a second definition of one name (or ``family=``) with another kind, size, period or
    lease. A key function's default family (its dotted name) is not checked: two lambdas of one
    module share it, and their keys are theirs."""
    with _defined_lock:
        _all.append(limiter)
        if limiter.key_fn is not None and limiter.family_given is False:
            return
        first = _defined.setdefault(limiter.family, limiter)
    if first is not limiter and first.spec() != limiter.spec():
        raise CogworkerError(f"limiter {limiter.family!r} is defined twice, differently: {first!r} and {limiter!r} "
                             f"(a limiter is shared by name across the fleet; give one another name)")


def _seconds(value: Any, where: str) -> float:
    # (At most MAX_SECONDS: per=1e300 passed here, then every take failed in its script, leaving
    # the limiter's key without an expiry.)
    check_seconds(value, where, none=False)
    return float(value)
