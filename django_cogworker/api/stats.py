"""Stats: ``Stats``, a snapshot of the counters, the sets' sizes, the queues, the processes and Redis,
with ``Day``, one day of the history; ``JobClassStats``, the runs, failures and seconds of each job class."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import redis as redis_lib
from redis.crc import key_slot

from ..broker.cluster import home_node, is_cluster
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..engine.settle.stats import day_of
from . import lanes
from ._base import _defaults, _number
from .processes import ProcessSet
from .queues import Queue, QueueRow

SHOWN_QUEUES = 25  # the dashboard lists the largest queues; the queues page has them all, paged
SIZE_BATCH = 10_000  # LLENs per pipeline
CLASS_LIMIT = 1_000  # job classes ``JobClassStats.all`` returns at most (the busiest)


@dataclasses.dataclass
class Day:
    day: str
    processed: int
    failed: int


@dataclasses.dataclass
class JobClassStats:
    """What the workers counted of one job class since its counters began (``stat:class:*``)."""

    job_class: str
    processed: int  # runs, the failed ones included
    failed: int
    seconds: float  # the time its runs took, summed

    @classmethod
    def all(cls, *, redis: RedisClient | None = None, keys: Keys | None = None,
            limit: int = CLASS_LIMIT) -> list[JobClassStats]:
        """The ``limit`` classes with the most runs, most first, read in one round trip. A hash of
        the wrong type reads as empty (the key guard moves it aside)."""
        redis, keys = _defaults(redis, keys)
        pipe = redis.pipeline(transaction=False)
        for key in (keys.stat_class_processed, keys.stat_class_failed, keys.stat_class_seconds):
            pipe.hgetall(key)
        processed, failed, seconds = (r if isinstance(r, dict) else {} for r in pipe.execute(raise_on_error=False))
        rows = [cls(name.decode("utf-8", "backslashreplace"), int(_number(count) or 0),
                    int(_number(failed.get(name)) or 0), _number(seconds.get(name)) or 0.0)
                for name, count in processed.items()]
        rows.sort(key=lambda row: (-row.processed, row.job_class))
        return rows[:limit]


class Stats:
    """A snapshot of the counters, the sets' sizes, the queues and Redis itself, read at construction.

    ``queue_sizes`` and ``enqueued`` cover every queue; ``queues``, ``queue_rows`` and
    ``queue_latencies`` the SHOWN_QUEUES largest; ``queue_count`` says how many there are.
    ``lanes``: each queue's lanes (by its name as stored), read once for all of these, with its
    ``busiest`` busiest groups (a scrape asks for them: features/fairness/metrics.py).
    """

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None, now: float | None = None,
                 days: int = 30, busiest: int = 0):
        self.redis, self.keys = _defaults(redis, keys)
        self.busiest = busiest
        now = time.time() if now is None else now
        k = self.keys
        self.days = [day_of(now - 86400 * back) for back in range(days - 1, -1, -1)]
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(k.stat_processed)
        pipe.get(k.stat_failed)
        # (MGET as a raw command: redis-py's cluster pipeline refuses its mget method; the keys
        # share the home slot, so the command is whole on a cluster too)
        pipe.execute_command("MGET", *[k.stat("processed", d) for d in self.days])
        pipe.execute_command("MGET", *[k.stat("failed", d) for d in self.days])
        pipe.zcard(k.schedule)
        pipe.zcard(k.retry)
        pipe.zcard(k.dead)
        pipe.execute_command("MGET", k.stat("cancelled"), k.stat("expired"))
        pipe.hgetall(k.stat_replaced)
        (processed, failed, per_day_processed, per_day_failed, scheduled, retries, dead, outcomes,
         replaced) = pipe.execute()
        # Worker processes that exited to be replaced, by reason: "memory", "jobs" (their caps), "rolling".
        self.replaced = {(reason.decode() if isinstance(reason, bytes) else reason): int(_number(count) or 0)
                         for reason, count in replaced.items()}
        # Jobs cancelled (features/cancellation/cancel.py) and dropped unrun past their expiry, since the
        # counters began.
        self.cancelled, self.expired = (int(_number(count) or 0) for count in outcomes)
        self.processed = int(_number(processed) or 0)
        self.failed = int(_number(failed) or 0)
        self.history = [Day(d, int(_number(p) or 0), int(_number(f) or 0))
                        for d, p, f in zip(self.days, per_day_processed, per_day_failed, strict=True)]
        self.processed_today = self.history[-1].processed if self.history else 0
        self.failed_today = self.history[-1].failed if self.history else 0
        self.scheduled_size, self.retry_size, self.dead_size = int(scheduled), int(retries), int(dead)
        self._read_queues(now)
        processes = list(ProcessSet(redis=self.redis, keys=k))
        self.process_count = len(processes)
        self.busy = sum(p.busy for p in processes)
        self.concurrency = sum(int(p.concurrency or 0) for p in processes)
        self.redis_info = self._redis_info()

    def __repr__(self) -> str:
        return (f"<Stats processed={self.processed} failed={self.failed} enqueued={self.enqueued} "
                f"busy={self.busy} scheduled={self.scheduled_size} retries={self.retry_size} dead={self.dead_size}>")

    def _read_queues(self, now: float) -> None:
        """Every queue's size (pipelined: at 10,000 queue names, one round trip each took 3.3 s), and
        the rows of the SHOWN_QUEUES largest (``queues``, ``queue_rows``, ``queue_latencies``)."""
        members = Queue.members(redis=self.redis, keys=self.keys)
        sizes: list[Any] = []
        for i in range(0, len(members), SIZE_BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for member in members[i:i + SIZE_BATCH]:
                pipe.llen(Queue(member, redis=self.redis, keys=self.keys).key)
            sizes += pipe.execute(raise_on_error=False)
        counts = [size if isinstance(size, int) else 0 for size in sizes]  # (wrong type: the key guard's)
        # (Its groups' and priorities' jobs too: a grouped queue's own list is mostly empty.)
        # Read once: the rows below and a scrape's group series reuse it (read four times, a scrape of
        # one queue of 100,000 groups took 13.4 s).
        waiting = lanes.read(self.redis, [Queue(m, redis=self.redis, keys=self.keys).key for m in members],
                             self.busiest)
        self.lanes = dict(zip(members, waiting, strict=True))
        counts = [lane.size(count) for count, lane in zip(counts, waiting, strict=True)]
        self.queue_count = len(members)
        self.queue_sizes = {m.decode("utf-8", "backslashreplace"): n for m, n in zip(members, counts, strict=True)}
        self.enqueued = sum(counts)
        largest = sorted(zip(members, counts, strict=True), key=lambda pair: (-pair[1], pair[0]))[:SHOWN_QUEUES]
        self.queue_rows = QueueRow.read([Queue(m, redis=self.redis, keys=self.keys) for m, _ in largest], now=now,
                                        lanes=[self.lanes[m] for m, _ in largest])
        self.queues = [row.queue for row in self.queue_rows]
        self.queue_latencies = {row.queue.name: row.latency for row in self.queue_rows}

    def _redis_info(self) -> dict[str, Any]:
        """Version, memory and clients; empty where INFO isn't allowed (some managed services).

        On a cluster, of the home node: the primary serving the home slot, which holds every key
        but the queues' (spread over the shards: a sum over every node would describe other data).
        """
        node = None
        try:
            if is_cluster(self.redis):
                node = home_node(self.redis, self.keys.queues)
                info = self.redis.info(target_nodes=node)
            else:
                info = self.redis.info()
        except redis_lib.exceptions.ResponseError:
            return {}
        return {"version": info.get("redis_version"), "used_memory_human": info.get("used_memory_human"),
                "used_memory_peak_human": info.get("used_memory_peak_human"),
                "connected_clients": info.get("connected_clients"),
                "uptime_in_days": info.get("uptime_in_days"),
                "cluster_node": node.name if node is not None else None,
                "cluster_slot": key_slot(self.keys.queues.encode()) if node is not None else None}
