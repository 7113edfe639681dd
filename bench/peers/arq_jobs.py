"""arq: one coroutine function, ``wait(ctx, seconds)``: ``await asyncio.sleep(seconds)``, then the
count (peers/tally.py). The worker is arq's own CLI, ``arq peers.arq_jobs.WorkerSettings``
(``max_jobs = 100``), its logging at WARNING through arq's ``--custom-log-dict`` (``LOG_WARNING``,
arq's default config at that level: at INFO it prints two lines a job, which the other peers'
workers, run at WARNING, do not)."""

import asyncio
import os

from arq.connections import RedisSettings
from arq.logs import default_log_config

from . import tally

LOG_WARNING = default_log_config(verbose=False)
LOG_WARNING["handlers"]["arq.standard"]["level"] = "WARNING"
LOG_WARNING["loggers"]["arq"]["level"] = "WARNING"


async def wait(ctx, seconds=0.001):
    await asyncio.sleep(seconds)
    tally.done()


class WorkerSettings:
    functions = [wait]
    redis_settings = RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"])
    max_jobs = 100


async def push(n, seconds):
    from arq import create_pool

    pool = await create_pool(WorkerSettings.redis_settings)
    for start in range(0, n, 500):
        await asyncio.gather(*(pool.enqueue_job("wait", seconds) for _ in range(min(500, n - start))))
    await pool.aclose()
