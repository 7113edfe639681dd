"""huey: two tasks on a RedisHuey; the worker is `huey_consumer peers.huey_jobs.huey -k thread -w 8`."""

import os

from huey import RedisHuey

from . import common

huey = RedisHuey("bench", url=os.environ["BENCH_REDIS_URL"])


@huey.task()
def noop(t=0.0):
    common.noop(t)


@huey.task()
def stamp(t=0.0):
    common.stamp(t)
