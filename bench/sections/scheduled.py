"""Scheduled jobs: how late a job pushed with ``perform_at`` starts, on one idle process at default
settings, cogworker and (not in --quick) Sidekiq, due times spread evenly over a span.

Writes ``scheduled``: per system, lateness percentiles (min, p50, p99, max ms) and the poll interval.
"""

from __future__ import annotations

import time
from typing import Any

import harness
from environment import log
from markdown import Page, table
from session import Bench
from systems import Cogworker, Sidekiq

NAME = "scheduled"
QUICK = True
# (quick, default): jobs, the span of their due times, the first one's lead, cogworker's
# POLL_INTERVAL_AVERAGE (None: its default, 5 s).
PARAMS = {"scheduled_jobs": (20, 200), "scheduled_spread_seconds": (2.0, 20.0), "scheduled_lead_seconds": (1.0, 2.0),
          "scheduled_poll_interval_average": (0.5, None)}


def run(bench: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extra = {}
    pia = bench.p["scheduled_poll_interval_average"]
    if pia:
        extra["BENCH_POLL_INTERVAL_AVERAGE"] = str(pia)
    candidates: list[tuple[Any, dict]] = [(Cogworker("reliable", 10), extra)]
    if not bench.quick and not bench.args.no_sidekiq:
        candidates.append((Sidekiq(), {}))
    for system, env in candidates:
        if system.available():
            continue
        bench.reset_redis()
        workers = (system.start(bench.ctx, tag="-sched", extra_env=env) if env
                   else system.start(bench.ctx, tag="-sched"))
        try:
            bench.wait_ready(system, workers)
            k, spread, lead = (bench.p["scheduled_jobs"], bench.p["scheduled_spread_seconds"],
                               bench.p["scheduled_lead_seconds"])
            now = time.time()
            for i in range(k):
                system.push_at(bench.ctx, now + lead + spread * i / max(k - 1, 1))
            counter = harness.Counter(bench.r)
            counter.wait_for(k, timeout=lead + spread + 60, alive=lambda ws=workers: all(w.alive() for w in ws),
                             interval=0.05)
            samples = [float(x) for x in bench.r.lrange("bench:lat", 0, -1)]
            res = bench.lat_stats(samples, k, spread)
            res.pop("rate_per_s")
            res["min_ms"] = harness.rnd(min(s * 1000 for s in samples))
            # (Sidekiq's average_scheduled_poll_interval is 5 s too, and is left at its default)
            res.update(label=system.label, spread_seconds=spread, processes=1,
                       poll_interval_average=(pia or 5.0) if system.key.startswith("cogworker") else 5.0)
            out[system.key.split("-")[0]] = res
            log(f"scheduled {system.label}: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms late")
        except Exception as exc:
            bench.results["errors"][f"scheduled-{system.key}"] = f"{type(exc).__name__}: {exc}"
            log(f"scheduled {system.label} FAILED: {exc}")
        finally:
            for w in workers:
                w.stop()
    return out


def report(res: dict[str, Any]) -> str:
    sched = res.get("scheduled", {})
    if not sched:
        return ""
    page = Page()
    add = page.add
    add("## Scheduled jobs: due time to start")
    add("")
    add("One idle process, default settings, jobs pushed with `perform_at` (Sidekiq: the same ZADD to "
        "`schedule`), due times spread evenly over the span below; each job records how late it started. "
        "Sidekiq polls every POLL_INTERVAL_AVERAGE × live processes × a random 0.5–1.5, so lateness is about "
        "half an interval on average, and up to 1.5 intervals. cogworker's poller also wakes at each due "
        "time it knows of (every scheduled push publishes its due time; every sweep notes the next one), "
        "up to 0.1 s after it, at random, and at most once every 0.2 s.")
    add("")
    rows = [[d["label"], d["poll_interval_average"], d["spread_seconds"], d["jobs"], d["min_ms"], d["p50_ms"],
             d["p99_ms"], d["max_ms"]] for d in sched.values()]
    add(table(["system", "poll interval average s", "spread s", "jobs", "min ms", "p50 ms", "p99 ms",
               "max ms"], rows))
    add("")
    return page.text()
