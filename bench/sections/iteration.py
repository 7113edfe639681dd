"""Iterable jobs on PostgreSQL: what walking a QuerySet through an IterableJob costs an item, against
a plain loop over the same rows, and what its checkpoints cost (issue 45).

From one Python thread of the bench process, against the bench's Redis and a PostgreSQL database of
its own (``BENCH_POSTGRES_URL``'s server, default ``postgres://postgres@127.0.0.1:5432/postgres``: the
bench creates ``cogworker_bench_iter_<pid>`` there, fills one table of ``rows`` rows, drops it at the
end), each way walks every row once, doing the same thing with each (``consume``: adds a column):

* floor: a plain Python loop over the rows fetched in keyset batches (``pk > last ORDER BY pk
  LIMIT batch``, the batch the enumerator fetches), what the rows cost with no job around them;
* enumerator: an IterableJob (``benchproject/iteration_jobs.py``) whose ``build_enumerator`` returns
  the queryset enumerator over the rows, run once by a Processor called on this thread, built as a
  worker builds it (its fetch on the bench's Redis, the package's features), checkpoints off;
* checkpoint default: the same, checkpointed every ``ITERATION_CHECKPOINT`` (1 s);
* checkpoint every item: the same, a checkpoint (a Redis round trip) after every item.

Each way is timed ``reps`` times, in turn (floor, enumerator, ..., floor, ...), the median kept, with
Redis's round trips counted around each.

    python bench/run.py --sections iteration --no-venv
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import harness
from environment import log as _log
from markdown import Page, fmt, measured_where, source_of, table

NAME = "iteration"
QUICK = True
# (quick, default): rows walked; rounds of each way.
PARAMS = {"iteration_rows": (2_000, 100_000), "iteration_reps": (1, 5)}
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
ALIAS = "iter"  # (benchproject/settings.py: this process's own database)
# The floor's batch: the queryset enumerator's default (features/iteration/enumerators.py), checked in run.
FLOOR_BATCH = 100
WAYS = ("floor", "enumerator", "checkpoint_default", "checkpoint_every_item")


def run(bench: Any, p: dict[str, Any] | None = None, log: Any = _log) -> dict[str, Any]:
    """The section (``p``: the sizes, ``bench.p`` unless given)."""
    p = bench.p if p is None else p
    import psycopg
    from django.db import connections

    admin_url = os.environ.get("BENCH_POSTGRES_URL", DEFAULT_URL)
    database = connections[ALIAS].settings_dict["NAME"]
    rows = p["iteration_rows"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database}")
        conn.execute(f"CREATE DATABASE {database}")
    try:
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("CREATE TABLE bench_iter_item (id bigserial PRIMARY KEY, n integer NOT NULL, "
                           "note text NOT NULL)")
            cursor.execute("INSERT INTO bench_iter_item (n, note) SELECT i, 'row ' || i FROM "
                           "generate_series(1, %s) AS i", [rows])
            cursor.execute("VACUUM ANALYZE bench_iter_item")
        server = connections[ALIAS].cursor().connection.info.server_version
        from django_cogworker.features.iteration.enumerators import DEFAULT_BATCH

        assert DEFAULT_BATCH == FLOOR_BATCH, "the floor fetches the rows as the enumerator does"
        ways = _ways(bench)
        times: dict[str, list[float]] = {way: [] for way in ways}
        cpu: dict[str, list[float]] = {way: [] for way in ways}
        trips: dict[str, list[float]] = {way: [] for way in ways}
        for _rep in range(p["iteration_reps"]):
            for way, walk in ways.items():
                bench.reset_redis()
                a = harness.snap(bench.r)
                own = time.thread_time()
                seconds, walked = walk()
                cpu[way].append(time.thread_time() - own)
                b = harness.snap(bench.r)
                assert walked == rows, (way, walked, rows)
                times[way].append(seconds)
                trips[way].append(harness.delta(a, b).round_trips)
        out: dict[str, Any] = {"postgres": f"{server // 10000}.{server % 10000}", "rows": rows,
                               "reps": p["iteration_reps"], "batch": FLOOR_BATCH}
        for way in ways:
            us = statistics.median(times[way]) * 1e6 / rows
            out[way] = {"us_per_item": round(us, 3), "us_per_item_all": [round(t * 1e6 / rows, 3) for t in times[way]],
                        # (this thread's CPU: the bench's Python, not PostgreSQL's or Redis's)
                        "cpu_us_per_item": round(statistics.median(cpu[way]) * 1e6 / rows, 3),
                        "redis_round_trips_per_item": round(statistics.median(trips[way]) / rows, 4)}
            log(f"iteration {way}: {us:.2f} us/item ({out[way]['cpu_us_per_item']} us of its CPU), "
                f"{out[way]['redis_round_trips_per_item']} Redis round trips/item")
        return out
    finally:
        connections[ALIAS].close()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")


def _ways(bench: Any) -> dict[str, Callable[[], tuple[float, int]]]:
    """Each way: a call that walks every row once and returns (seconds, rows walked)."""
    from benchproject import iteration_jobs as jobs

    called = _Called(bench)
    return {"floor": _floor, "enumerator": lambda: called.walk(jobs.IterRowsUnsaved),
            "checkpoint_default": lambda: called.walk(jobs.IterRows),
            "checkpoint_every_item": lambda: called.walk(jobs.IterRowsEveryItem)}


class _Called:
    """A Processor built from its parts as a worker builds it (its fetch on the bench's Redis, the
    package's features, the retry policy), called on the bench's thread: no Manager, no fetcher
    thread. ``walk`` pushes one job, takes it as the fetcher would and processes it to its end."""

    def __init__(self, bench: Any):
        from django_cogworker.broker.keys import for_config
        from django_cogworker.engine.fetch.ledger import Ledger
        from django_cogworker.engine.fetch.registry import make_fetch
        from django_cogworker.engine.process.launcher import new_identity, run_job
        from django_cogworker.engine.run.factories import build_features, load_features, step_runners
        from django_cogworker.engine.run.hooks import Plans, WorkerParts
        from django_cogworker.engine.run.processor import Processor
        from django_cogworker.engine.settle.queue import SettlementQueue
        from django_cogworker.engine.settle.retry import RetryPolicy
        from django_cogworker.engine.settle.settling import Settler
        from django_cogworker.engine.settle.stats import Stats
        from django_cogworker.push import runtime

        config, redis = runtime.get_config(), runtime.get_redis()
        keys = for_config(config)
        self.keys, self.redis = keys, redis
        retry = RetryPolicy(config)
        self.fetch = make_fetch(config, redis, keys, new_identity())
        features = build_features(load_features(config), WorkerParts(config, redis, keys, "bench", retry))
        settler = Settler(self.fetch, retry, runners=step_runners(features))
        self.processor = Processor(0, ledger=Ledger(), settlements=SettlementQueue(settler), retry=retry,
                                   stats=Stats(keys), server_chain=run_job, plans=Plans(features))

    def walk(self, job: Any) -> tuple[float, int]:
        from benchproject.iteration_jobs import SINK

        from django_cogworker.features.iteration.state import ENDED_KEEP

        SINK[:] = [0, 0]
        jid = job.perform_async()
        units = self.fetch.retrieve(1)
        assert len(units) == 1, units
        t = time.perf_counter()
        run = self.processor.process(units[0])
        seconds = time.perf_counter() - t
        assert run is not None and run.error is None and run.payload["jid"] == jid, run
        # (Acked, and its saved state at its end, kept a while: features/iteration/state.py's ENDED_KEEP.)
        state = self.redis.hgetall(self.keys.iteration(jid))
        assert self.redis.llen(self.fetch.in_progress) == 0 and int(state[b"done"]) == SINK[1], (jid, state)
        assert 0 < self.redis.ttl(self.keys.iteration(jid)) <= ENDED_KEEP
        return seconds, SINK[1]


def _floor() -> tuple[float, int]:
    from benchproject.iteration_jobs import consume
    from benchproject.models import BenchItem

    sink, last = [0, 0], 0
    rows = BenchItem.objects.using(ALIAS).order_by("pk")
    t = time.perf_counter()
    while True:
        batch = list(rows.filter(pk__gt=last)[:FLOOR_BATCH])
        if not batch:
            break
        for item in batch:
            consume(item, sink)
        last = batch[-1].pk
    return time.perf_counter() - t, sink[1]


def report(res: dict[str, Any]) -> str:
    """Time per item of a QuerySet walked by an IterableJob, against a plain loop; the checkpoint's cost."""
    it = res.get("iteration")
    if not it or "floor" not in it:
        return ""
    page = Page()
    add = page.add
    add("## Iterable jobs: a QuerySet on PostgreSQL")
    add("")
    measured_where(add, res, "iteration")
    meta = res["meta"]
    load = (source_of(res, "iteration") or {}).get("load") or [meta.get("loadavg_start"), meta.get("loadavg_end")]
    add(f"{it['rows']:,} rows of one table (`id bigserial PRIMARY KEY, n integer, note text`) in PostgreSQL "
        f"{it['postgres']} on the same machine, walked once by each way from one thread of the bench, each "
        "row's work the same (one column read and added). *Floor*: a plain loop over the rows fetched in "
        f"keyset batches of {it['batch']} (`id > last ORDER BY id LIMIT {it['batch']}`), no job around it. The "
        "other ways run one `IterableJob` whose `build_enumerator` returns `self.queryset_enumerator(...)` "
        "over the same rows (the same batches), through a Processor called on the bench's thread and built as "
        "a worker builds it (reliable fetch, the package's features); *checkpoints off*: "
        "`iteration_checkpoint = 86400` (the cursor saved only as the run begins and ends); *checkpoint 1 s*: "
        "the default `ITERATION_CHECKPOINT`; *checkpoint every item*: `checkpoint_every = 1`, a round trip "
        "to Redis after each item (the cursor and the progress report in one pipeline). Wall time per item, "
        f"the median of {it['reps']} walks taken in turn, with their range; *CPU*: the bench thread's own "
        "(not PostgreSQL's or Redis's). **The machine was shared** (load average "
        f"{load[0]} at the start of the run, {load[1]} at the end): compare the ways within the table.")
    add("")
    labels = {"floor": "floor (plain loop, keyset batches)", "enumerator": "IterableJob, checkpoints off",
              "checkpoint_default": "IterableJob, checkpoint every 1 s (default)",
              "checkpoint_every_item": "IterableJob, checkpoint every item"}
    floor = it["floor"]["us_per_item"]
    rows = []
    for way in WAYS:
        if way in it:
            d = it[way]
            spread = f"{fmt(min(d['us_per_item_all']))}–{fmt(max(d['us_per_item_all']))}"
            rows.append([labels[way], d["us_per_item"], spread, d["us_per_item"] - floor if way != "floor" else "–",
                         d.get("cpu_us_per_item", "–"), d["redis_round_trips_per_item"]])
    add(table(["way", "µs/item", "range", "over the floor µs", "CPU µs/item", "Redis round trips/item"], rows))
    add("")
    if "checkpoint_every_item" in it and "enumerator" in it:
        every, off = it["checkpoint_every_item"], it["enumerator"]
        cost = every["us_per_item"] - off["us_per_item"]
        cpu = (every["cpu_us_per_item"] - off["cpu_us_per_item"]) if "cpu_us_per_item" in every else None
        add(f"**A checkpoint costs {fmt(cost)} µs** (every item against none)"
            + (f", {fmt(cpu)} µs of it the job thread's CPU (the pipeline built and its replies read), the rest "
               "waiting for Redis on the same machine" if cpu is not None else "")
            + ". At the default, one a second at most, that is spread over every item of the second: "
            f"{fmt(cost / 1e4)}% of a walk's time. The enumerator's own cost, over the floor, is the "
            "loop's between two items: the checks for a stop, a cancel and a throttle, the cursor made of "
            "the row's key, the progress kept in memory.")
        add("")
    return page.text()
