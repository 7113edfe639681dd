"""The bounds every value a call takes is held to, and the checks that name what breaks them.

A value past them failed halfway through, in Redis or in Python, after keys were written:
``Batch(ttl=1e16)`` inside the script that opens it, leaving its keys without an expiry; a
limiter's ``per=1e300`` at every take; ``10**400`` as OverflowError; arguments nested 2,000 deep
as RecursionError; a lone surrogate as UnicodeEncodeError from redis-py. Each check raises
:class:`~django_cogworker.errors.InvalidArgument` naming the parameter and the value, before
anything is written. A leaf: the settings (conf/rules.py), the push side, batches and limiters use it.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import InvalidArgument

# The longest duration a call takes (a TTL, a period, a lease, a wait): a billion seconds, about 31
# years. Redis refuses an EXPIRE past some 9.2e15 s (its milliseconds overflow 64 bits), Lua's
# numbers are doubles, exact to 2**53 (some 9e12 s in milliseconds), and a bucket limiter's state
# lives 2 x per in ms: ``Batch(ttl=1e16)`` failed inside a script after writing keys that never
# expired, and ``per=1e300`` failed every take. This bound keeps every such sum exact and accepted.
MAX_SECONDS = 1e9
MAX_SECONDS_TEXT = "1e9 seconds (about 31 years)"
# The largest count a call takes (a limiter's size): far past any real limit, exact in a double.
MAX_SIZE = 10**9
# How deep lists and dicts may nest in what a job is sent (its arguments, a callback's options,
# counted inside the argument list or options dict): every walk of them, the JSON encoder's and
# decoder's included, recurses, and 2,000 levels raised RecursionError in the middle of a push.
MAX_DEPTH = 100


def check_seconds(value: Any, where: str, *, none: bool = True, zero: bool = False) -> None:
    """Raise InvalidArgument naming ``where`` unless ``value`` is a number of seconds above 0 (or
    0 with ``zero``; or None, with ``none``) and at most MAX_SECONDS."""
    if value is None and none:
        return
    # (Compared, never converted: math.isfinite(10**400) raises OverflowError.)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero else value > 0) \
            or value == math.inf:
        what = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
        raise InvalidArgument(f"{where} must be {what}{' or None' if none else ''}, got {short_repr(value)}")
    if value > MAX_SECONDS:
        raise InvalidArgument(f"{where} must be at most {MAX_SECONDS_TEXT}, got {short_repr(value)}")


def check_size(value: Any, where: str) -> int:
    """``value`` if it is a whole number from 1 to MAX_SIZE; else InvalidArgument naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"{where} must be a whole number above 0, got {short_repr(value)}")
    if value > MAX_SIZE:
        raise InvalidArgument(f"{where} must be at most {MAX_SIZE:,}, got {short_repr(value)}")
    return value


def check_text(value: Any, where: str) -> str:
    """``value`` if it is a non-empty str that UTF-8 can carry (what Redis is sent); else
    InvalidArgument naming ``where``. A lone surrogate (``"\\ud800"``, what Python makes of bytes
    that aren't UTF-8 in a file name or argv) raised UnicodeEncodeError deep in redis-py."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{where} must be a non-empty string, got {short_repr(value)}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument(f"{where} must be text UTF-8 can encode (no lone surrogate), got "
                                  f"{short_repr(value)}") from None
    return value


def nesting(value: Any) -> int:
    """How many lists and dicts deep ``value`` nests (0 for a scalar, 1 for a flat list), walked
    level by level, without recursion."""
    depth, level = 0, [value]
    while True:
        containers = [item for item in level if isinstance(item, (list, dict))]
        if not containers:
            return depth
        depth += 1
        level = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]


def short_repr(value: Any) -> str:
    """``repr(value)``, cut at 60 characters (an int of 400 digits is named, not printed whole)."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def check_queue(value: Any, where: str) -> str:
    """``value`` if it names a queue: :func:`check_text`, and no whitespace (as COGWORKER["QUEUES"]
    says): a queue's lanes are named ``<its key> lane:...`` (broker/keys/families.py), which a
    queue named ``x lane:ring`` would have shared with queue ``x``."""
    check_text(value, where)
    if any(c.isspace() for c in value):
        raise InvalidArgument(f"{where} must be a queue name without spaces, got {short_repr(value)}")
    return value
