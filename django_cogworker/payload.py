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
import secrets
from typing import Any

from .errors import PayloadError

UNPARSEABLE_CLASS = "(unparseable)"
ERROR_MESSAGE_LIMIT = 10_000
BACKTRACE_DEFAULT_LINES = 50

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def new_jid() -> str:
    return secrets.token_hex(12)


def encode(payload: dict[str, Any]) -> str:
    """Return the one-line JSON form."""
    return _dumps(payload)


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
