"""What a job may be sent: JSON-native arguments, checked at push time with a clear error.

A payload is JSON; an argument that doesn't survive the round trip (a tuple, a
date, a Decimal, a dict with int keys, infinity) would reach the job as
something else, or not be written at all. Checked where it is pushed (and where
a periodic entry is declared), naming the offending path. The core's options of a job class and of
a push are checked here too (``check_unique``, ``epoch``; durations and text by ``check_seconds``
and ``check_text`` of bounds.py, held to its bounds); a feature's options, by its declaration
(features/<feature>/declaration.py).
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
from collections.abc import Sequence
from typing import Any

from ..bounds import MAX_DEPTH, MAX_SECONDS, MAX_SECONDS_TEXT
from ..bounds import check_seconds as check_seconds  # (re-exported: imported from here before bounds.py)
from ..bounds import short_repr as _short_repr
from ..errors import InvalidArgument


def check_json_native(value: Any, where: str) -> None:
    """Raise TypeError naming ``where`` if ``value`` (a job's argument list, kwargs or options)
    would not survive a JSON round trip, or nests more than MAX_DEPTH lists and dicts inside it."""
    # Every push checks its arguments: one cheap walk on exact types, no path strings built.
    # Only what it can't vouch for (a bad value, one nested too deep, or a subclass such as an
    # IntEnum or a SafeString, which the full walk accepts) takes the walk that names the offender.
    if type(value) is list:  # (a job's args: its scalars checked here, without a call each)
        for item in value:
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None or (
                    kind is float and item - item == 0.0) or _plainly_native(item, MAX_DEPTH):
                continue
            break
        else:
            return
    elif _plainly_native(value, MAX_DEPTH + 1):  # (the kwargs or options dict itself is no level)
        return
    _check_naming(value, where, MAX_DEPTH + 1)


def _plainly_native(value: Any, room: int) -> bool:
    """True if ``value`` is JSON-native using exact built-in types only, its lists and dicts nested
    at most ``room`` deep; False to look closer."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return value - value == 0.0  # finite: inf - inf and NaN - NaN are NaN
    if kind is list:
        items = value
    elif kind is dict:
        for k in value:
            if type(k) is not str:
                return False
        items = value.values()
    else:
        return False
    if room <= 0:
        return False
    room -= 1
    for item in items:  # (a container's scalars checked here, without a call each)
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None or (kind is float and item - item == 0.0):
            continue
        if not _plainly_native(item, room):
            return False
    return True


def _check_naming(value: Any, where: str, room: int) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {value!r}: only finite numbers can be sent to a job")
        return
    if isinstance(value, (list, dict)) and room <= 0:
        path = where if len(where) <= 80 else where[:77] + "..."
        raise InvalidArgument(f"{path} nests lists and dicts more than {MAX_DEPTH} deep: what a job is sent may "
                              f"nest {MAX_DEPTH} at most (a list holding itself never ends)")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_naming(item, f"{where}[{i}]", room - 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has the key {k!r}: job arguments' dict keys must be strings")
            _check_naming(item, f"{where}[{k!r}]", room - 1)
        return
    hint = " (use a list)" if isinstance(value, tuple) else ""
    if hasattr(value, "_meta") and hasattr(value, "pk"):  # a Django model instance (no Django import here)
        # (Sent whole, it would be stale by the time the job runs, even if it could be encoded.)
        hint = f" (send its primary key, {value.pk!r}, and fetch it again in perform)"
    kind = type(value).__name__
    raise TypeError(
        f"{where} is {_article(kind)} {kind} ({_short_repr(value)}): job arguments must be JSON-native "
        f"(str, int, float, bool, None, list, dict with str keys){hint}"
    )


def _article(word: str) -> str:
    """ "an" before a vowel sound: "an Order", "a datetime", "a UUID" (a leading U reads "you")."""
    return "an" if word[:1].lower() in ("a", "e", "i", "o") else "a"


class _Arity:
    """What ``perform`` accepts, read once per function: pushes check against it (perform_async is hot).

    The common case (no keyword arguments given) is a range check on the count of positional
    ones; anything else is bound to the signature, for its exact message, once per shape: whether
    a call binds depends only on how many positional arguments it has and which keywords, so the
    shapes that did are kept (``fits``, a few dozen at most) and not bound again (5 us each).
    """

    __slots__ = ("low", "high", "needs_keywords", "signature", "fits")

    def __init__(self, signature: inspect.Signature):
        self.signature = signature
        self.fits: set[tuple[int, frozenset[str]]] = set()
        params = list(signature.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.low = sum(1 for p in positional if p.default is p.empty)
        self.high = math.inf if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional)
        self.needs_keywords = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params)


_arities: dict[Any, _Arity | None] = {}


def check_call(job_class: type, args: Sequence[Any], kwargs: dict[str, Any], where: str = "") -> None:
    """Raise TypeError naming the job and its ``perform`` signature if ``perform(*args, **kwargs)`` can't bind.

    Without it, ``Hello.perform_async(1, 2, 3)`` returned a jid, then failed with a TypeError in
    the worker and was retried 25 times over some 20 days.
    """
    perform = job_class.perform  # type: ignore[attr-defined]  # (the key: a perform replaced on the class is read afresh)
    try:
        arity = _arities[perform]
    except KeyError:
        arity = _arities[perform] = _arity_of(job_class)
    except TypeError:  # (an unhashable callable: not cached)
        arity = _arity_of(job_class)
    if arity is None or (not kwargs and not arity.needs_keywords and arity.low <= len(args) <= arity.high):
        return
    shape = (len(args), frozenset(kwargs))
    if shape in arity.fits:
        return
    try:
        arity.signature.bind(*args, **kwargs)
        if len(arity.fits) < 64:
            arity.fits.add(shape)
    except TypeError as exc:
        shown = ", ".join([*map(_short_repr, args), *(f"{k}={_short_repr(v)}" for k, v in kwargs.items())])
        raise TypeError(f"{where}{getattr(job_class, 'name', job_class.__qualname__)}.perform{arity.signature} "
                        f"can't take ({shown}): {exc}") from None


def _arity_of(job_class: type) -> _Arity | None:
    """The arity of ``job_class.perform`` without ``self``; None if it takes anything or can't be read."""
    raw = inspect.getattr_static(job_class, "perform", None)
    try:
        signature = inspect.signature(job_class.perform)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # (a builtin or a callable object without a signature: not checked)
        return None
    params = list(signature.parameters.values())
    if not isinstance(raw, (staticmethod, classmethod)) and inspect.isfunction(raw) and params:
        params = params[1:]  # self
        signature = signature.replace(parameters=params)
    if any(p.kind is p.VAR_POSITIONAL for p in params) and any(p.kind is p.VAR_KEYWORD for p in params):
        return None  # (*args, **kwargs): anything binds
    return _Arity(signature)


def epoch(when: float | dt.datetime) -> float:
    if isinstance(when, dt.datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            # A naive datetime is ambiguous (UTC? the server's zone? TIME_ZONE?);
            # guessing wrong runs a job hours early or late.
            raise ValueError(f"perform_at needs an aware datetime (e.g. django.utils.timezone.now()), got {when!r}")
        return when.timestamp()
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        try:
            seconds = float(when)
        except OverflowError:  # (an int past any float: 10**400)
            seconds = math.inf
        if not math.isfinite(seconds):
            # NaN compares false with every time: the job would run at once; inf, never.
            raise InvalidArgument(f"the time to run a job must be finite, got {_short_repr(when)}")
        return seconds
    raise TypeError(f"perform_at takes an aware datetime or epoch seconds, got {when!r}")


def check_unique(unique_for: Any, unique_until: Any, where: str) -> None:
    if unique_for is not None and unique_for is not True and (
            isinstance(unique_for, bool) or not isinstance(unique_for, (int, float)) or not 0 < unique_for < math.inf):
        raise InvalidArgument(f"{where}: unique_for must be a positive number of seconds, or True for "
                              f"UNIQUE_LOCK_TTL (a lock needs a TTL so a crash can't hold it forever), "
                              f"got {_short_repr(unique_for)}")
    if unique_for is not None and unique_for is not True and unique_for > MAX_SECONDS:
        raise InvalidArgument(f"{where}: unique_for must be at most {MAX_SECONDS_TEXT}, got {_short_repr(unique_for)}")
    if unique_until not in ("success", "start"):
        raise InvalidArgument(f'{where}: unique_until must be "success" or "start", got {unique_until!r}')
