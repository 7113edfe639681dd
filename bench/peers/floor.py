"""The floor: a bare redis-py loop doing per job the Redis work a reliable worker cannot avoid.

Per batch of up to BATCH jobs: one pipeline of LMOVEs (queue -> in-progress), then one pipeline of,
per job, the job's own work (INCR; or RPUSH + INCR for a stamp) and the ack (LREM). Blocks on
BLMOVE when the queue is empty. One process, one thread, no framework: what is left when everything
a job system adds (middleware, bookkeeping, threads, heartbeats) is taken away.

    BENCH_REDIS_URL=redis://... python -m peers.floor
"""

import json
import os
import signal
import sys
import time

import redis

QUEUE = "floor:queue"
IN_PROGRESS = "floor:in_progress"
COUNTER = "bench:done"
LATENCIES = "bench:lat"
BATCH = 10


def main() -> int:
    r = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        pipe = r.pipeline(transaction=False)
        for _ in range(BATCH):
            pipe.lmove(QUEUE, IN_PROGRESS, "RIGHT", "LEFT")
        raws = [raw for raw in pipe.execute() if raw is not None]
        if not raws:
            raw = r.blmove(QUEUE, IN_PROGRESS, 2, "RIGHT", "LEFT")
            if raw is None:
                continue
            raws = [raw]
        pipe = r.pipeline(transaction=False)
        for raw in raws:
            job = json.loads(raw)
            if job["class"] == "stamp":
                pipe.rpush(LATENCIES, time.time() - job["args"][0])
            pipe.incr(COUNTER)
            pipe.lrem(IN_PROGRESS, 1, raw)
        pipe.execute()
    return 0


if __name__ == "__main__":
    sys.exit(main())
