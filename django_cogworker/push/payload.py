"""Payloads: encode, decode, and the rules for reading what a payload says.

A payload is one JSON object: ``jid``, ``class`` (a registered job name),
``args``, ``kwargs``, ``queue``, ``retry``, ``created_at``, ``enqueued_at``
(float seconds), and as its life goes on ``retry_count``, ``failed_at``,
``retried_at``, ``error_class``, ``error_message``, ``error_backtrace``,
``orphan_count``, ``dead_reason``... A job that encrypts (features/encryption/) carries its
arguments sealed in ``encrypted`` (``SEALED``) instead, its ``args`` and ``kwargs`` empty: what a
reader of a payload shows for them is ``SEALED_SHOWN``.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from ..errors import PayloadError

UNPARSEABLE_CLASS = "(unparseable)"
SEALED = "encrypted"  # the payload field that holds the sealed arguments (features/encryption/codec.py)


class Encrypted(str):
    """What the admin and the CLI show for sealed arguments: "(encrypted)" (a str, so that it prints
    as such anywhere; the admin's filters show it without quotes)."""

    __slots__ = ()


SEALED_SHOWN = Encrypted("(encrypted)")
ERROR_MESSAGE_LIMIT = 10_000
BACKTRACE_DEFAULT_LINES = 50  # (frames, for backtrace=True)
# Longest jid, class or queue name put in a log line (longer ones are cut).
LOG_FIELD_LIMIT = 200
# A dead letter keeps the text of what it holds up to the size of that (or this much, if more):
# 10 MB of bytes that aren't UTF-8, each read as U+FFFD (three bytes), made a 31 MB dead entry.
DEAD_RAW_MIN = 64 * 1024

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_dumps = _encoder.encode
# For text holding a lone surrogate ("\ud800", what os.listdir makes of a file name that isn't
# UTF-8), which UTF-8 can't carry: written as the JSON escape \ud800, it reads back the same.
_ascii_encoder = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


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


def encode(payload: Any) -> str:
    """Return the one-line JSON form, always valid UTF-8; raise ValueError for a non-finite number.

    Strings are written as they are (é, not \\u00e9), but for a lone surrogate: a payload holding
    one is written all in ASCII escapes. Redis is sent UTF-8, and a failure message naming a file
    whose name isn't UTF-8 made its filing raise UnicodeEncodeError on every try, forever.
    """
    text = "".join(_c_encode(payload, 0)) if _c_encode is not None else _dumps(payload)
    return text if text.isascii() or _utf8_safe(text) else _ascii_encoder.encode(payload)


def _utf8_safe(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# What differs between the jobs of one perform_bulk; every other field is the same object.
# (encrypted: the sealed arguments, features/encryption/codec.py)
_PER_JOB = frozenset({"jid", "args", "kwargs", "unique_digest", "encrypted"})


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
            text = splice(payload)
            out.append(text if text.isascii() or _utf8_safe(text) else _ascii_encoder.encode(payload))
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
    """Build the dead-set entry for a payload we can't even read, keeping its text.

    The text is kept whole unless it would take more room than what it holds (DEAD_RAW_MIN at
    least): bytes that aren't UTF-8 (shown as U+FFFD, three bytes each) or control characters (six
    each, escaped) are cut there, and ``raw_size`` then gives the size of the whole.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    kept = _cut_to_size(text, max(size, DEAD_RAW_MIN))
    reason = safe_string(reason, ERROR_MESSAGE_LIMIT)
    entry: dict[str, Any] = {
        "jid": new_jid(), "class": UNPARSEABLE_CLASS, "args": [], "kwargs": {}, "queue": None,
        "raw": kept, "error_class": "PayloadError", "error_message": reason,
        "failed_at": now, "dead_reason": reason,
    }
    if len(kept) < len(text):
        entry["raw_size"] = size
    return entry


def _cut_to_size(text: str, budget: int) -> str:
    """The longest start of ``text`` (found in a few tries) whose JSON string takes at most ``budget`` bytes."""
    size = _json_size(text)
    if size <= budget:
        return text
    n = len(text) * budget // size
    while n > 0 and _json_size(text[:n]) > budget:
        n = n * 9 // 10
    return text[:n]


def _json_size(text: str) -> int:
    return len(_encode_str(text).encode("utf-8", "surrogatepass"))


def append_fields(raw: bytes, fields: Mapping[str, Any]) -> bytes:
    """Return ``raw`` (a JSON object :func:`decode` reads) with ``fields`` set and the rest as stored.

    For a payload that reads but can't be written back (1e309 reads as inf, which JSON can't
    hold): it is kept byte for byte and ``fields`` are added at the end of its object, where,
    as later keys, they win over any it had in every JSON reader (Python's, Lua's cjson).
    """
    if not fields:
        return raw
    body = raw.rstrip()
    if not body.endswith(b"}"):
        raise PayloadError("payload is not a JSON object")
    head = body[:-1].rstrip()
    added = _ascii_encoder.encode(dict(fields))[1:-1].encode()  # '"name":value,...'
    return head + (b"" if head.endswith(b"{") else b",") + added + b"}"


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
    """``value`` as text of at most ``limit`` characters that UTF-8 can carry.

    A lone surrogate (what Python makes of bytes that aren't UTF-8 in a file name) is written
    as its escape, ``\\udce9``: the text is for people to read, in the admin or a log.
    """
    text = (value if isinstance(value, str) else str(value))[:limit]
    if text.isascii() or _utf8_safe(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode()[:limit]


def printable(value: Any, limit: int = LOG_FIELD_LIMIT) -> str:
    """``value`` as text for a log line: line breaks, control characters and lone surrogates
    escaped as ``repr`` shows them, cut at ``limit``; never raises.

    A jid holding a newline wrote a line of its own making into the log.
    """
    try:
        text = (value if isinstance(value, str) else str(value))[:limit]
    except Exception:  # noqa: BLE001 - a broken __str__ must not cost the line
        return f"<{type(value).__name__}>"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)[:limit]


def error_message(exc: BaseException) -> str:
    """Return the exception's message, truncated, safe to encode; never raises.

    An exception whose own ``__str__`` raises (a broken custom class) used to
    escape from the middle of recording its failure, and the job, counting as
    not yet run, was handed back and run again about once a second, forever.
    Its message is then ``#<ClassName>``, as cogworker writes it.
    """
    try:
        return safe_string(str(exc), ERROR_MESSAGE_LIMIT)
    except BaseException:
        try:
            return f"#<{safe_string(type(exc).__name__, ERROR_MESSAGE_LIMIT)}>"
        except BaseException:
            return "#<Exception>"


def error_class(exc: BaseException) -> str:
    try:
        cls = type(exc)
        name = f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__qualname__
        return safe_string(name, ERROR_MESSAGE_LIMIT)
    except BaseException:
        return "Exception"


def backtrace(exc: BaseException, frames: int, tb: TracebackType | None = None) -> list[str]:
    """The traceback of ``exc`` (``tb`` if given: a part of it) as lines, with its innermost ``frames``
    frames (and as many of each exception it was raised from), each line cut at ERROR_MESSAGE_LIMIT
    and safe to encode; never raises.

    Counted in frames, as ``backtrace = 5`` reads (Sidekiq's five lines are five frames): counted in
    lines, it kept two frames and a half, two of the five lines the column markers (``^^^^``) that
    Python 3.11 prints under a frame's source, which are left out.
    """
    import traceback

    limit = -max(frames, 1)  # (negative: the innermost frames)
    tb = tb if tb is not None else exc.__traceback__
    try:
        text = "".join(traceback.TracebackException(type(exc), exc, tb, limit=limit).format())
    except BaseException:
        try:
            text = "".join(traceback.format_tb(tb, limit=limit))
        except BaseException:
            return []
    return [safe_string(line, ERROR_MESSAGE_LIMIT) for line in text.splitlines() if not _COLUMN_MARKERS.match(line)]


_COLUMN_MARKERS = re.compile(r"^\s*[~^]+\s*$")


def check_outgoing(payload: dict[str, Any]) -> None:
    """What the client middleware let through must still name a queue and a jid.

    A middleware that set ``queue`` to 5 had the job pushed to ``queue:5`` now but sent to dead
    when scheduled; one that set ``jid`` to None made the push look stopped though it was written.
    """
    for field in ("queue", "jid"):
        value = payload.get(field)
        if not isinstance(value, str) or not value:
            raise TypeError(f"payload {field} must be a non-empty string, got {value!r} "
                            f"(set by a client middleware?)")
    if any(c.isspace() for c in payload["queue"]):  # (a queue's lanes are named "<its key> lane:...")
        raise TypeError(f"payload queue must be a queue name without spaces, got {payload['queue']!r}")
