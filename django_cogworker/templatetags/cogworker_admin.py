"""Template filters of the Cogworker admin pages: times, durations, sizes and JSON.

Each returns plain text, escaped by the template like any other value: nothing
from a payload is ever marked safe. Each reads garbage leniently (a time of
1e999, JSON nested deeper than the encoder goes: blank or the value's repr),
and the JSON ones show at most SHOWN_CHARS characters (the stored JSON of a
10 MB entry made a 21 MB page).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

from django import template

from ..features.encryption.codec import Encrypted

register = template.Library()
SHOWN_CHARS = 65_536


@register.filter
def cap(text: Any, limit: int = SHOWN_CHARS) -> str:
    """At most ``limit`` characters of ``text``, saying how many more there are."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit:,} more characters)"


@register.filter
def epoch(value: Any) -> dt.datetime | None:
    """Epoch seconds -> an aware datetime (for ``|date``), or None."""
    try:
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


@register.filter
def duration(seconds: Any) -> str:
    """Seconds -> "3d 4h", "2h 5m", "4m 10s", "12.3s"."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(s):
        return ""
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    for size, unit, sub_size, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= size:
            return f"{int(s // size)}{unit} {int(s % size // sub_size)}{sub_unit}"
    return ""


@register.filter
def relative(value: Any) -> str:
    """Epoch seconds -> "5m 2s ago" or "in 3h 1m"."""
    try:
        delta = float(value) - time.time()
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(delta):
        return ""
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


@register.filter
def number(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError, OverflowError):
        return "" if value is None else str(value)


@register.filter
def kilobytes(value: Any) -> str:
    try:
        kb = float(value)
    except (TypeError, ValueError):
        return ""
    return f"{kb / 1024:.0f} MB" if kb >= 1024 else f"{kb:.0f} KB"


@register.filter
def as_json(value: Any) -> str:
    """Pretty JSON, for args, kwargs and unknown fields (escaped by the template)."""
    if isinstance(value, Encrypted):  # ("(encrypted)", not a JSON string in quotes)
        return str(value)
    try:
        return cap(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))
    except (TypeError, ValueError, RecursionError):
        return _repr(value)


@register.filter
def compact_json(value: Any) -> str:
    if isinstance(value, Encrypted):
        return str(value)
    try:
        return cap(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))
    except (TypeError, ValueError, RecursionError):
        return _repr(value)


def _repr(value: Any) -> str:
    try:
        return cap(repr(value))
    except RecursionError:
        return "(nested deeper than can be shown)"


@register.filter
def time_of(record: Any, name: str) -> float | None:
    """A record's timestamp field (``record.time(name)``), as epoch seconds."""
    return record.time(name) if hasattr(record, "time") else None
