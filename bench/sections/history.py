"""Metrics history in the drain: what counting every run by minute and class costs (issue 46).

N no-op jobs (``NoopIncr``) pushed in bulk, then drained by ``runcogworker -c 10 --processes 2``
through ``Bench.drain`` (session.py) as the other drains are, two ways: *off*
(``METRICS_HISTORY = False``) and *on* (the default: each run counted in memory by the history
feature's ``after`` hook, written by its heartbeat chore in one pipeline a beat). Each way runs
``reps`` times, in turn (off, on, off, ...: a drift in the machine's load falls on both); each
figure is the median of its runs.

    python bench/run.py --sections history --no-venv                   # this section alone
    python bench/run.py --sections history --no-venv --history-n 5000 --history-reps 3
"""

from __future__ import annotations

from typing import Any

import harness
from environment import log
from markdown import Page, fmt, measured_where, table
from session import Bench
from systems import Cogworker, Ctx

NAME = "history"
QUICK = True
PARAMS = {"history_n": (300, 10_000), "history_reps": (1, 3)}
WAYS = ("off", "on")
MEDIANS = ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job",
           "redis_cpu_us_per_job")


class Way(Cogworker):
    """The bench's cogworker system (reliable, -c 10, --processes 2), its history on or off."""

    def __init__(self, how: str):
        super().__init__("reliable", 10, processes=2)
        self.how = how
        self.key = f"history-{how}"
        self.label = f"history {how}: {self.label}"

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None, **kwargs: Any) -> Any:
        env = {**(extra_env or {}), "BENCH_METRICS_HISTORY": "1" if self.how == "on" else "0"}
        return super().start(ctx, tag, extra_env=env, **kwargs)

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "") -> None:
        super().push_bulk(ctx, n, "NoopIncr")


def run(bench: Bench) -> dict[str, Any]:
    n, reps = bench.p["history_n"], bench.p["history_reps"]
    runs: dict[str, list[dict[str, Any]]] = {how: [] for how in WAYS}
    for rep in range(reps):
        for how in WAYS:
            res = bench.drain(Way(how), n, latency=False, idle=False)
            runs[how].append(res)
            log(f"history {how} (run {rep + 1} of {reps}): {res['jobs_per_s']:,} jobs/s, "
                f"{res['worker_cpu_us_per_job']} µs CPU/job")
    out: dict[str, Any] = {"ways": {how: harness.median_row(done, MEDIANS) for how, done in runs.items()}}
    off, on = out["ways"]["off"], out["ways"]["on"]
    out["fewer_jobs_per_s_pct"] = harness.fewer_pct(off["jobs_per_s"], on["jobs_per_s"])
    out.update(n=n, reps=reps, worker=Way("off").worker_desc)
    return out


def report(res: dict[str, Any]) -> str:
    """The same no-op jobs with the metrics history off and on."""
    hist = res.get("history", {})
    if not hist.get("ways"):
        return ""
    page = Page()
    add = page.add
    add("## Metrics history: what counting every run costs")
    add("")
    measured_where(add, res, "history")
    add("")
    add(f"{hist['n']:,} no-op jobs (`bench.NoopIncr`) pushed in bulk, then drained by {hist['worker']}, with "
        "`METRICS_HISTORY` off and on (the default), "
        f"{hist['reps']} time(s) each, in turn; medians, with the range of jobs/s. With it on, each run is "
        "counted in memory (one lock) by the history feature's `after` hook and written once a beat by its "
        "chore, one pipeline of `HINCRBY`s a process (docs/observability.md#metrics-history).")
    add("")
    rows = []
    for how, d in hist["ways"].items():
        spread = [r["jobs_per_s"] for r in d["runs"]]
        rows.append([how, f"{fmt(d['jobs_per_s'])} ({fmt(min(spread))}–{fmt(max(spread))})",
                     d["worker_cpu_us_per_job"], d["redis_commands_per_job"], d["redis_round_trips_per_job"],
                     d["redis_cpu_us_per_job"]])
    add(table(["history", "jobs/s (range)", "worker CPU µs/job", "Redis cmds/job", "round trips/job",
               "Redis CPU µs/job"], rows))
    add("")
    add(f"On: {fmt(hist['fewer_jobs_per_s_pct'])}% fewer jobs/s than off (issue 46's goal: 10% at most).")
    add("")
    return page.text()
