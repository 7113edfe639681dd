"""Jobs removed without running (a delete, a clear), told to the features that hold something for
them (declarations.py ``removed``: a keep_last_if_active job's state, which would drop equal pushes
until it expired, a week for a job deleted from a week's retry).

A bulk removal (``SortedSet.delete_all``, ``Queue.clear``) reads only the entries carrying a field a
feature named (``Declaration.removed_fields``), removes each of them alone first, and tells the
features of those it removed: an entry the poller or a fetch took meanwhile is running, and is not
told (its run ends it). The rest go as before, in one command.
"""

from __future__ import annotations

from typing import Any, cast

from .. import declarations
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..push import payload as payloads

CHUNK = 1_000  # entries read a call: a clear of a long queue must not hold Redis up for long


def told(redis: RedisClient, keys: Keys, payload: dict[str, Any]) -> None:
    """Tell the features of one job removed without running (its entry gone already)."""
    if declarations.declared().removals:
        declarations.removed(redis, keys, payload)


def remove_held(redis: RedisClient, keys: Keys, key: Any, kind: str) -> int:
    """Remove from ``key`` (``kind`` "zset" or "list") each entry carrying a field a feature's
    ``removed`` hook asks for, one at a time, telling the features of each removed; return how many."""
    fields = declarations.declared().removed_fields
    if not fields:
        return 0
    needles = [f'"{name}":' for name in fields]
    found: list[Any] = []
    if kind == "zset":
        # (ZSCAN's MATCH filters in Redis: a big retry set isn't read over the wire to find a few)
        for needle in needles:
            pattern = "*" + needle + "*"
            found += [raw for raw, _score in redis.zscan_iter(key, match=pattern, count=CHUNK)]
    else:
        start = 0
        while chunk := cast(list[Any], redis.lrange(key, start, start + CHUNK - 1)):
            found += [raw for raw in chunk if any(n in _text(raw) for n in needles)]
            start += len(chunk)
    removed = 0
    for raw in dict.fromkeys(found):  # (one raw matching two fields: once)
        gone = redis.zrem(key, raw) if kind == "zset" else redis.lrem(key, 1, raw)
        if not gone:
            continue
        removed += 1
        try:
            payload = payloads.decode(raw)
        except payloads.PayloadError:
            continue
        if isinstance(payload, dict):
            told(redis, keys, payload)
    return removed


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
