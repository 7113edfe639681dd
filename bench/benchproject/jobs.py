"""The bench's jobs, the same work as every peer's (bench/peers/, bench/sidekiq/):

* ``NoopIncr(t)``: one INCR of the completion counter (the drain job);
* ``Stamp(t)``: records ``now - t`` (t: push time, or due time for a scheduled job) on the latency
  list and INCRs the counter, in one pipelined round trip.
"""

import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis

COUNTER = "bench:done"
LATENCIES = "bench:lat"


class NoopIncr(Job):
    name = "bench.NoopIncr"

    def perform(self, t=0.0):
        get_redis().incr(COUNTER)


class Stamp(Job):
    name = "bench.Stamp"

    def perform(self, t=0.0):
        late = time.time() - t
        pipe = get_redis().pipeline(transaction=False)
        pipe.rpush(LATENCIES, late)
        pipe.incr(COUNTER)
        pipe.execute()
