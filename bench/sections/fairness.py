"""Fairness: what a queue's lanes cost (groups that take turns, priorities that age: issue 48's speed
goals; the Lua is broker/scripts/lanes.py, the options features/fairness/).

1. Drains, through ``Bench.drain`` as the drain section's (``runcogworker -c 10 --fetch reliable``, its
   main row): the same no-op job (one INCR) on a plain queue, and spread over ``fairness_groups`` groups
   (``GroupedNoop``, ``group = "arg:1"``, job i in group i % groups: every group has work all along).
   With ``--baseline REV`` the plain drain runs again by REV's worker (the commit before the lanes,
   ``74b158e^``), in turn with the others: a plain queue's drain unchanged, within noise. Each way
   ``fairness_reps`` times, in turn; medians. After a grouped drain the lanes must be gone (no ring,
   no group list left): checked.
2. A prioritized queue's fetch: its lane's zset filled directly (ZADD, 10,000 members a call) to each
   of ``fairness_backlogs``, then FETCH_RELIABLE called ``fairness_fetches`` times, one job a call,
   each call acking the job the last one took (as a worker's fetch does); the same over a plain queue
   list of the same backlog. Per call: the client's wall time (a loopback round trip in it) and
   Redis's own (INFO commandstats' ``usec_per_call`` of EVALSHA). O(log n): 1,000,000 close to 10,000.
3. The push: ``NoopIncr.perform_async`` against ``NoopIncr.set(priority=5).perform_async`` (one at a
   time) and ``perform_bulk`` of 1,000 (each way in turn, ``fairness_reps`` times; medians).

    python bench/run.py --sections fairness --no-sidekiq --no-profile --baseline 74b158e^
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, measured_where, table
from session import Bench
from systems import CHUNK, Cogworker, Ctx

NAME = "fairness"
QUICK = True
# (quick, default): jobs per drain, groups they are spread over, drains of each way, fetches timed
# per backlog, the backlogs of the priority fetch, pushes timed per way.
PARAMS = {"fairness_n": (300, 20_000), "fairness_groups": (10, 1_000), "fairness_reps": (1, 3),
          "fairness_fetches": (200, 5_000), "fairness_backlogs": ((1_000, 10_000), (10_000, 1_000_000)),
          "fairness_pushes": (300, 5_000)}
DRAIN_FIGURES = ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job",
                 "redis_cpu_us_per_job")
PRIORITY = 5  # the pushes' and the filled zset's (1..10 there) priority: any nonzero one takes the same path


class Variant(Cogworker):
    """The drain section's main cogworker (reliable, -c 10), pushing plain or grouped no-ops."""

    def __init__(self, how: str, groups: int, env: dict[str, str] | None = None, rev: str = ""):
        super().__init__("reliable", 10)
        self.how, self.groups = how, groups
        self.env = env or {}  # (the worker's: a --baseline revision's package)
        self.key = f"fairness-{how}" + (f"-{rev}" if rev else "")
        self.label = f"{how}{f' (worker of {rev})' if rev else ''}: {self.label}"

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None, wrap: Any = ()) -> list:
        return super().start(ctx, tag, {**self.env, **(extra_env or {})}, wrap)

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "") -> None:
        from benchproject.jobs import GroupedNoop, NoopIncr

        for start in range(0, n, CHUNK):
            now, size = time.time(), min(CHUNK, n - start)
            if self.how == "grouped":
                GroupedNoop.perform_bulk([(now, (start + i) % self.groups) for i in range(size)])
            else:
                NoopIncr.perform_bulk([(now,)] * size)


def lanes_left(r: Any) -> dict[str, Any]:
    """After a grouped drain: no ring and no group list may be left (RuntimeError otherwise)."""
    from django_cogworker.broker.keys import for_config
    from django_cogworker.push import runtime

    lanes = for_config(runtime.get_config()).lanes("default")
    left = [k for k in r.scan_iter(match=lanes.group_prefix + "*", count=1000)]
    if r.exists(lanes.ring, lanes.prio) or left:
        raise RuntimeError(f"lanes left after the drain: ring/prio {r.exists(lanes.ring, lanes.prio)}, "
                           f"group lists {len(left)}")
    return {}


def drains(bench: Bench) -> dict[str, Any]:
    n, groups, reps = bench.p["fairness_n"], bench.p["fairness_groups"], bench.p["fairness_reps"]
    ways: list[tuple[str, str, dict[str, str]]] = [("plain", "", {}), ("grouped", "", {})]
    if bench.args.baseline:
        rev, env = bench.baseline_env()
        ways.insert(1, ("plain", rev, env))
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(reps):
        for how, rev, env in ways:
            system = Variant(how, groups, env, rev)
            then = (lambda _ws: lanes_left(bench.r)) if how == "grouped" else None
            res = bench.drain(system, n, latency=False, idle=False, then=then)
            runs.setdefault(system.label.split(":")[0], []).append(res)
            log(f"fairness {system.label} (run {rep + 1} of {reps}): {res['jobs_per_s']:,} jobs/s, "
                f"{res['worker_cpu_us_per_job']} µs CPU/job, {res['redis_cpu_us_per_job']} µs Redis CPU/job")
    rnd = harness.rnd
    out: dict[str, Any] = {}
    for way, done in runs.items():
        row: dict[str, Any] = {k: rnd(statistics.median(r[k] for r in done)) for k in DRAIN_FIGURES}
        row["runs"] = [{k: r[k] for k in DRAIN_FIGURES} | {"other_cpu_cores": r.get("other_cpu_cores", 0.0)}
                       for r in done]
        row["commands_per_job"] = sorted(done, key=lambda r: r["jobs_per_s"])[len(done) // 2]["commands_per_job"]
        out[way] = row
    return {"n": n, "groups": groups, "reps": reps, "worker": Variant("plain", groups).worker_desc, "ways": out}


def fill(r: Any, qk: str, prio: str | None, backlog: int, step: float) -> None:
    """``backlog`` payloads as a push writes them: into ``prio`` (scored) or, None, the list ``qk``."""
    from django_cogworker.push import payload as payloads

    rng = random.Random(backlog)
    now = time.time()
    for start in range(0, backlog, 10_000):
        items = []
        for i in range(start, min(backlog, start + 10_000)):
            t = now - rng.random() * 3600
            head = {"priority": rng.randint(1, 10)} if prio else {}
            items.append({**head, "jid": f"{i:024x}", "class": "bench.NoopIncr", "args": [t], "kwargs": {},
                          "queue": "default", "retry": True, "created_at": t, "enqueued_at": t})
        raws = payloads.encode_many(items)
        if prio:
            r.zadd(prio, {raw: item["enqueued_at"] - item["priority"] * step
                          for raw, item in zip(raws, items, strict=True)})
        else:
            r.lpush(qk, *raws)


def fetch_cost(bench: Bench, backlog: int, fetches: int, prioritized: bool) -> dict[str, Any]:
    """FETCH_RELIABLE, one job a call, ``fetches`` times from a backlog of ``backlog``."""
    from django_cogworker.broker import scripts
    from django_cogworker.broker.keys import for_config
    from django_cogworker.push import runtime

    config = runtime.get_config()
    keys = for_config(config)
    r = bench.r
    bench.reset_redis()
    qk, prio = keys.queue("default"), keys.lanes("default").prio
    step = config.priority_aging or scripts.STRICT_STEP
    t = time.perf_counter()
    fill(r, qk, prio if prioritized else None, backlog, step)
    filled_s = time.perf_counter() - t
    in_progress = keys.in_progress("bench-fetch")
    r.config_resetstat()
    acks: list[Any] = []
    lat: list[float] = []
    scores: list[float] = []
    for _ in range(fetches):
        t = time.perf_counter()
        out = scripts.FETCH_RELIABLE(r, [in_progress, qk], [1, len(acks), *acks, step])
        lat.append(time.perf_counter() - t)
        if len(out) != 2:
            raise RuntimeError(f"fetch from a backlog of {backlog:,} took {len(out) // 2} jobs, not 1")
        acks = [out[1]]
        if prioritized:
            job = json.loads(out[1])
            scores.append(job["enqueued_at"] - job["priority"] * step)
    if scores != sorted(scores):  # (the lowest score first: else the figure is of a wrong fetch)
        raise RuntimeError(f"backlog {backlog:,}: prioritized jobs taken out of their order")
    stat = r.info("commandstats").get("cmdstat_evalsha", {})
    left = r.zcard(prio) if prioritized else r.llen(qk)
    if left != backlog - fetches:
        raise RuntimeError(f"backlog {backlog:,}: {left:,} left after {fetches:,} fetches")
    rnd = harness.rnd
    us = [x * 1e6 for x in lat]
    out_row = {"backlog": backlog, "fetches": fetches, "fill_s": rnd(filled_s),
               "client_us_p50": rnd(harness.percentile(us, 50)), "client_us_p99": rnd(harness.percentile(us, 99)),
               "client_us_mean": rnd(statistics.fmean(us)), "fetches_per_s": rnd(fetches / (sum(lat) or 1e-9)),
               "redis_us_per_call": rnd(float(stat.get("usec_per_call", 0.0))),
               "used_memory_mb": rnd(r.info("memory")["used_memory"] / 2**20)}
    bench.reset_redis()
    return out_row


def fetches(bench: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backlog in bench.p["fairness_backlogs"]:
        for kind in ("plain", "priority"):
            row = fetch_cost(bench, backlog, bench.p["fairness_fetches"], kind == "priority")
            out[f"{kind}-{backlog}"] = {"kind": kind, **row}
            log(f"fairness fetch, {kind} queue of {backlog:,}: {row['client_us_p50']} µs a fetch (p50, client), "
                f"{row['redis_us_per_call']} µs in Redis, filled in {row['fill_s']} s")
    return out


def pushes(bench: Bench) -> dict[str, Any]:
    from benchproject.jobs import NoopIncr

    n, reps = bench.p["fairness_pushes"], bench.p["fairness_reps"]
    urgent = NoopIncr.set(priority=PRIORITY)

    def one(pusher: Any) -> Any:
        def go(count: int) -> None:
            for _ in range(count):
                pusher.perform_async(time.time())
        return go

    def bulk(pusher: Any) -> Any:
        def go(count: int) -> None:
            for start in range(0, count, CHUNK):
                pusher.perform_bulk([(time.time(),)] * min(CHUNK, count - start))
        return go

    plan = {"plain_one": (n, one(NoopIncr)), "priority_one": (n, one(urgent)),
            "plain_bulk": (n * 10, bulk(NoopIncr)), "priority_bulk": (n * 10, bulk(urgent))}
    rates: dict[str, list[float]] = {k: [] for k in plan}
    redis_us: dict[str, list[float]] = {k: [] for k in plan}
    for _rep in range(reps):
        for way, (count, go) in plan.items():
            bench.reset_redis()
            a, t = harness.snap(bench.r), time.perf_counter()
            go(count)
            seconds = time.perf_counter() - t
            d = harness.delta(a, harness.snap(bench.r))
            rates[way].append(count / seconds)
            redis_us[way].append(d.cpu / count * 1e6)
    rnd = harness.rnd
    out = {way: {"jobs": plan[way][0], "jobs_per_s": rnd(statistics.median(r)), "range": [rnd(min(r)), rnd(max(r))],
                 "redis_cpu_us_per_job": rnd(statistics.median(redis_us[way]))} for way, r in rates.items()}
    for way, row in out.items():
        log(f"fairness push {way}: {row['jobs_per_s']:,} jobs/s, {row['redis_cpu_us_per_job']} µs Redis CPU/job")
    return out


def run(bench: Bench) -> dict[str, Any]:
    return {"drains": drains(bench), "fetches": fetches(bench), "pushes": pushes(bench)}


def report(res: dict[str, Any]) -> str:
    fair = res.get("fairness", {})
    if not fair.get("drains"):
        return ""
    page = Page()
    add = page.add
    dr = fair["drains"]
    add("## Fairness: groups and priorities")
    add("")
    measured_where(add, res, "fairness")
    add("")
    add(f"{dr['n']:,} no-op jobs (one `INCR`) pushed in bulk, then drained by {dr['worker']}: on a plain queue "
        f"(`bench.NoopIncr`), and spread over {dr['groups']:,} groups (`bench.GroupedNoop`, `group = \"arg:1\"`, "
        "job i in group i mod the groups: every group has work to the end, the ring holds them all). A row "
        "*(worker of REV)* is another commit's worker (`--baseline`), run in turn with this one's, on this "
        f"checkout's push: the plain queue before the lanes. Each way ran {dr['reps']} time(s), in turn; medians, "
        "with the range of jobs/s. Issue 48's goals: a plain drain unchanged within noise; 1,000 groups at "
        "≥ 0.8× the plain jobs/s.")
    add("")
    ways = dr["ways"]
    plain = ways.get("plain", {}).get("jobs_per_s")
    rows = []
    for way, d in ways.items():
        spread = [r["jobs_per_s"] for r in d["runs"]]
        rows.append([way, f"{fmt(d['jobs_per_s'])} ({fmt(min(spread))}–{fmt(max(spread))})",
                     f"{d['jobs_per_s'] / plain:.2f}×" if plain else "–", d["worker_cpu_us_per_job"],
                     d["redis_commands_per_job"], d["redis_round_trips_per_job"], d["redis_cpu_us_per_job"]])
    add(table(["way", "jobs/s (range)", "vs plain", "worker CPU µs/job", "Redis cmds/job", "round trips/job",
               "Redis CPU µs/job"], rows))
    add("")
    other = {way: statistics.median(r.get("other_cpu_cores", 0.0) for r in d["runs"]) for way, d in ways.items()}
    if any(x >= 0.15 for x in other.values()):
        add("Other load on the machine during these drains (CPU cores busy outside the worker, Redis and the "
            "bench, median of each way's runs; jobs/s and CPU figures are less trustworthy for it, the command "
            "counts are not): " + ", ".join(f"{way} {fmt(x)}" for way, x in other.items()) + ".")
        add("")
    fe = fair.get("fetches", {})
    if fe:
        add("A prioritized queue's fetch: the lane's sorted set filled directly (`ZADD`, 10,000 a call, "
            "priorities 1–10, ages up to an hour), then `FETCH_RELIABLE` called in a loop, one job a call, "
            "each acking the job the call before took (as a worker's fetch does); the same over a plain queue "
            "list of the same backlog. *client*: the call's wall time from the bench (a loopback round trip "
            "in it); *in Redis*: `INFO commandstats`' `usec_per_call` of `EVALSHA`. Issue 48's goal: O(log n) "
            "in the backlog (1,000,000 close to 10,000).")
        add("")
        add(table(["queue", "backlog", "fetches", "client µs p50", "client µs p99", "fetches/s", "µs in Redis",
                   "Redis memory MB"],
                  [[d["kind"], d["backlog"], d["fetches"], d["client_us_p50"], d["client_us_p99"],
                    d["fetches_per_s"], d["redis_us_per_call"], d["used_memory_mb"]] for d in fe.values()]))
        add("")
        sizes = sorted({d["backlog"] for d in fe.values()})
        small, big = (fe.get(f"priority-{b}") for b in (sizes[0], sizes[-1]))
        if small and big and len(sizes) > 1:
            add(f"In Redis, a prioritized fetch from {big['backlog']:,} waiting takes "
                f"{big['redis_us_per_call'] / small['redis_us_per_call']:.2f}× its time from {small['backlog']:,} "
                f"(log₂ of the backlogs: {math.log2(big['backlog']) / math.log2(small['backlog']):.2f}×; linear: "
                f"{big['backlog'] / small['backlog']:,.0f}×): the sorted set's `ZRANGE 0 0` and `ZREM` walk its skip "
                "list. The client's p99 and mean are the machine's load (a loopback round trip that waited for a "
                "CPU), not the backlog's.")
            add("")
    pu = fair.get("pushes", {})
    if pu:
        base = {k: pu.get(f"plain_{k}", {}).get("jobs_per_s") for k in ("one", "bulk")}
        add("The push: `NoopIncr.perform_async` against `NoopIncr.set(priority=5).perform_async` (one at a time: "
            "a round trip each) and `perform_bulk` of 1,000 a call, each way in turn, medians. A prioritized "
            "push writes the lane's sorted set (`ZADD`) where a plain one `LPUSH`es, and rings a doorbell "
            "into an empty queue list.")
        add("")
        add(table(["push", "jobs", "jobs/s (range)", "cost vs plain", "Redis CPU µs/job"],
                  [[way.replace("_", ", "), d["jobs"], f"{fmt(d['jobs_per_s'])} ({fmt(d['range'][0])}–"
                    f"{fmt(d['range'][1])})",
                    f"{base[way.split('_')[1]] / d['jobs_per_s']:.2f}×" if base.get(way.split("_")[1]) else "–",
                    d["redis_cpu_us_per_job"]] for way, d in pu.items()]))
        add("")
    return page.text()
