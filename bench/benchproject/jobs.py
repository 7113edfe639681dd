"""The bench's jobs, the same work as every peer's (bench/peers/, bench/sidekiq/):

* ``NoopIncr(t)``: one INCR of the completion counter (the drain job);
* ``Stamp(t)``: records ``now - t`` (t: push time, or due time for a scheduled job) on the latency
  list and INCRs the counter, in one pipelined round trip;
* ``IoWait(t)``: a job that mostly waits: GET ``bench:io``, sleep 1 ms, INCR the counter;
* ``CpuBurn(t)``: a job that mostly computes: ``CPU_BURN_LOOPS`` turns of a pure-Python loop (about
  200 µs of CPU here), then INCR the counter;
* ``AwaitShort(t)``, ``AwaitLong(t)``: the async-jobs section's (bench/sections/async_jobs.py): an
  ``async def perform`` that awaits ``asyncio.sleep`` 1 ms or 50 ms, then counts (peers/tally.py: as
  arq's, SAQ's and taskiq's jobs do, bench/peers/);
* ``BatchMember(n)``, ``BatchCallback``: the batches section's (bench/sections/batches.py): a member INCRs the
  counter like ``NoopIncr``, and the one that brings it to ``n`` stamps its end; the callback stamps
  its start and counts its runs;
* ``LimitedBucket(t)``, ``LimitedConcurrent(t)``: the limits section's (bench/sections/limits.py): ``NoopIncr``
  with a ``bucket`` or a ``concurrent`` limit too large ever to refuse, so a drain measures what a
  take (and, for a concurrency limit, its release) costs a job;
* ``GroupedNoop(t, g)``: the fairness section's (bench/sections/fairness.py): ``NoopIncr`` in group ``g``
  of its queue (``group = "arg:1"``), so that a drain of many groups measures what their turns cost.

``CPU_BURN_LOOPS`` is calibrated at import, unless ``BENCH_CPU_BURN_LOOPS_PYTHON`` gives it: the
bench passes its own calibration to the workers, so that every drain burns the same loops and the
figure stated beside them (``CPU_BURN_US``, measured here) is theirs.
"""

import asyncio
import os
import time

from peers import tally

from django_cogworker import Job, Limiter
from django_cogworker.push.runtime import get_redis

COUNTER = "bench:done"
LATENCIES = "bench:lat"
IO_KEY = "bench:io"
LAST_END = "bench:batch:last_end"
CALLBACK_START = "bench:batch:callback_start"
CALLBACK_RUNS = "bench:batch:callback_runs"
IO_SLEEP_S = 0.001
CPU_BURN_TARGET_US = 200
# The async-jobs section's awaits, by job class (the peers' pushes take the seconds from here too).
AWAIT_S = {"AwaitShort": 0.001, "AwaitLong": 0.05}
# The limits section's: never refuse (a billion starts a second; more places than the drain's 20
# processor threads), so every job pays one take and no reschedule. The lease is the default's.
BUCKET_LIMIT = Limiter.bucket("bench:bucket", 10**9, per=1)
CONCURRENT_LIMIT = Limiter.concurrent("bench:concurrent", 1000, lease=60)


def burn(loops):
    x = 0
    for i in range(loops):
        x += i
    return x


def _cpu_us(loops):
    # This thread's CPU time: a preemption by another process does not count.
    t = time.thread_time_ns()
    burn(loops)
    return (time.thread_time_ns() - t) / 1000


def calibrate(target_us=CPU_BURN_TARGET_US):
    """(loops of ``burn`` that take ``target_us`` of CPU here, µs they took): the fastest of a few
    timings, the others being the ones a timer tick or a cache miss got into."""
    probe = 20_000
    per_loop_us = min(_cpu_us(probe) for _ in range(5)) / probe
    loops = max(1, round(target_us / per_loop_us))
    return loops, min(_cpu_us(loops) for _ in range(20))


if os.environ.get("BENCH_CPU_BURN_LOOPS_PYTHON"):
    CPU_BURN_LOOPS, CPU_BURN_US = int(os.environ["BENCH_CPU_BURN_LOOPS_PYTHON"]), None
else:
    CPU_BURN_LOOPS, CPU_BURN_US = calibrate()


class NoopIncr(Job):
    name = "bench.NoopIncr"

    def perform(self, t=0.0):
        get_redis().incr(COUNTER)


class DebouncedNoop(NoopIncr):
    """NoopIncr pushed with ``debounce`` (the enqueue section's collapse rows: what a push costs)."""

    name = "bench.DebouncedNoop"
    debounce = 60


class ThrottledNoop(NoopIncr):
    """NoopIncr pushed with ``throttle`` (the enqueue section's collapse rows)."""

    name = "bench.ThrottledNoop"
    throttle = 60


class GroupedNoop(NoopIncr):
    """NoopIncr in the group its second argument names (the fairness section's grouped drain)."""

    name = "bench.GroupedNoop"
    group = "arg:1"

    def perform(self, t=0.0, g=None):
        get_redis().incr(COUNTER)


class Stamp(Job):
    name = "bench.Stamp"

    def perform(self, t=0.0):
        late = time.time() - t
        pipe = get_redis().pipeline(transaction=False)
        pipe.rpush(LATENCIES, late)
        pipe.incr(COUNTER)
        pipe.execute()


class IoWait(Job):
    name = "bench.IoWait"

    def perform(self, t=0.0):
        redis = get_redis()
        redis.get(IO_KEY)
        time.sleep(IO_SLEEP_S)
        redis.incr(COUNTER)


class CpuBurn(Job):
    name = "bench.CpuBurn"

    def perform(self, t=0.0):
        burn(CPU_BURN_LOOPS)
        get_redis().incr(COUNTER)


class AwaitShort(Job):
    name = "bench.AwaitShort"

    async def perform(self, t=0.0):
        await asyncio.sleep(AWAIT_S["AwaitShort"])
        tally.done()


class AwaitLong(Job):
    name = "bench.AwaitLong"

    async def perform(self, t=0.0):
        await asyncio.sleep(AWAIT_S["AwaitLong"])
        tally.done()


class BatchMember(Job):
    name = "bench.BatchMember"

    def perform(self, n=0):
        # The job that brings the counter to n is the last to end (its INCR is its last act): it alone
        # pays one more command, the same in a batch or not.
        if get_redis().incr(COUNTER) >= n:
            get_redis().set(LAST_END, repr(time.time()))


class BatchCallback(Job):
    name = "bench.BatchCallback"

    def perform(self, status=None, **options):
        # (A batch callback gets the batch's status; a chord's body, its own arguments: none here.)
        started = time.time()
        pipe = get_redis().pipeline(transaction=False)
        pipe.set(CALLBACK_START, repr(started), nx=True)
        pipe.incr(CALLBACK_RUNS)
        pipe.execute()


class LimitedBucket(Job):
    name = "bench.LimitedBucket"
    limits = [BUCKET_LIMIT]

    def perform(self, t=0.0):
        get_redis().incr(COUNTER)


class LimitedConcurrent(Job):
    name = "bench.LimitedConcurrent"
    limits = [CONCURRENT_LIMIT]

    def perform(self, t=0.0):
        get_redis().incr(COUNTER)
