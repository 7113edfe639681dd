"""Async jobs (``async def perform``): run on the worker's event loop (docs/jobs.md, "Async jobs").
Used by the async worker tests (tests/workers/test_async_workers.py) and the bench."""

from __future__ import annotations

import asyncio
import threading
import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis


class AsyncSleepJob(Job):
    """Await ``seconds``, then record its jid and the thread it ran on under ``key``."""

    async def perform(self, seconds: float, key: str) -> None:
        await asyncio.sleep(seconds)
        get_redis().rpush(key, f"{self.jid} {threading.current_thread().name}")


class AsyncWaitJob(Job):
    """Record its start in ``key:started``, await up to ``seconds``, then record ``key:finished``;
    cancelled (a timeout, an interrupt, a shutdown), it records ``key:cancelled`` and goes on."""

    timeout = None

    async def perform(self, key: str, seconds: float = 60.0) -> None:
        redis = get_redis()
        redis.rpush(f"{key}:started", self.jid or "")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            redis.rpush(f"{key}:cancelled", self.jid or "")
            raise
        redis.rpush(f"{key}:finished", self.jid or "")


class AsyncTimedJob(AsyncWaitJob):
    """An AsyncWaitJob with a 1 s timeout."""

    timeout = 1


class AsyncBlockingJob(Job):
    """Blocks the event loop: ``time.sleep`` in async code (what the loop's lag watch reports)."""

    async def perform(self, seconds: float, key: str) -> None:
        time.sleep(seconds)
        get_redis().rpush(key, self.jid or "")
