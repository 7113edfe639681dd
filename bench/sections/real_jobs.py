"""Real jobs: 1 ms of I/O (``IoWait``) and 200 µs of CPU (``CpuBurn``), the same job on both sides,
drained by cogworker reliable and Sidekiq at -c 10 and -c 25 (bench/benchproject/jobs.py,
bench/sidekiq/bench_jobs.rb). Not in --quick.

Writes ``real_jobs``: the I/O sleep, the CPU burn's calibration (Python's and Ruby's loops), and a
drain per system and job (``<system>/<job>``), with its ideal jobs/s for IoWait.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from pathlib import Path
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, other_load, table
from session import Bench, median_of
from systems import Cogworker, Sidekiq

NAME = "real_jobs"
QUICK = False
BENCH = Path(__file__).resolve().parent.parent
# Jobs per drain at the default N (100,000), scaled with --n: a drain lasts seconds, the section one
# to two minutes on a 2-CPU VM.
REAL_JOBS_N = {"IoWait": 5_000, "CpuBurn": 20_000}


def run(bench: Bench) -> None:
    """IoWait (GET, sleep 1 ms, INCR), where concurrency should pay up to C × 1,000 jobs/s, and CpuBurn
    (about 200 µs of interpreter CPU, then INCR), where one process's GIL (Ruby: GVL) is the limit."""
    from benchproject import jobs

    rnd = harness.rnd
    # Each side in turn at each concurrency: a drift in the machine's load falls on both.
    systems: list[Any] = [Cogworker("reliable", 10), Sidekiq(), Cogworker("reliable", 25), Sidekiq(concurrency=25)]
    if bench.args.no_sidekiq:
        systems = [s for s in systems if not isinstance(s, Sidekiq)]
    ready = []
    for system in systems:
        why = system.available()
        if why:
            bench.results["skipped"][f"real-{system.key}"] = why
        elif not bench.only or system.key in bench.only:
            ready.append(system)
    systems = ready
    bench.results["real_jobs"] = out = {
        "io_sleep_ms": jobs.IO_SLEEP_S * 1000, "cpu_burn_target_us": jobs.CPU_BURN_TARGET_US,
        "cpu_burn": {"python": {"loops": jobs.CPU_BURN_LOOPS, "us": rnd(jobs.CPU_BURN_US)}}, "drain": {}}
    # Every drain burns the loops stated here: the bench's calibration, passed to the workers
    # (each would calibrate on its own otherwise, and differ by the noise of the moment).
    burn_env = {"BENCH_CPU_BURN_LOOPS_PYTHON": str(jobs.CPU_BURN_LOOPS)}
    if any(isinstance(s, Sidekiq) for s in systems):
        try:
            ruby = json.loads(subprocess.run(["ruby", str(BENCH / "sidekiq" / "bench_jobs.rb")], check=True,
                                             capture_output=True, text=True, timeout=60).stdout)
            out["cpu_burn"]["ruby"] = ruby
            burn_env["BENCH_CPU_BURN_LOOPS_RUBY"] = str(ruby["loops"])
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            bench.results["errors"]["real-ruby-calibration"] = f"{type(exc).__name__}: {exc}"
            systems = [s for s in systems if not isinstance(s, Sidekiq)]
    log(f"real jobs: CpuBurn calibrated to {out['cpu_burn']}")
    bench.ctx.env.update(burn_env)
    try:
        for kind, default_n in REAL_JOBS_N.items():
            n = max(1_000, round(default_n * bench.n / 100_000))
            runs: dict[str, list[dict[str, Any]]] = {}
            for _rep in range(bench.args.reps):
                for system in systems:
                    key = f"{system.key}/{kind}"
                    try:
                        res = bench.drain(system, n, kind=kind, latency=False, idle=False)
                    except Exception as exc:
                        bench.results["errors"][f"real-{key}"] = f"{type(exc).__name__}: {exc}"
                        log(f"{system.label} {kind} FAILED: {exc}\n{traceback.format_exc()}")
                        continue
                    runs.setdefault(key, []).append(res)
                    res = median_of(runs[key])
                    res.update(job=kind, concurrency=system.concurrency)
                    if kind == "IoWait":
                        # Each job holds a slot for the sleep at least: C slots, C / sleep jobs/s at most.
                        res["ideal_jobs_per_s"] = system.concurrency / jobs.IO_SLEEP_S
                        res["vs_ideal"] = rnd(res["jobs_per_s"] / res["ideal_jobs_per_s"])
                    out["drain"][key] = res
                    bench.save_partial()
    finally:
        for name in burn_env:
            bench.ctx.env.pop(name)


def report(res: dict[str, Any]) -> str:
    real = res.get("real_jobs", {})
    if not real.get("drain"):
        return ""
    page = Page()
    add = page.add
    drains = real["drain"]
    burn = real["cpu_burn"]
    calibrations = "; ".join(f"{lang.capitalize()}: {c['loops']:,} turns, {fmt(c['us'])} µs"
                             for lang, c in burn.items())
    add("## Real jobs: 1 ms of I/O, 200 µs of CPU")
    add("")
    add("The drain above measures the job system alone; these jobs do some work, the same on both sides "
        "(`bench/benchproject/jobs.py`, `bench/sidekiq/bench_jobs.rb`), pushed in bulk and drained by one "
        "process, measured as above (from the first job done to the last). "
        f"*IoWait*: `GET bench:io`, sleep {real['io_sleep_ms']:g} ms, `INCR bench:done`: a job that mostly "
        f"waits, so C threads could run up to C × {fmt(1000 / real['io_sleep_ms'])} a second (*vs ideal*). "
        f"*CpuBurn*: a loop of interpreter code calibrated to about {real['cpu_burn_target_us']} µs of CPU "
        f"({calibrations}: timed by the bench before the drains, and every worker ran that many turns), "
        "then `INCR bench:done`: a job that mostly computes, so one process runs at most about "
        f"{fmt(1e6 / real['cpu_burn_target_us'])} a second whatever its concurrency (one GIL; Ruby's GVL "
        "likewise). *vs Sidekiq*: jobs/s against Sidekiq's at the same concurrency, same job.")
    add("")

    def sidekiq(d: dict[str, Any]) -> dict[str, Any] | None:
        return next((x for k, x in drains.items() if k.startswith("sidekiq")
                     and x["job"] == d["job"] and x["concurrency"] == d["concurrency"]), None)

    rows = []
    for key, d in drains.items():
        peer = None if key.startswith("sidekiq") else sidekiq(d)
        rows.append([d["label"], d["job"], d["n"], d["jobs_per_s"],
                     f"{d['vs_ideal']:.2f}× of {fmt(d['ideal_jobs_per_s'])}" if "vs_ideal" in d else "–",
                     f"{d['jobs_per_s'] / peer['jobs_per_s']:.2f}×" if peer else "–", d["worker_cpu_us_per_job"]])
    add(table(["system", "job", "N", "jobs/s", "vs ideal", "vs Sidekiq", "worker CPU µs/job"], rows, "llrrrrr"))
    add("")
    note = other_load(drains, lambda d: f"{d['label']} {d['job']}")
    if note:
        add(note)
        add("")
    gap = BENCH / "tools" / "io_gap.md"
    if gap.exists():  # (hand-written: where the IoWait -c 10 row's time goes, bench/tools/io_gap.py; issue 47)
        add(gap.read_text().rstrip())
        add("")
    return page.text()
