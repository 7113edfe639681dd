"""Wake-ups per job: bench/wakeups.py's table (a no-op drain's CPU, context switches, CPU migrations
and futex calls per job, at -c 2/10/25, unpinned and pinned to one CPU), against this run's
redis-server. Not in --quick; needs ``perf`` and ``taskset``.

Writes ``wakeups``: the machine line, N, and the rows (NaN, when perf could not count, as null).
"""

from __future__ import annotations

import math
import shutil
from typing import Any

import harness
import wakeups as tool  # (bench/wakeups.py, the table's own script)
from environment import log
from markdown import Page, table
from session import Bench

NAME = "wakeups"
QUICK = False
# Jobs per drain at the default N (100,000), scaled with --n.
WAKEUPS_N = 20_000


def run(bench: Bench) -> dict[str, Any] | None:
    missing = [t for t in ("perf", "taskset") if not shutil.which(t)]
    if missing:
        bench.results["skipped"]["wakeups"] = f"{' and '.join(missing)} not on PATH"
        return None
    rnd = harness.rnd
    n = max(5_000, round(WAKEUPS_N * bench.n / 100_000))
    # (In the results from the start: the rows measured stay there when a later one fails.)
    out: dict[str, Any] = {"machine": tool.machine(), "n": n, "rows": []}
    bench.results["wakeups"] = out
    for row in tool.rows(bench.server.url, n):
        # NaN: perf ran but could not count (a kernel without the futex tracepoint, say).
        out["rows"].append({k: None if isinstance(v, float) and not math.isfinite(v) else
                            rnd(v) if isinstance(v, float) else v for k, v in row.items()})
        log(f"wake-ups {row['label']}: {row['jobs_per_s']:,.0f} jobs/s, {row['cpu_us']:.0f} µs CPU/job, "
            f"{row['migrations']:.2f} migrations/job")
    return out


def report(res: dict[str, Any]) -> str:
    if "wakeups" not in res and "wakeups" not in res.get("skipped", {}):
        return ""
    page = Page()
    add = page.add
    add("## Where an unpinned process's CPU goes: wake-ups per job")
    add("")
    wake = res.get("wakeups") or {}
    if not wake.get("rows"):
        why = res.get("skipped", {}).get("wakeups") or res.get("errors", {}).get("wakeups", "no row measured")
        add(f"Not measured in this run: {why}.")
        add("")
        return page.text()
    add(f"`bench/wakeups.py`'s table, in this run, against the same `redis-server` ({wake['machine']}): "
        f"{wake['n']:,} no-op jobs pushed in bulk, then one `runcogworker -c C` drains them, with "
        "`CPU_AFFINITY = \"none\"` (by default a worker bound by its GIL keeps itself on one CPU), free to run on "
        "either CPU (unpinned) or under `taskset -c 1` (pinned). From the first job done to the last: jobs/s; "
        "the worker's CPU per job (user + sys); context switches per job over its threads, voluntary (a "
        "thread blocked: on the GIL, a queue, a socket) and involuntary (preempted); CPU migrations (a thread "
        "woken on another CPU than it last ran on) and futex calls (a thread waiting for, or waking, another) "
        "per job, counted by `perf stat`; and the kernel's share of the worker's CPU.")
    add("")
    rows = [[r["label"], r["jobs_per_s"], r["cpu_us"], r["voluntary"], r["involuntary"], r["migrations"],
             r["futex"], f"{r['sys_share'] * 100:.0f}%"] for r in wake["rows"]]
    add(table(["row", "jobs/s", "CPU µs/job", "vol. cs/job", "invol. cs/job", "migrations/job", "futex/job",
               "kernel %"], rows))
    add("")
    return page.text()
