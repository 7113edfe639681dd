"""SAQ: one coroutine function, ``wait(ctx, *, seconds)``: ``await asyncio.sleep(seconds)``, then the
count (peers/tally.py). The worker is SAQ's own CLI, ``saq peers.saq_jobs.settings`` (one process,
``concurrency`` 100; its default logging, at ERROR)."""

import asyncio
import os

from saq import Queue

from . import tally

queue = Queue.from_url(os.environ["BENCH_REDIS_URL"])


async def wait(ctx, *, seconds=0.001):
    await asyncio.sleep(seconds)
    tally.done()


settings = {"queue": queue, "functions": [wait], "concurrency": 100}


async def push(n, seconds):
    await queue.connect()
    for start in range(0, n, 500):
        await asyncio.gather(*(queue.enqueue("wait", seconds=seconds) for _ in range(min(500, n - start))))
    await queue.disconnect()
