"""taskiq: one task, ``wait(seconds)``: ``await asyncio.sleep(seconds)``, then the count
(peers/tally.py), on taskiq-redis's ``RedisStreamBroker`` (the broker its README shows: acknowledged,
so a killed worker's messages are not lost), no result backend. The worker is taskiq's own CLI,
``taskiq worker peers.taskiq_jobs:broker --workers 1 --max-async-tasks 100 --log-level WARNING``."""

import asyncio
import os

from taskiq_redis import RedisStreamBroker

from . import tally

broker = RedisStreamBroker(url=os.environ["BENCH_REDIS_URL"])


@broker.task(task_name="bench.wait")
async def wait(seconds=0.001):
    await asyncio.sleep(seconds)
    tally.done()


async def push(n, seconds):
    await broker.startup()
    for start in range(0, n, 500):
        await asyncio.gather(*(wait.kiq(seconds) for _ in range(min(500, n - start))))
    await broker.shutdown()
