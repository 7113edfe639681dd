"""``limiter.within(wait)``: a place held for a block of code, ``with`` or ``async with``.

The two differ only in how they wait between tries (``time.sleep`` or ``await asyncio.sleep``:
an async job on the worker's event loop must not hold the loop while it waits for a place). Each
try and the release are one short script on Redis, made in place (on the loop's thread, its own
connection: no other task runs between a command and its reply).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ...broker.keys import Keys, for_config
from ...broker.quarantine import run_script
from ...errors import OverLimit
from . import scripts as limit_scripts
from .held import HELD, SEEN, _current_jid, _text, holder_token, wake

WAIT_SLICE = (0.01, 0.25)  # first and longest pause between tries at a concurrency limit

logger = logging.getLogger(__name__)


class Within:
    """Made by :meth:`Limiter.within` (its arguments checked there); entered once."""

    def __init__(self, limiter: Any, wait: float, redis: Any, keys: Keys | None):
        self.limiter = limiter
        self.wait = wait
        self.redis = redis
        self.keys = keys
        self._hold: Any = None
        self._token = ""

    def __enter__(self) -> None:
        for nap in self._tries():
            time.sleep(nap)

    async def __aenter__(self) -> None:
        for nap in self._tries():
            await asyncio.sleep(nap)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._release()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._release()

    def _tries(self) -> Iterator[float]:
        """Try for a place; yield how long to pause before the next try; OverLimit past ``wait``."""
        limiter = self.limiter
        if self.redis is None or self.keys is None:
            from ...push import runtime  # (the Django edge; in a worker, the processor thread's connection)

            self.redis = self.redis if self.redis is not None else runtime.get_redis()
            self.keys = self.keys if self.keys is not None else for_config(runtime.get_config())
        self._token = holder_token(_current_jid())
        lk = self.keys.limit(limiter.name)
        deadline = time.monotonic() + self.wait
        pause = WAIT_SLICE[0]
        while True:
            reply = run_script(limit_scripts.LIMIT_TAKE, self.redis, self.keys, list(lk),
                               [self._token, "", "", *limiter.argv()], lk.expected)
            if int(reply[0]) == 1:
                break
            after = _text(reply[2])
            left = deadline - time.monotonic()
            if left <= 0:
                raise OverLimit(limiter.name, limiter.kind, float(after) if after else None)
            # A rate limiter says when its next place frees. A concurrency limit's retry_after is
            # how long places are held lately (a rescheduled job's backoff): slept through, a place
            # freed at once was taken only at the deadline; it is polled instead (WAIT_SLICE).
            if after and limiter.kind != "concurrent":
                nap = float(after) + random.uniform(0, 0.01)
            else:
                nap, pause = pause * random.uniform(0.5, 1.5), min(pause * 2, WAIT_SLICE[1])
            yield min(nap, left)
        SEEN.add(limiter.name, limiter)
        if limiter.kind == "concurrent":
            self._hold = HELD.add(limiter.name, limiter.lease, self._token)

    def _release(self) -> None:
        keys = self.keys
        if self._hold is None or keys is None:
            return
        limiter, lk = self.limiter, keys.limit(self.limiter.name)
        HELD.remove(self._hold)
        self._hold = None
        try:
            reply = run_script(limit_scripts.LIMIT_RELEASE, self.redis, keys, list(lk),
                               [self._token, "release", *limiter.argv()], lk.expected)
            wake(self.redis, keys, reply[1:])
        except Exception as exc:  # (the block's work is done: failing it would have it done again)
            logger.warning("limiter %r: its place was not given back (%s: %s); it frees when its lease "
                           "lapses", limiter.name, type(exc).__name__, exc)
