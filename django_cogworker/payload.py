"""Payloads: encode, decode, and the rules for reading what a payload says.

A payload is one JSON object: ``jid``, ``class`` (a registered job name),
``args``, ``kwargs``, ``queue``, ``retry``, ``created_at``, ``enqueued_at``
(float seconds), and as its life goes on ``retry_count``, ``failed_at``,
``retried_at``, ``error_class``, ``error_message``, ``error_backtrace``,
``orphan_count``, ``dead_reason``...
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Sequence
from typing import Any

from .errors import PayloadError

UNPARSEABLE_CLASS = "(unparseable)"
ERROR_MESSAGE_LIMIT = 10_000
BACKTRACE_DEFAULT_LINES = 50

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_dumps = _encoder.encode


def _one_shot_encoder() -> Any:
    """The C encoder ``_encoder.encode`` builds on every call, built once; None if unavailable.

    ``JSONEncoder.encode`` makes a closure and a new C encoder per call, a third of the
    cost of encoding a payload, paid on every push. Same arguments as the stdlib passes
    (``json.encoder.JSONEncoder.iterencode``), except ``markers``: None, no circular-reference
    check, because that dict would be shared by every thread and is left holding stale ids
    when an encoding fails, which would later be taken for cycles. A cycle still fails
    (RecursionError instead of ValueError); payload arguments can't hold one anyway
    (``check_json_native`` walks them first).
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        c_encode = make(None, _encoder.default, json.encoder.encode_basestring, None, ":", ",",
                        False, False, False)
        sample = {"s": "é\n", "i": 2**70, "f": 0.1, "l": [True, None, {}]}
        # A Python whose private signature differs: keep the slow, documented path.
        if "".join(c_encode(sample, 0)) != _dumps(sample):
            return None
    except Exception:
        return None
    return c_encode


_c_encode = _one_shot_encoder()
_encode_str = json.encoder.encode_basestring  # (what _c_encode uses for every string)


# Jids made ahead, from one os.urandom read per 64: that read is a system call, about half a
# microsecond, which every push made. list.pop and extend are atomic, so threads may share the
# pool; a forked child must not hand out its parent's next jids again, hence the clear.
_jid_pool: list[str] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_jid_pool.clear)


def new_jid() -> str:
    """24 hex characters (96 random bits), as ``secrets.token_hex(12)``."""
    try:
        return _jid_pool.pop()
    except IndexError:
        _jid_pool.extend(new_jids(64))
        return _jid_pool.pop()


def new_jids(n: int) -> list[str]:
    """``n`` jids, as :func:`new_jid` makes them, from one read of the OS's random source
    (a bulk push of 1,000 made 1,000 ``urandom`` calls)."""
    hexed = os.urandom(12 * n).hex()
    return [hexed[i:i + 24] for i in range(0, 24 * n, 24)]


def encode(payload: dict[str, Any]) -> str:
    """Return the one-line JSON form."""
    if _c_encode is not None:
        return "".join(_c_encode(payload, 0))
    return _dumps(payload)


# What differs between the jobs of one perform_bulk; every other field is the same object.
_PER_JOB = frozenset({"jid", "args", "kwargs", "unique_digest"})


def encode_many(items: Sequence[dict[str, Any]]) -> list[str]:
    """``[encode(p) for p in items]``, the same text, made faster for a bulk push.

    The jobs of a bulk push are copies of one payload but for their :data:`_PER_JOB`
    fields. The rest (class, queue, options, created_at and enqueued_at: two of the three
    floats whose formatting was most of the cost) is encoded once from the first item, and
    each job's text is spliced from those pieces and its own fields. An item whose keys
    differ, or whose other fields aren't the very same objects as the first's (a
    middleware changed it), is encoded in full.
    """
    if len(items) < 2 or _c_encode is None:
        return [encode(p) for p in items]
    first = items[0]
    keys = list(first)
    if any(type(k) is not str for k in keys):
        return [encode(p) for p in items]
    # The encoder's output for an object is "{", then '"key":value' joined by ",", then "}",
    # each value encoded as it would be alone: so the pieces between per-job values.
    pieces: list[str] = []
    varying: list[str] = []
    text = "{"
    for i, key in enumerate(keys):
        text += ("," if i else "") + _encode_str(key) + ":"
        if key in _PER_JOB:
            pieces.append(text)
            varying.append(key)
            text = ""
        else:
            text += encode(first[key])
    pieces.append(text + "}")
    head, tail = pieces[0], list(zip(varying, pieces[1:], strict=True))
    fixed_keys = [k for k in keys if k not in _PER_JOB]
    fixed_values = [first[k] for k in fixed_keys]
    fixed = operator.itemgetter(*fixed_keys) if len(fixed_keys) > 1 else None

    def splice(payload: dict[str, Any]) -> str:
        parts = [head]
        for key, piece in tail:
            value = payload[key]
            kind = type(value)
            if kind is str:
                parts.append(_encode_str(value))
            elif kind is dict and not value:
                parts.append("{}")
            else:
                parts.append("".join(_c_encode(value, 0)))
            parts.append(piece)
        return "".join(parts)

    if fixed is None or splice(first) != encode(first):  # (the latter can't happen; if it did, slow is right)
        return [encode(p) for p in items]
    out = []
    for payload in items:
        if list(payload) == keys and all(map(operator.is_, fixed(payload), fixed_values)):
            out.append(splice(payload))
        else:
            out.append(encode(payload))
    return out


def decode(raw: bytes | str) -> dict[str, Any]:
    """Parse a stored payload; raise PayloadError for anything but a JSON object with a class."""
    try:
        payload = _decoder.decode(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser goes. The engine
        # catches PayloadError only; anything else would kill the thread that
        # read the payload instead of sending it to dead.
        raise PayloadError(f"unparseable payload: {exc}") from exc
    if not isinstance(payload, dict):
        raise PayloadError(f"payload is a JSON {type(payload).__name__}, not an object")
    if not isinstance(payload.get("class"), str):
        raise PayloadError("payload has no job class")
    if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
        raise PayloadError("payload args must be a list and kwargs an object")
    return payload


def _reject_constant(name: str) -> Any:
    # NaN and Infinity aren't JSON, though Python's json reads them: a payload
    # holding one ran, but couldn't be written back (retry, the poller's move),
    # and failed on every attempt to, before anything queued behind it.
    raise ValueError(f"{name} is not JSON")


# One decoder for every payload (json.loads with an option builds a new one per call).
_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def dead_letter(raw: bytes | str, reason: str, now: float) -> dict[str, Any]:
    """Build the dead-set entry for a payload we can't even read, keeping the bytes."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return {
        "jid": new_jid(), "class": UNPARSEABLE_CLASS, "args": [], "kwargs": {}, "queue": None,
        "raw": text, "error_class": "PayloadError", "error_message": reason,
        "failed_at": now, "dead_reason": reason,
    }


def check_json_native(value: Any, where: str) -> None:
    """Raise TypeError naming ``where`` if ``value`` would not survive a JSON round trip."""
    # Every push checks its arguments: one cheap walk on exact types, no path strings built.
    # Only what it can't vouch for (a bad value, or a subclass such as an IntEnum or a
    # SafeString, which the full walk accepts) takes the walk that names the offender.
    if type(value) is list:  # (a job's args: its scalars checked here, without a call each)
        for item in value:
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None or (
                    kind is float and item - item == 0.0) or _plainly_native(item):
                continue
            break
        else:
            return
    elif _plainly_native(value):
        return
    _check_naming(value, where)


def _plainly_native(value: Any) -> bool:
    """True if ``value`` is JSON-native using exact built-in types only; False to look closer."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return value - value == 0.0  # finite: inf - inf and NaN - NaN are NaN
    if kind is list:
        return all(map(_plainly_native, value))
    if kind is dict:
        for k, item in value.items():
            if type(k) is not str or not _plainly_native(item):
                return False
        return True
    return False


def _check_naming(value: Any, where: str) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {value!r}: only finite numbers can be sent to a job")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_native(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has the key {k!r}: job arguments' dict keys must be strings")
            check_json_native(item, f"{where}[{k!r}]")
        return
    hint = " (use a list)" if isinstance(value, tuple) else ""
    raise TypeError(
        f"{where} is a {type(value).__name__} ({_short_repr(value)}): job arguments must be JSON-native "
        f"(str, int, float, bool, None, list, dict with str keys){hint}"
    )


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def max_retries(value: Any, default: int) -> int:
    """Read a payload's ``retry`` the cautious way; never raise.

    True or absent: ``default``; False: 0; an int; a float, truncated; a
    numeric string. Anything else (a dict, a word) means no retries, the safe
    reading for a job with side effects, rather than raising in the middle of
    recording its failure.
    """
    if value is None or value is True:
        return default
    if value is False:
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float):
        return max(int(value), 0) if math.isfinite(value) else 0
    if isinstance(value, str):
        try:
            return max(int(value.strip()), 0)
        except ValueError:
            return 0
    return 0


def safe_string(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else str(value)
    return text[:limit]


def error_message(exc: BaseException) -> str:
    """Return the exception's message, truncated; never raises.

    An exception whose own ``__str__`` raises (a broken custom class) used to
    escape from the middle of recording its failure, and the job, counting as
    not yet run, was handed back and run again about once a second, forever.
    """
    try:
        return safe_string(str(exc), ERROR_MESSAGE_LIMIT)
    except BaseException:
        return f"#<{error_class(exc)}>"


def error_class(exc: BaseException) -> str:
    try:
        cls = type(exc)
        return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__qualname__
    except BaseException:
        return "Exception"


def backtrace(exc: BaseException, lines: int) -> list[str]:
    """The last ``lines`` lines of the traceback; never raises."""
    import traceback

    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        try:
            text = "".join(traceback.format_tb(exc.__traceback__))
        except BaseException:
            return []
    return text.splitlines()[-lines:]
