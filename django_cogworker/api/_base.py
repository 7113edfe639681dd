"""What several parts of the object model share: the scan hint and page size, the refusal error,
and the small readers (defaults from the runtime, lenient text and number, glob escaping, page clamping),
``reencode``, which writes a payload back or says why it can't, and ``_walk``, a bounded SCAN.

SCAN_COUNT is read as ``_base.SCAN_COUNT`` by the modules that scan (``sorted_sets``, ``quarantine``),
so a test that patches it here changes every scan, as one constant should.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

from ..broker.keys import Keys, for_config, glob_escape
from ..broker.types import RedisClient
from ..errors import CogworkerError
from ..push import payload as payloads

SCAN_COUNT = 1_000  # the COUNT hint of each ZSCAN / SCAN call
# Rows a page shows at most: 500 rows of big entries let any view-only user make the web process
# read and render hundreds of megabytes with one request.
MAX_PER_PAGE = 100
MAX_PAGE = 2**40  # its first rank, times MAX_PER_PAGE, fits the 64-bit integer Redis reads


class ActionRefused(CogworkerError):
    """An action that can't be done on this object (an entry that names no queue, a key that exists)."""


class Poison(ActionRefused):
    """A payload Python reads but can't write back: 1e309 (read as infinity), nesting deeper than
    the encoder goes, a queue name Redis can't be sent (a lone surrogate). ``reason`` says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def reencode(payload: dict[str, Any]) -> str:
    """The payload's JSON, ready to store; raise :class:`Poison` if it can't be written back.

    Retry all encoded every entry of a batch before sending it, so one such entry raised out
    of the request (a 500) and none of the good ones moved.
    """
    try:
        text = payloads.encode(payload)
        queue = payload.get("queue")
        if isinstance(queue, str):
            queue.encode("utf-8")  # the key it goes to: a lone surrogate fails only in the Redis client
    except (ValueError, TypeError, RecursionError) as exc:  # (UnicodeEncodeError is a ValueError)
        raise Poison(f"can't be written back ({type(exc).__name__}: {exc})") from exc
    return text


def _defaults(redis: RedisClient | None, keys: Keys | None) -> tuple[RedisClient, Keys]:
    if redis is None or keys is None:
        from ..push import runtime

        # The shared client, not a processor thread's own connection: the objects built here keep
        # it, and one kept past its job (a module-level DeadSet(), say) would have other threads
        # send over that thread's connection, in the middle of its commands.
        redis = redis if redis is not None else runtime.get_shared_redis()
        keys = keys if keys is not None else for_config(runtime.get_config())
    return redis, keys


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _printable(text: Any) -> str:
    """``text`` with what UTF-8 can't carry (a lone surrogate) written as a backslash escape."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _number(value: Any) -> float | None:
    """A finite number read from ``value`` (a stored field); None otherwise."""
    number = _score(value)
    return number if number is not None and math.isfinite(number) else None


def _score(value: Any) -> float | None:
    """A sorted-set score as Redis allows it: any float but NaN (so ±inf too); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, bytes)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


_glob_escape = glob_escape


def _clamp_page(page: int, per_page: int) -> tuple[int, int]:
    """A page number from 1 to MAX_PAGE and a page size from 1 to MAX_PER_PAGE. (A page past the
    end is empty; one past MAX_PAGE, ``?page=99999999999999999999``, was a rank Redis can't read.)"""
    return min(max(int(page), 1), MAX_PAGE), min(max(int(per_page), 1), MAX_PER_PAGE)


class _Budget:
    """SCAN calls (of about SCAN_COUNT members each) left; ``complete`` while every walk reached its end."""

    def __init__(self, members: int):
        self.calls, self.complete = max(members // SCAN_COUNT, 1), True


def _walk(redis: RedisClient, key: str, budget: _Budget, *, hash_: bool = False,
          match: str | None = None) -> Iterator[list[Any]]:
    """The members (or a hash's (field, value) pairs) of ``key``, a SCAN call's worth at a time,
    while ``budget`` lasts. (SCAN may return a member twice: callers keep them by name.)"""
    cursor, scan = 0, redis.hscan if hash_ else redis.sscan
    while True:
        if budget.calls <= 0:
            budget.complete = False
            return
        budget.calls -= 1
        cursor, found = scan(key, cursor, match=match, count=SCAN_COUNT)
        yield list(cast(dict, found).items()) if hash_ else list(found)
        if int(cursor) == 0:
            return
