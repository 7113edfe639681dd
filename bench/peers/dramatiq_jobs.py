"""dramatiq: two actors on a RedisBroker; the worker is `dramatiq peers.dramatiq_jobs -p 1 -t 8`."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import common

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="default")
def noop(t=0.0):
    common.noop(t)


@dramatiq.actor(queue_name="default")
def stamp(t=0.0):
    common.stamp(t)
