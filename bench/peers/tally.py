"""Completion counting for the async-jobs section, the same in every worker (cogworker's and arq's,
SAQ's, taskiq's): a job ends with ``done()``, one increment of an in-process count, and a daemon
thread adds the count to ``bench:done`` (INCRBY) every ``FLUSH_S``.

Why not an INCR per job as the other drains do: an awaiting job would need an async Redis client,
and one is bound to its event loop: cogworker's thread-per-job path runs each ``async def perform``
on an event loop of its own (asgiref's ``async_to_sync``), so a client per job there, and a sync INCR
would block the others' loops. Counting here costs every system the same: nothing a job waits on,
one more thread in each process (the section's thread counts include it), 500 INCRBYs a second.
Only redis-py and the standard library: the peers' venvs import it too.
"""

import os
import threading
import time

import redis

COUNTER = "bench:done"
FLUSH_S = 0.002

_count = 0
_lock = threading.Lock()
_started = False


def done():
    """One job finished (called from any thread or event loop: a lock held for an addition)."""
    global _count
    with _lock:
        _count += 1
    if not _started:
        _start()


def _start():
    global _started
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_flush_forever, name="bench-tally", daemon=True).start()


def _flush_forever():
    global _count
    client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    while True:
        time.sleep(FLUSH_S)
        with _lock:
            n, _count = _count, 0
        if n:
            client.incrby(COUNTER, n)
