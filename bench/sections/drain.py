"""Drain: N no-op jobs pushed in bulk, then drained by one worker, every system in turn (cogworker's
ways, rq, dramatiq, huey, celery, Sidekiq, a bare redis-py loop: bench/systems.py); with each
drain, push-to-start latency (idle and loaded) and the idle worker's load on Redis.

Writes ``drain`` (per system: jobs/s, worker CPU, Redis commands, round trips and CPU per job),
``latency`` and the systems' entries of ``idle``; its report is the drain table, the chart
(docs/benchmarks.png) and the latency table.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from environment import log
from markdown import REFERENCE, Page, fmt, other_load, table
from session import Bench, median_of
from systems import all_systems, quick_systems

NAME = "drain"
QUICK = True
# (quick, default) sizes of the latency measured after each drain.
PARAMS = {"latency_idle_jobs": (20, 200), "latency_idle_rate": (100.0, 50.0), "latency_loaded_seconds": (1.0, 5.0)}
# Slow peers drain fewer jobs, so the run stays within its time; the N used is in the results.
N_CAPS = {"rq-fork": 2_000, "rq-simple": 20_000}


def run(bench: Bench) -> None:
    res = bench.results
    systems = quick_systems() if bench.quick else all_systems(N_CAPS)
    res["meta"]["n_caps"] = {} if bench.quick else N_CAPS
    if bench.args.no_sidekiq:
        systems = [s for s in systems if s.key != "sidekiq"]
        res["skipped"]["sidekiq"] = "--no-sidekiq"
    res["drain"] = drains = {}
    res["latency"] = lat = {}
    res["idle"] = idle = res.get("idle", {})
    ready = []
    for system in systems:
        if bench.only and system.key not in bench.only:
            continue
        why = system.available()
        if why:
            res["skipped"][system.key] = why
            log(f"skipping {system.label}: {why}")
            continue
        ready.append(system)
    runs: dict[str, list[dict[str, Any]]] = {s.key: [] for s in ready}
    # Every system once, then every system again (--reps): a drift of the machine's load falls on all.
    for rep in range(bench.args.reps):
        for system in ready:
            n = min(bench.n, system.n_cap) if system.n_cap else bench.n
            try:
                # (Latency and idle rates once, in the first round: they are not what --reps is for.)
                out = bench.drain(system, n, idle=not bench.quick and rep == 0, latency=rep == 0)
            except Exception as exc:
                res["errors"][system.key] = f"{type(exc).__name__}: {exc}"
                log(f"{system.label} FAILED: {exc}\n{traceback.format_exc()}")
                continue
            if "latency" in out:
                lat[system.key] = {"label": system.label, **out.pop("latency")}
            if "idle" in out:
                idle[system.key] = {"label": system.label, "processes": out["processes"], **out.pop("idle")}
            runs[system.key].append(out)
            drains[system.key] = median_of(runs[system.key])
            bench.save_partial()


def report(res: dict[str, Any], png: bool = False) -> str:
    """The drain table (with the chart when ``png``), then the latency table."""
    page = Page()
    _drains(page.add, res, png)
    _latency(page.add, res.get("latency", {}))
    return page.text()


def _drains(add: Any, res: dict[str, Any], png: bool) -> None:
    meta = res["meta"]
    drains = res.get("drain", {})
    ref = drains.get(REFERENCE, {}).get("jobs_per_s")
    add("## Drain: N jobs pushed in bulk, then drained by one worker")
    add("")
    add("The job is one `INCR bench:done`; the run ends when the counter reaches N. Timing, worker CPU and "
        "Redis counters start at the first completed job (so worker start-up is left out) and end at the "
        "last. *Worker CPU* is user + sys of the worker's whole process tree (psutil; forked children "
        "included). *Redis commands* counts every command Redis ran, those inside Lua scripts included "
        "(`INFO commandstats`); *round trips* are Redis read events (`total_reads_processed`): a pipeline "
        "or a script is one. The bench's own polling and INFO calls are subtracted. *vs ref* is jobs/s "
        f"relative to `{REFERENCE}`.")
    add("")
    rows = []
    for d in drains.values():
        if "jobs_per_s" not in d:
            continue
        n = f"{d['n']:,}" + (" ⚠" if d["n"] != meta["n"] else "")
        rows.append([d["label"], n, d["jobs_per_s"], f"{d['jobs_per_s'] / ref:.2f}×" if ref else "–",
                     d["worker_cpu_us_per_job"], d["worker_cpu_cores"], d["redis_commands_per_job"],
                     d["redis_round_trips_per_job"], d["redis_cpu_us_per_job"], d["rss_mb_after"]])
    add(table(["system", "N", "jobs/s", "vs ref", "worker CPU µs/job", "worker cores", "Redis cmds/job",
               "round trips/job", "Redis CPU µs/job", "RSS after (MB)"], rows))
    add("")
    if any(d.get("n") != meta["n"] for d in drains.values()):
        add("⚠ N reduced for slow systems, so the run stays within its time: "
            + ", ".join(f"{d['label']} {d['n']:,}" for d in drains.values() if d.get("n") != meta["n"]) + ".")
        add("")
    note = other_load(drains, lambda d: d["label"])
    if note:
        add(note)
        add("")
    if png:
        add("![drain: jobs/s, worker CPU per job, Redis round trips per job](benchmarks.png)")
        add("")
    add("How each worker ran (each at its usual settings, logging at WARNING: at INFO cogworker and Sidekiq "
        "write two lines per job, which would dominate a no-op job):")
    add("")
    for d in drains.values():
        add(f"- {d['label']}: {d.get('worker', '')}")
    add("")
    add("Commands per job, by command (≥ 0.001 per job):")
    add("")
    for d in drains.values():
        if d.get("commands_per_job"):
            cmds = ", ".join(f"{k} {fmt(x)}" for k, x in d["commands_per_job"].items())
            add(f"- {d['label']}: {cmds}")
    add("")


def _latency(add: Any, lat: dict[str, Any]) -> None:
    if not lat:
        return
    add("## Latency: push to start")
    add("")
    add("Each job records `time.time() - t`, `t` being taken just before the push (one job at a time, "
        "through each library's ordinary one-job call), measured after each system's drain above. *Idle*: a "
        "trickle (at most 50/s, and at most a tenth of that system's drain rate). *Loaded*: pushed for a few "
        "seconds at half the drain rate measured above — or as fast as one Python thread could push, when that "
        "was less (the rate column says what was reached).")
    add("")
    rows = []
    for d in lat.values():
        i, ld = d["idle"], d["loaded"]
        rows.append([d["label"], i["p50_ms"], i["p99_ms"], i["jobs"], ld["rate_per_s"], ld["p50_ms"],
                     ld["p99_ms"], ld["jobs"]])
    add(table(["system", "idle p50 ms", "idle p99 ms", "idle jobs", "loaded rate /s", "loaded p50 ms",
               "loaded p99 ms", "loaded jobs"], rows))
    add("")


def chart(res: dict[str, Any], path: Path) -> bool:
    """docs/benchmarks.png: the drains' jobs/s, CPU and round trips per job; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    drains = res.get("drain", {})
    keys = [k for k in drains if "jobs_per_s" in drains[k]]
    if not keys:
        return False
    labels = [drains[k]["label"] + (f" (N={drains[k]['n']:,})" if drains[k]["n"] != res["meta"]["n"] else "")
              for k in keys]
    panels = [("jobs_per_s", "drain: jobs/s (higher is better)"),
              ("worker_cpu_us_per_job", "worker CPU µs per job (lower is better)"),
              ("redis_round_trips_per_job", "Redis round trips per job (lower is better)")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 0.45 * len(keys) + 1.8), sharey=True)
    ys = list(range(len(keys)))[::-1]
    for ax, (field, title) in zip(axes, panels, strict=True):
        values = [drains[k][field] for k in keys]
        colors = ["#c0392b" if k.startswith("cogworker") else "#7f8c8d" if k == "floor" else "#2980b9"
                  for k in keys]
        bars = ax.barh(ys, values, color=colors)
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log" if max(values) / max(min(values), 1e-9) > 50 else "linear")
        for bar, v in zip(bars, values, strict=True):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + fmt(v), va="center", fontsize=7)
        ax.margins(x=0.25)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels(labels, fontsize=8)
    m = res["machine"]
    fig.suptitle(f"No-op job (one INCR), {res['meta']['n']:,} jobs pushed in bulk, one run — "
                 f"{m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gb']} GB RAM; "
                 f"ratios hold within this run only", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
