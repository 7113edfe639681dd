"""Enqueue: jobs/s of a push from one Python thread, no worker running: cogworker one at a time
(``perform_async``) and in bulk (``perform_bulk``), the bare redis-py LPUSH loops, and each peer's
one-job call (not in --quick). Each way timed in turn, ``enqueue_reps`` times over; the median kept.

Writes ``enqueue``: per way, its label, jobs, jobs/s (median) and range.
"""

from __future__ import annotations

import time
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, table
from session import Bench
from systems import Celery, Dramatiq, Huey, Rq, Sidekiq, _floor_payload

NAME = "enqueue"
QUICK = True
# (quick, default): jobs pushed one at a time (cogworker, bare loop), by each peer, in bulk; rounds.
PARAMS = {"enqueue_one_jobs": (300, 10_000), "enqueue_peer_jobs": (300, 5_000), "enqueue_bulk_jobs": (300, 100_000),
      "enqueue_reps": (1, 3)}


def run(bench: Bench) -> dict[str, Any]:
    from benchproject.jobs import DebouncedNoop, NoopIncr, ThrottledNoop

    rnd = harness.rnd
    out: dict[str, Any] = {}

    plan: list[tuple[str, int, Any, str]] = []

    def timed(name: str, jobs: int, fn: Any, label: str) -> None:
        plan.append((name, jobs, fn, label))

    one, bulk = bench.p["enqueue_one_jobs"], bench.p["enqueue_bulk_jobs"]

    def perform_async(n: int) -> None:
        for _ in range(n):
            NoopIncr.perform_async(time.time())

    def perform_async_short(n: int) -> None:
        # A queue that workers keep short. Every push is the PUSH script now, onto a backlog
        # or not (it was LPUSH alone onto a backlog, the row above): the same path as that
        # row, kept so that the results of earlier runs compare.
        perform_async(n)

    def perform_bulk(n: int) -> None:
        for start in range(0, n, 1000):
            now = time.time()
            NoopIncr.perform_bulk([(now,)] * min(1000, n - start))

    # Pushes that collapse (features/collapse/, issue 48: goal <= 1.3x a plain push's cost): a debounce
    # that replaces the job waiting (one dedup key: ZREM, ZADD, HSET), one whose arguments differ each
    # time (a new job each push), and a throttle whose pushes are all written (distinct arguments:
    # its dearest path; a dropped one writes nothing).
    def debounced_replacing(n: int) -> None:
        pusher = DebouncedNoop.set(dedup_key="bench")
        for _ in range(n):
            pusher.perform_async(time.time())

    def debounced_new(n: int) -> None:
        for _ in range(n):
            DebouncedNoop.perform_async(time.time())

    def throttled_new(n: int) -> None:
        for _ in range(n):
            ThrottledNoop.perform_async(time.time())

    def lpush_loop(n: int) -> None:
        for _ in range(n):
            bench.r.lpush("bare:queue", _floor_payload("noop", time.time()))

    def lpush_bulk(n: int) -> None:
        for start in range(0, n, 1000):
            now = time.time()
            bench.r.lpush("bare:queue", *(_floor_payload("noop", now) for _ in range(min(1000, n - start))))

    timed("cogworker_perform_async", one, perform_async, "cogworker perform_async, one at a time")
    timed("cogworker_perform_async_short", one, perform_async_short,
          "cogworker perform_async, one at a time, as to a queue kept short")
    timed("cogworker_debounced_replacing", one, debounced_replacing,
          "cogworker perform_async, debounce, each replacing the one waiting")
    timed("cogworker_debounced_new", one, debounced_new, "cogworker perform_async, debounce, each a new job")
    timed("cogworker_throttled_new", one, throttled_new, "cogworker perform_async, throttle, each written")
    timed("bare_lpush", one, lpush_loop, "bare LPUSH loop, one at a time")
    timed("cogworker_perform_bulk", bulk, perform_bulk, "cogworker perform_bulk, 1,000 per call")
    timed("bare_lpush_bulk", bulk, lpush_bulk, "bare LPUSH of 1,000 payloads per call")

    peers = [] if bench.quick else [Rq(fork=False), Dramatiq(), Huey(), Celery()]
    if not bench.quick and not bench.args.no_sidekiq:
        peers.append(Sidekiq())
    for system in peers:
        if system.available() is None:
            key = system.key.replace("-simple", "")
            name = {"rq": "rq Queue.enqueue", "dramatiq": "dramatiq actor.send", "huey": "huey task()",
                    "celery": "celery task.delay",
                    "sidekiq": "Sidekiq wire format (MULTI SADD LPUSH EXEC), from Python"}[key]
            timed(f"{key}_one", bench.p["enqueue_peer_jobs"],
                  lambda n, s=system: [s.push_one(bench.ctx, time.time()) for _ in range(n)],
                  f"{name}, one at a time")
    # Round trips on loopback vary a lot from one second to the next on a small VM: every way is
    # timed in turn, ``reps`` times over, and the median is kept (with the spread).
    rates: dict[str, list[float]] = {name: [] for name, *_ in plan}
    for _rep in range(bench.p["enqueue_reps"]):
        for name, jobs, fn, _label in plan:
            bench.reset_redis()
            t = time.perf_counter()
            fn(jobs)
            rates[name].append(jobs / (time.perf_counter() - t))
    for name, jobs, _fn, label in plan:
        r = sorted(rates[name])
        out[name] = {"label": label, "jobs": jobs, "reps": len(r), "jobs_per_s": rnd(r[len(r) // 2]),
                     "min_jobs_per_s": rnd(r[0]), "max_jobs_per_s": rnd(r[-1])}
        log(f"enqueue {label}: {out[name]['jobs_per_s']:,} jobs/s (median of {len(r)})")
    return out


def report(res: dict[str, Any]) -> str:
    enq = res.get("enqueue", {})
    if not enq:
        return ""
    page = Page()
    add = page.add
    add("## Enqueue")
    add("")
    add("From one Python thread, no worker running; each way timed in turn, three times over, the "
        "median kept (the range shows how much one-round-trip-at-a-time rates wander on this VM). "
        "One at a time: one call per job, each a round trip "
        "(outside a transaction: inside `atomic()` cogworker waits for the commit). In bulk: 1,000 jobs "
        "per call. The bare loops push a payload of the same size with plain redis-py. A cogworker push "
        "is the PUSH script (the job, its unique lock, the queues listing and the pusher's receipt in "
        "one Lua call), onto a backlog (no worker runs: the queue grows) or to a queue kept short, the "
        "second row (the same path since the receipt; runs before it sent LPUSH alone onto a backlog).")
    add("")
    bare = enq.get("bare_lpush", {}).get("jobs_per_s")
    plain = enq.get("cogworker_perform_async", {}).get("jobs_per_s")
    collapsing = ("cogworker_debounced", "cogworker_throttled")
    # (A run from before the collapsing rows existed has none: no column, no sentence about them.)
    costs = any(k.startswith(collapsing) for k in enq)
    rows = [[d["label"], d["jobs"], d["jobs_per_s"],
             f"{fmt(d['min_jobs_per_s'])}–{fmt(d['max_jobs_per_s'])}" if "min_jobs_per_s" in d else "–",
             f"{d['jobs_per_s'] / bare:.2f}×" if bare and "bulk" not in k else "–",
             *([f"{plain / d['jobs_per_s']:.2f}×" if plain and k.startswith(collapsing) else "–"] if costs else [])]
            for k, d in enq.items()]
    add(table(["how", "jobs", "jobs/s (median)", "range", "vs bare LPUSH loop",
               *(["cost vs plain push"] if costs else [])], rows))
    add("")
    if costs:
        add("The debounce and throttle rows (docs/fairness.md): a push's cost against a plain `perform_async`'s "
            "(its time a job over the plain one's; issue 48's goal: at most 1.3×).")
        add("")
    return page.text()
