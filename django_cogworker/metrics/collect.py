"""What a scrape reads, through ``api`` (as the admin reads), in a few pipelined round trips.

Bounded with many queues: every queue's size is read (one pipeline per 10,000 names, as the
dashboard does), but per-queue series are kept for the QUEUE_LIMIT largest only: 100,000
tenant queues would be 200,000 series a scrape, more than a Prometheus server should be asked
to keep; ``cogworker_queues`` and ``cogworker_enqueued`` still count them all. Job classes
likewise (``api.stats.CLASS_LIMIT``). A feature's families are read by its folder's
``metrics.py`` (features/batches/, features/limits/, features/fairness/), each bounded there, and listed in FEATURES.
"""

from __future__ import annotations

import time

from .. import api
from ..api._base import _defaults
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..features.batches import metrics as batch_metrics
from ..features.fairness import metrics as fairness_metrics
from ..features.history import metrics as history_metrics
from ..features.limits import metrics as limit_metrics
from .exposition import Family

QUEUE_LIMIT = 500  # queues with series of their own, the largest first

# The features whose families follow the core's, each read by its folder's ``families(redis, keys)``
# (looked up at each scrape: a feature's metrics module imports metrics/exposition.py, so it may be
# the one still being imported as this module is). The fairness feature's is handed the Stats the
# scrape read: its lanes, read once (four reads of a queue of 100,000 groups took 13.4 s).
FEATURES = (batch_metrics, limit_metrics)


def collect(*, redis: RedisClient | None = None, keys: Keys | None = None, now: float | None = None,
            queue_limit: int | None = None) -> list[Family]:
    now = time.time() if now is None else now
    queue_limit = QUEUE_LIMIT if queue_limit is None else queue_limit  # (read now: a test patches it)
    # Per class first, the totals after: a heartbeat's flush writes the totals before the
    # per-class hashes (one pipeline, in that order), so one landing between the two reads can
    # only make the totals newer. Read the other way round, a scrape could show a class's runs
    # that the total doesn't count yet (CI caught cogworker_processed_total 0 beside 4 runs).
    classes = _classes(redis, keys)
    stats = api.Stats(redis=redis, keys=keys, now=now, days=1, busiest=fairness_metrics.GROUP_LIMIT)
    redis, keys = stats.redis, stats.keys
    families = [
        Family("cogworker_processed_total", "counter", "Jobs run (failed ones included), since the counters began.")
        .add(stats.processed),
        Family("cogworker_failed_total", "counter", "Job runs that failed, since the counters began.")
        .add(stats.failed),
        Family("cogworker_busy", "gauge", "Jobs running now, over every live process.").add(stats.busy),
        Family("cogworker_concurrency", "gauge", "Processor threads, over every live process.")
        .add(stats.concurrency),
        Family("cogworker_processes", "gauge", "Live worker processes (their heartbeat hash hasn't expired).")
        .add(stats.process_count),
        Family("cogworker_scheduled_size", "gauge", "Jobs in the scheduled set.").add(stats.scheduled_size),
        Family("cogworker_retry_size", "gauge", "Jobs waiting for a retry.").add(stats.retry_size),
        Family("cogworker_dead_size", "gauge", "Jobs in the dead set.").add(stats.dead_size),
        Family("cogworker_queues", "gauge", "Queues known (pushed to, or paused).").add(stats.queue_count),
        Family("cogworker_enqueued", "gauge", "Jobs waiting, over every queue.").add(stats.enqueued),
        Family("cogworker_cancelled_total", "counter", "Jobs cancelled (taken off where they waited, or stopped "
                                                       "while running), since the counters began.")
        .add(stats.cancelled),
        Family("cogworker_expired_total", "counter", "Jobs dropped unrun at fetch, past their expiry, since the "
                                                     "counters began.").add(stats.expired),
        _replaced(stats.replaced),
    ]
    families += _queues(stats, redis, keys, now, queue_limit)
    families += _periodic(redis, keys)
    for feature in FEATURES:
        families += feature.families(redis, keys)
    families += fairness_metrics.families(stats)
    families += _outbox(now)
    families += classes
    return families


def _replaced(replaced: dict[str, int]) -> Family:
    family = Family("cogworker_replaced_total", "counter",
                    "Worker processes that exited to be replaced, by reason: memory (MAX_MEMORY_MB), jobs "
                    "(MAX_JOBS_PER_PROCESS), rolling (a rolling restart).")
    for reason in sorted({"memory", "jobs", "rolling", *replaced}):
        family.add(replaced.get(reason, 0), reason=reason)
    return family


def _queues(stats: api.Stats, redis: RedisClient, keys: Keys, now: float, limit: int) -> list[Family]:
    largest = sorted(stats.queue_sizes.items(), key=lambda pair: (-pair[1], pair[0]))[:limit]
    shown = {name for name, _ in largest}
    queues = [q for q in api.Queue.all(redis=redis, keys=keys) if q.name in shown]
    rows = api.QueueRow.read(queues, now=now, lanes=[stats.lanes[q.member] for q in queues])  # one pipeline
    size = Family("cogworker_queue_size", "gauge", "Jobs waiting in the queue.")
    latency = Family("cogworker_queue_latency_seconds", "gauge",
                     "Seconds the oldest waiting job of the queue has waited (0 when empty).")
    paused = Family("cogworker_queue_paused", "gauge", "1 when no process fetches from the queue.")
    for row in sorted(rows, key=lambda row: (-row.size, row.queue.name)):
        size.add(row.size, queue=row.queue.name)
        latency.add(round(row.latency, 3), queue=row.queue.name)
        paused.add(int(row.paused), queue=row.queue.name)
    return [size, latency, paused]


def _periodic(redis: RedisClient, keys: Keys) -> list[Family]:
    last = Family("cogworker_periodic_last_run_timestamp_seconds", "gauge",
                  "When the entry's last run was due (its last slot claimed), as Unix time.")
    enabled = Family("cogworker_periodic_enabled", "gauge", "1 when the periodic entry is enabled.")
    for entry in api.PeriodicEntry.all(redis=redis, keys=keys):
        if entry.last_slot is not None:
            last.add(entry.last_slot, entry=entry.pjid)
        enabled.add(int(entry.enabled), entry=entry.pjid)
    return [last, enabled]


def _outbox(now: float) -> list[Family]:
    """The outbox's rows waiting, per database, when OUTBOX is on (read from the databases)."""
    from ..push import runtime

    if not runtime.get_config().outbox:
        return []
    from ..outbox.metrics import families

    return families(now)


def _classes(redis: RedisClient | None, keys: Keys | None) -> list[Family]:
    processed = Family("cogworker_job_processed_total", "counter", "Runs of the job class (failed ones included).")
    failed = Family("cogworker_job_failed_total", "counter", "Failed runs of the job class.")
    rows = api.JobClassStats.all(redis=redis, keys=keys)
    for row in rows:
        label = {"class": row.job_class}  # (a keyword in Python, the usual label name in job exporters)
        processed.add(row.processed, **label)
        failed.add(row.failed, **label)
    # (the run-time histogram, from the metrics history's buckets: features/history/metrics.py)
    redis, keys = _defaults(redis, keys)
    return [processed, failed, history_metrics.duration_family(rows, redis, keys)]
