"""What every peer's job does, on a lazily made redis-py client (one per process; a forked child
makes its own, as redis-py's pool notices the pid change)."""

import os
import time

import redis

COUNTER = "bench:done"
LATENCIES = "bench:lat"

_client = None


def client():
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _client


def noop(t=0.0):
    client().incr(COUNTER)


def stamp(t=0.0):
    late = time.time() - t
    pipe = client().pipeline(transaction=False)
    pipe.rpush(LATENCIES, late)
    pipe.incr(COUNTER)
    pipe.execute()
