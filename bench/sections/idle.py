"""Idle load on Redis: commands and round trips per second while nothing is queued, from freshly
started cogworker processes (one, then three); the drain section adds each system's worker after its
drain. Also the idle worker's memory.

Writes ``idle`` (per row: processes, commands/s, round trips/s, by command) and
``memory.cogworker_idle_mb``.
"""

from __future__ import annotations

import time
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, table
from session import Bench
from systems import Cogworker

NAME = "idle"
QUICK = True
# (quick, default): seconds measured, and waited before (the drain section's idle rows too).
PARAMS = {"idle_seconds": (3.0, 10.0), "idle_settle_seconds": (2.0, 5.0)}


def run(bench: Bench) -> None:
    idle = bench.results.setdefault("idle", {})
    mem = bench.results.setdefault("memory", {})
    for count in (1, 3):
        system = Cogworker("reliable", 10, processes=count)
        bench.reset_redis()
        workers = system.start(bench.ctx, tag="-idle")
        try:
            bench.wait_ready(system, workers)
            time.sleep(bench.p["idle_settle_seconds"])
            if count == 1:
                mem["cogworker_idle_mb"] = harness.rnd(harness.tree_rss([workers[0].pid]) / 2**20)
            res = bench.idle_rates(bench.p["idle_seconds"])
            idle[f"cogworker_{count}_process{'es' if count > 1 else ''}"] = {
                "label": f"cogworker, {count} idle process{'es' if count > 1 else ''} (reliable c10)",
                "processes": count, **res}
            log(f"idle, {count} cogworker process(es): {res['commands_per_s']} commands/s")
        finally:
            for w in workers:
                w.stop()


def report(res: dict[str, Any]) -> str:
    idle = res.get("idle", {})
    if not idle:
        return ""
    page = Page()
    add = page.add
    add("## Idle load on Redis")
    add("")
    add("Commands and round trips per second while nothing is queued, over "
        f"{fmt(next(iter(idle.values()))['seconds'])} s (`INFO commandstats` deltas): what a fleet of idle "
        "workers costs Redis. The cogworker rows with \"idle process\" are freshly started processes; the "
        "others are each system's worker after its drain.")
    add("")
    rows = [[d["label"], d["processes"], d["commands_per_s"], d["round_trips_per_s"],
             ", ".join(f"{k} {fmt(x)}" for k, x in d["by_command_per_s"].items())] for d in idle.values()]
    add(table(["system", "processes", "commands/s", "round trips/s", "by command (/s)"], rows, "lrrrl"))
    add("")
    return page.text()
