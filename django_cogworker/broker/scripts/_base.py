"""The script runner and the Lua and argument pieces several scripts share; the list of every script.

Every :class:`Script` made is listed in :data:`EVERY` as it is made (the core's here, a feature's in
its own folder's ``scripts.py``, django_cogworker/features/): what reads them all (a check of
every script, a preload) finds the features' scripts without broker/ importing any feature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis


class Script:
    """A Lua script registered once per client; EVALSHA with NOSCRIPT reload."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        EVERY.append(self)

    def __call__(self, client: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        try:
            # (What client.evalsha does, less its two wrapper calls: every push runs a script.)
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)

    def in_pipeline(self, pipe: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> None:
        """Queue on a pipeline, as EVAL: a NOSCRIPT reply in a pipeline can't be retried alone.

        (A raw EVAL: redis-py's cluster pipeline refuses its eval method; the command itself
        is routed by its KEYS, all in one slot: the home slot or one queue's.)
        """
        pipe.execute_command("EVAL", self.source, len(keys), *keys, *args)

    def in_pipeline_by_sha(self, pipe: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> None:
        """Queue on a pipeline as EVALSHA (the source isn't sent: a pipeline of many calls of one
        script, every fetch). For a caller that runs a call whose reply is an error again alone
        (``__call__``: a NOSCRIPT reply, after a Redis restart, loads it then)."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


# Every script made so far, in the order made (those of a feature once its scripts module is imported).
EVERY: list[Script] = []

def _add_remove_trim(remove: str, below: int, cap: int) -> str:
    """Lua: the tail four scripts share (filing a job in a sorted set).

    Adds ARGV[3] to the sorted set KEYS[2] at score ARGV[2]; removes ARGV[1]
    from KEYS[1] (``remove``: "ZREM" from a sorted set, "LREM" from a list);
    then trims KEYS[2] as :func:`_trim` says. Add first, remove second: the
    rule in the package's docstring.
    """
    drop = {"ZREM": 'redis.call("ZREM", KEYS[1], ARGV[1])', "LREM": 'redis.call("LREM", KEYS[1], 1, ARGV[1])'}
    return f"""redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
{drop[remove]}
""" + _trim("KEYS[2]", below, cap)


def _trim(key: str, below: int, cap: int) -> str:
    """Lua: trims the sorted set ``key`` of the entries scored below ARGV[``below``] and of all but
    the ARGV[``cap``] highest scored ("" in either skips that trim): dead's age and size caps."""
    return f"""if ARGV[{below}] ~= "" then
  redis.call("ZREMRANGEBYSCORE", {key}, "-inf", "(" .. ARGV[{below}])
end
if ARGV[{cap}] ~= "" then
  redis.call("ZREMRANGEBYRANK", {key}, 0, -tonumber(ARGV[{cap}]) - 1)
end
"""


def _queue_index(keys: list[Any], index: dict[Any, int], queue_key: str | bytes) -> int:
    """The position of ``queue_key`` in KEYS as Lua counts (from 1), appended on first sight."""
    if queue_key not in index:
        keys.append(queue_key)
        index[queue_key] = len(keys)
    return index[queue_key]

