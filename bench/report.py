"""Write docs/benchmarks.md (and docs/benchmarks.png) from a bench results JSON.

    python bench/run.py ...                       # writes them at the end of a default or full run
    bench/.venv/bin/python bench/report.py [bench/results/latest.json]   # again, from a saved run
    python bench/report.py bench/results/latest.json bench/results/<run>.json   # with <run>'s sections

A run of some sections only (``run.py --sections``) writes no page: given after the first file, its
sections replace that file's, and the page says which run each came from.

The chart needs matplotlib, which only the bench venv has; without it the page is written without it
(but when sections are merged in, the chart of the first file's drains on disk is kept).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DOC = ROOT / "docs" / "benchmarks.md"
PNG = ROOT / "docs" / "benchmarks.png"
REFERENCE = "cogworker-reliable-c10"


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, about ``digits`` significant figures."""
    if x is None or x == "":
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, int) or x == 0 or abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{x:,.{max(decimals, 0)}f}"


def table(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def stage_table(add: Any, prof: dict[str, Any]) -> None:
    """Per-stage GIL-held time per job (bench/stages.py), beside the --baseline revision's if profiled."""
    now = prof["stages"]
    before = (prof.get("baseline") or {}).get("stages")
    rev = (prof.get("baseline") or {}).get("rev")
    add("### Per-stage costs" + (f": before ({rev}) and after" if before else ""))
    add("")
    also = f"in the same run, of the worker as of `{rev}`, " if before else ""
    add("Each sample of the profile above (and, " + also + "start-up left out) is put in the first stage "
        "whose frame is in its stack (bench/stages.py): the job's own redis-py call counts as the job. "
        "Samples ÷ rate ÷ jobs is the GIL-held time per job: the time no "
        "other thread of the worker could run Python, which bounds its throughput (its CPU per job adds the "
        "kernel's side of sockets and thread wake-ups).")
    add("")
    names = [r["stage"] for r in now["stages"]]
    if before:
        names += [r["stage"] for r in before["stages"] if r["stage"] not in names]

    def cell(res: dict[str, Any] | None, name: str) -> str:
        row = next((r for r in (res or {}).get("stages", []) if r["stage"] == name), None)
        return f"{row['us_per_job']} ({row['pct']}%)" if row else "–"

    header = ["stage", *([f"before ({rev}): µs/job (%)", "after: µs/job (%)"] if before else ["µs/job (%)"])]
    rows = [[name, *([cell(before, name)] if before else []), cell(now, name)] for name in names]
    rows.append(["**GIL-held µs per job**", *([before["gil_us_per_job"]] if before else []), now["gil_us_per_job"]])
    add(table(header, rows, "l" + "r" * (len(header) - 1)))
    add("")



def other_load(drains: dict[str, Any], name: Any) -> str | None:
    """What the drains say of the machine's other load (``name``: a drain's name in the sentence)."""
    other = {name(d): d["other_cpu_cores"] for d in drains.values() if d.get("other_cpu_cores", 0) >= 0.15}
    if other:
        return ("Other load on the machine during some drains (CPU cores busy outside the worker, Redis and the "
                "bench; those figures are less trustworthy): " + ", ".join(f"{k} {fmt(x)}" for k, x in other.items())
                + ".")
    if any("other_cpu_cores" in d for d in drains.values()):
        return ("The machine was otherwise quiet during every drain (under 0.15 core busy outside the worker, "
                "Redis and the bench, within the accounting noise of about ±0.1 core).")
    return None


def real_jobs_section(add: Any, real: dict[str, Any]) -> None:
    """cogworker against Sidekiq with jobs that wait (IoWait) or compute (CpuBurn)."""
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


def wakeups_section(add: Any, res: dict[str, Any]) -> None:
    """bench/wakeups.py's table: where an unpinned process's CPU goes."""
    add("## Where an unpinned process's CPU goes: wake-ups per job")
    add("")
    wake = res.get("wakeups") or {}
    if not wake.get("rows"):
        why = res.get("skipped", {}).get("wakeups") or res.get("errors", {}).get("wakeups", "no row measured")
        add(f"Not measured in this run: {why}.")
        add("")
        return
    add(f"`bench/wakeups.py`'s table, in this run, against the same `redis-server` ({wake['machine']}): "
        f"{wake['n']:,} no-op jobs pushed in bulk, then one `runcogworker -c C` drains them, free to run on "
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


def measured_where(add: Any, res: dict[str, Any], source: dict[str, Any] | None, section: str) -> None:
    """The line saying where a section run on its own was measured: its run, or this one's machine."""
    if source:
        add(f"Measured in another run than the sections above: {source['timestamp']}, against django-cogworker "
            f"{source['git']}, on {source['machine']}: `python bench/run.py {' '.join(source['argv'])}`.")
    else:
        m = res["machine"]
        idle = f", cpuidle driver {m['cpuidle_driver'] or 'none'}" if "cpuidle_driver" in m else ""
        add(f"On {m['nproc']} CPUs ({m['cpu_model']}{idle}); alone: `python bench/run.py --sections {section}`.")


def outbox_section(add: Any, res: dict[str, Any]) -> None:
    """bench/outbox.py: a push inside a PostgreSQL transaction, OUTBOX off and on; the relay's jobs/s."""
    box = res["outbox"]
    add("## The transactional outbox")
    add("")
    measured_where(add, res, box.get("from_run"), "outbox")
    load = (box.get("from_run") or {}).get("load") or [res["meta"].get("loadavg_start"), res["meta"].get("loadavg_end")]
    add(f"PostgreSQL {box['postgres']} on the same machine (its defaults: `synchronous_commit` on, so each commit "
        f"waits for its flush to disk). **The machine was shared**: other work ran tests on its 2 CPUs meanwhile "
        f"(load average {load[0]} at the start, {load[1]} at the end), so these figures are noisier than the "
        "rest of the page; compare the ways within the table.")
    add("")
    add("From one thread, each transaction saves an order (one INSERT) and pushes: *single*, one "
        "`perform_async` per transaction; *bulk*, one `perform_bulk` of 1,000 jobs per transaction. *Off*: the "
        "push waits for the commit, then one PUSH. *On* (`OUTBOX = True`): an INSERT of the push's row (one "
        "row per push, a bulk's payloads in it) in the transaction; at commit the PUSH (each job with its mark), "
        "then a DELETE of the row (its commit not waiting for its flush). Each costs two round trips to "
        "PostgreSQL more than *off*: on a loaded machine a round trip waits for a CPU. *Order only*: "
        "the transaction without the push. Time per job, the median of "
        f"{box['reps']} rounds taken in turn; *push's own*: the time over *order only*.")
    add("")
    rows = []
    for kind, label in (("single", "single, one job per transaction"), ("bulk", "bulk, 1,000 jobs per transaction")):
        d = box[kind]
        off_own, on_own = d["off"] - d["empty"], d["on"] - d["empty"]
        rows.append([f"{label} ({d['jobs']:,} jobs)", d["empty"], d["off"], d["on"], f"{d['ratio']:.2f}×",
                     off_own, on_own, f"{on_own / off_own:.2f}×" if off_own > 0 else "–"])
    add(table(["how", "order only µs/job", "off µs/job", "on µs/job", "on/off", "push's own off µs",
               "push's own on µs", "on/off (push's own)"], rows))
    add("")
    relay = box["relay"]
    add(f"**Relay**: a backlog of {relay['backlog']:,} rows of one job each (what commits that found Redis "
        "away leave) emptied by one relay (its rounds: 500 rows, "
        f"`SELECT ... FOR UPDATE SKIP LOCKED`, one PUSH, one DELETE, one commit) at **{fmt(relay['jobs_per_s'])} "
        f"jobs/s** (median; range {fmt(relay['min_jobs_per_s'])}–{fmt(relay['max_jobs_per_s'])}).")
    add("")


def batches_section(add: Any, res: dict[str, Any]) -> None:
    """bench/batches.py: the same jobs plain, in one batch, in a chord; and the callback's delay."""
    bat = res["batches"]
    rows = bat["variants"]
    over = bat["overhead_pct"]
    add("## Batches: what a batch adds per job")
    add("")
    measured_where(add, res, bat.get("from_run"), "batches")
    add("")
    add(f"{bat['n']:,} no-op jobs (one `INCR bench:done`, `bench.BatchMember`) pushed, then drained by "
        f"{bat['worker']}, three ways: *plain* (`perform_bulk`, 1,000 per call), *batch* (the same calls inside "
        "one `Batch(...).jobs()` block, with a success callback) and *chord* (`chord(group(*[BatchMember.s(n) "
        "...]), BatchCallback.s())`: the group's jobs pushed 1,000 per call too). Each way ran "
        f"{bat['reps']} time(s), in turn; the figures are medians, with the range of jobs/s (a drain this short, "
        "under a second, moves by a fifth from one run to the next even on a quiet machine). Drain figures as "
        "in the drain table (from the first job done to the last, start-up left out); *+%* is the cost per job "
        "over plain's (for jobs/s: plain's ÷ this − 1). *Callback delay*: from the end of the last member job "
        "(the one whose INCR brought the counter to N stamps its time) to the start of the callback (its first "
        "act), median and max of the runs; the callback ran exactly once in every run (checked).")
    add("")
    table_rows = []
    for how, d in rows.items():
        o = over.get(how, {})
        pct = lambda field, o=o: f"+{o[field]:.0f}%" if field in o else "–"  # noqa: E731
        spread = [r["jobs_per_s"] for r in d["runs"]]
        table_rows.append([how, f"{fmt(d['jobs_per_s'])} ({fmt(min(spread))}–{fmt(max(spread))})", pct("jobs_per_s"),
                           d["worker_cpu_us_per_job"],
                           pct("worker_cpu_us_per_job"), d["redis_commands_per_job"], pct("redis_commands_per_job"),
                           d["redis_round_trips_per_job"], d["redis_cpu_us_per_job"],
                           f"{fmt(d['callback_delay_ms'])} ({fmt(d['callback_delay_ms_max'])})"
                           if "callback_delay_ms" in d else "–"])
    add(table(["way", "jobs/s (range)", "+%", "worker CPU µs/job", "+%", "Redis cmds/job", "+%", "round trips/job",
               "Redis CPU µs/job", "callback delay ms (max)"], table_rows))
    add("")
    add("Where a job of a batch costs more: its batch step waits in memory with its ack, and before each "
        "fetch the worker's fetcher runs the steps held, one `BATCH_SUCCEED` script per batch (five Redis "
        "commands while nothing of the batch fails; about ten jobs per call here), in one round trip more "
        "per fetch; the acks then ride on the fetch as a plain job's do (engine/settle/settling.py). The push "
        "adds one `BATCH_ADD` per 1,000 jobs.")
    add("")
    base = bat.get("baseline")
    if base:
        add(f"Before and after: each drain was run again at once by the worker of `{base['rev']}` (its "
            "django_cogworker; the same push), in the same run; medians, *+%* over that worker's plain drain:")
        add("")

        def pair(field: str, how: str, pct: bool = False) -> str:
            cells = []
            for res in (base, bat):
                d, o = res["variants"][how], res["overhead_pct"].get(how, {})
                if field not in d:
                    return "–"
                cells.append(fmt(d[field]) + (f" (+{o[field]:.0f}%)" if pct and field in o else ""))
            return " → ".join(cells)

        add(table(["way", "jobs/s", "worker CPU µs/job", "Redis cmds/job", "round trips/job", "callback delay ms"],
                  [[how, pair("jobs_per_s", how, True), pair("worker_cpu_us_per_job", how, True),
                    pair("redis_commands_per_job", how, True), pair("redis_round_trips_per_job", how),
                    pair("callback_delay_ms", how)] for how in rows]))
        add("")
    add("The push, in the bench's process (one thread), before the worker starts:")
    add("")
    add(table(["way", "push jobs/s", "pusher CPU µs/job", "Redis cmds/job", "round trips/job"],
              [[how, d["push_jobs_per_s"], d["push_cpu_us_per_job"], d["push_redis_commands_per_job"],
                d["push_round_trips_per_job"]] for how, d in rows.items()]))
    add("")
    add("Commands per job, by command (≥ 0.001 per job), in the drain and in the push (Lua scripts' own "
        "commands counted):")
    add("")
    for how, d in rows.items():
        add(f"- {how}, drain: " + ", ".join(f"{k} {fmt(x)}" for k, x in d["commands_per_job"].items()))
        add(f"- {how}, push: " + ", ".join(f"{k} {fmt(x)}" for k, x in d["push_commands_per_job"].items()))
    add("")
    runs = {f"{how} run {i + 1}": r for how, d in rows.items() for i, r in enumerate(d["runs"])}
    names = {id(r): name for name, r in runs.items()}
    note = other_load(runs, lambda r: names[id(r)])
    if note:
        add(note)
        add("")


def limits_section(add: Any, res: dict[str, Any]) -> None:
    """bench/limits.py: the same jobs plain, with a bucket limit and with a concurrency limit."""
    lim = res["limits"]
    rows = lim["variants"]
    added = lim["added_per_job"]
    add("## Limits: what a limiter costs per job")
    add("")
    measured_where(add, res, lim.get("from_run"), "limits")
    add("")
    add(f"{lim['n']:,} no-op jobs (one `INCR bench:done`) pushed in bulk, then drained by {lim['worker']}, three "
        "ways: *plain* (`bench.NoopIncr`, no limit), *bucket* (`bench.LimitedBucket`: `limits = "
        "[Limiter.bucket(\"bench:bucket\", 10**9, per=1)]`, one `LIMIT_TAKE` script before each run) and "
        "*concurrent* (`bench.LimitedConcurrent`: `limits = [Limiter.concurrent(\"bench:concurrent\", 1000)]`, "
        "a `LIMIT_TAKE` before and a `LIMIT_RELEASE` after each run). Neither limit ever refuses (checked after "
        "every drain: `granted` is N, `over` 0, and no place is left held), so the difference is the price of "
        "taking a place, not of waiting for one. Each way ran "
        f"{lim['reps']} time(s), in turn; the figures are medians, with the range of jobs/s; *added* is the "
        "median's difference from plain's. Drain figures as in the drain table.")
    add("")
    table_rows = []
    for how, d in rows.items():
        a = added.get(how, {})
        plus = lambda field, a=a: f"+{fmt(a[field])}" if field in a else "–"  # noqa: E731
        spread = [r["jobs_per_s"] for r in d["runs"]]
        table_rows.append([how, f"{fmt(d['jobs_per_s'])} ({fmt(min(spread))}–{fmt(max(spread))})",
                           d["worker_cpu_us_per_job"], plus("worker_cpu_us_per_job"),
                           d["redis_commands_per_job"], plus("redis_commands_per_job"),
                           d["redis_round_trips_per_job"], plus("redis_round_trips_per_job"),
                           d["redis_cpu_us_per_job"], plus("redis_cpu_us_per_job")])
    add(table(["way", "jobs/s (range)", "worker CPU µs/job", "added", "Redis cmds/job", "added", "round trips/job",
               "added", "Redis CPU µs/job", "added"], table_rows))
    add("")
    add("A take is one round trip of the processor thread, before the job starts (the fetch's acks don't carry "
        "it: the job may not run); a concurrency limit's release is a second, after it ends. On a no-op job the "
        "round trip is most of the cost: the thread blocks on its socket, hands over the GIL and is woken again. "
        "Inside Redis a bucket's take runs five commands (`TIME`, `HMGET`, `HSET`, `PEXPIRE`, `HINCRBY`) in its "
        "script; a concurrency limit's take eight (`TIME`, `ZREM` and `HDEL` of its jid from the line of "
        "waiting jobs, `ZREMRANGEBYSCORE`, `ZSCORE`, `ZCARD`, `ZADD`, `HINCRBY`) and its release five "
        "(`TIME`, `ZREM`, `HGET`, `HSET`, and `ZPOPMIN` for the first job waiting in line, none here); each "
        "script call counts as one "
        "command more (`EVALSHA`). A job that calls a rate-limited API "
        "spends milliseconds there: the limiter's share of it is the *added* column.")
    add("")
    other = {how: statistics.median(r.get("other_cpu_cores", 0.0) for r in d["runs"]) for how, d in rows.items()}
    if any(x >= 0.15 for x in other.values()):
        add("Other load on the machine during these drains (CPU cores busy outside the worker, Redis and the "
            "bench, median of each way's runs; the CPU figures are less trustworthy for it, the command counts "
            "are not): " + ", ".join(f"{how} {fmt(x)}" for how, x in other.items()) + ".")
        add("")

def chart(res: dict[str, Any], path: Path) -> bool:
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


def render(res: dict[str, Any], png: bool) -> str:
    meta, m, v = res["meta"], res["machine"], res["versions"]
    drains = res.get("drain", {})
    ref = drains.get(REFERENCE, {}).get("jobs_per_s")
    # (Results before the cpuidle driver was recorded lack the key: nothing is said of it then.)
    idle = (f", cpuidle driver {m['cpuidle_driver'] or 'none'}" if "cpuidle_driver" in m else "")
    machine = (f"{m['nproc']} CPUs ({m['cpu_model']}{idle}), {m['ram_gb']} GB RAM, {m['os']}, "
               f"kernel {m['kernel']}")
    L: list[str] = []
    add = L.append
    add("# Benchmarks")
    add("")
    merged = sorted({m["timestamp"] for m in res.get("merged", {}).values()})
    add(f"<!-- Generated by bench/report.py from bench/results/{meta['timestamp']}.json"
        + "".join(f" and {t}.json" for t in merged)
        + "; run `make bench` to redo it, don't edit by hand. -->")
    add("")
    add(f"One run of `bench/run.py` ({meta['mode']} mode, {meta.get('duration_s', 0) / 60:.0f} min), "
        f"{meta['timestamp']}, on **{machine}**, against django-cogworker {v.get('git', '')}. "
        "All systems ran one after the other on this machine, against the same private `redis-server`, "
        "with the same job. **Absolute figures hold for this machine only; compare systems through "
        "their ratios, which hold within this run.** The machine has few cores: Redis, the worker and "
        "(in the latency test) the pusher share them, which is a fair load but not a fast one.")
    add("")
    add("Run it: `make bench` (default: N = 100,000, about 20 minutes), `make bench BENCH_ARGS=--full` "
        "(adds the 1,000,000-job memory run), `python3 bench/run.py --n 20000` (smaller), "
        "`python3 bench/run.py --quick --out /tmp/b.json` (seconds; what the test-suite runs), "
        "`python3 bench/run.py --sections batches` (some sections only: `bench/report.py` merges them in). "
        "The runner makes `bench/.venv` with the peers, starts its own `redis-server` on a free port "
        "(`--save \"\" --appendonly no`), and writes `bench/results/<timestamp>.json`, "
        "`bench/results/latest.json`, this page and `docs/benchmarks.png`.")
    add("")

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

    if res.get("real_jobs", {}).get("drain"):
        real_jobs_section(add, res["real_jobs"])
    if "wakeups" in res or "wakeups" in res.get("skipped", {}):
        wakeups_section(add, res)
    if res.get("batches", {}).get("variants"):
        batches_section(add, res)
    if res.get("limits", {}).get("variants"):
        limits_section(add, res)
    if res.get("outbox", {}).get("single"):
        outbox_section(add, res)

    lat = res.get("latency", {})
    if lat:
        add("## Latency: push to start")
        add("")
        add("Each job records `time.time() - t`, `t` being taken just before the push (one job at a time, "
            "through each library's ordinary one-job call). *Idle*: a trickle (at most 50/s, and at most a "
            "tenth of that system's drain rate). *Loaded*: pushed for a few seconds at half the drain rate "
            "measured above — or as fast as one Python thread could push, when that was less (the rate "
            "column says what was reached).")
        add("")
        rows = []
        for d in lat.values():
            i, ld = d["idle"], d["loaded"]
            rows.append([d["label"], i["p50_ms"], i["p99_ms"], i["jobs"], ld["rate_per_s"], ld["p50_ms"],
                         ld["p99_ms"], ld["jobs"]])
        add(table(["system", "idle p50 ms", "idle p99 ms", "idle jobs", "loaded rate /s", "loaded p50 ms",
                   "loaded p99 ms", "loaded jobs"], rows))
        add("")

    enq = res.get("enqueue", {})
    if enq:
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
        rows = [[d["label"], d["jobs"], d["jobs_per_s"],
                 f"{fmt(d['min_jobs_per_s'])}–{fmt(d['max_jobs_per_s'])}" if "min_jobs_per_s" in d else "–",
                 f"{d['jobs_per_s'] / bare:.2f}×" if bare and "bulk" not in k else "–"] for k, d in enq.items()]
        add(table(["how", "jobs", "jobs/s (median)", "range", "vs bare LPUSH loop"], rows))
        add("")

    sched = res.get("scheduled", {})
    if sched:
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

    idle = res.get("idle", {})
    if idle:
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

    mem = res.get("memory", {})
    if mem:
        add("## Memory")
        add("")
        add("Resident set size of one cogworker process (`runcogworker -c 10`, reliable fetch, the bench "
            "project: Django with admin, auth, sessions, messages and cogworker loaded).")
        add("")
        rows = []
        for k, x in mem.items():
            what = ("idle, after start-up" if k.endswith("idle_mb") else
                    f"after draining {int(k.split('_')[2]):,} jobs")
            rows.append([what, x])
        if "cogworker_after_1000000_mb" not in mem:
            rows.append(["after draining 1,000,000 jobs", "(`--full` only)"])
        add(table(["cogworker process", "RSS MB"], rows))
        add("")

    scale = res.get("scale", {})
    if scale:
        add("## Scale: the poller with many scheduled entries")
        add("")
        add("`Poller.enqueue_due()` called once, in-process, moving the due entries of `schedule` to their "
            "queue, with the set holding many entries not yet due versus only the due ones. Each due entry is "
            "a share of one read (up to 100 due entries, plus the first not yet due) and one script (ZSCORE, LPUSH, "
            "ZREM, SADD).")
        add("")
        rows = [[f"{d['due']:,} due among {d['scheduled_entries']:,}", d["us_per_due_job"],
                 d["poller_cpu_us_per_due_job"], d["redis_commands_per_due_job"], d["redis_round_trips_per_due_job"],
                 d["redis_cpu_us_per_due_job"], d["redis_used_memory_mb"]] for d in scale.values()]
        add(table(["case", "µs per due job", "poller CPU µs", "Redis cmds", "round trips", "Redis CPU µs",
                   "Redis memory MB"], rows))
        add("")

    prof = res.get("profile")
    if prof and prof.get("top_self"):
        add("## Profile of a cogworker drain")
        add("")
        add(f"`{prof['mode']}` of {prof['system']} draining {prof['n']:,} jobs (start-up included): samples "
            "are taken only from the thread holding the GIL, so this is where the worker's Python time "
            f"goes. {prof['samples']:,} samples." + (f" Flame graph: `{prof['svg']}`." if prof.get("svg") else "")
            + " Sampling the GIL holder blurs the frames at a GIL hand-off: a cheap function that runs just "
            "before a socket call (redis-py's `ConnectionPool._checkpid`, 0.14 µs a call) can be over-counted; "
            "read the inclusive column (where the time goes: the job's own redis-py call, the fetch, payload "
            "decoding, Django's connection cleanup) rather than single self frames.")
        add("")
        rows = [[f"`{a['frame']}`", a["pct"], f"`{b['frame']}`", b["pct"]]
                for a, b in zip(prof["top_self"], prof["top_inclusive"], strict=False)]
        add(table(["top frames (self)", "%", "top frames (inclusive)", "%"], rows, "lrlr"))
        add("")
        if prof.get("stages"):
            stage_table(add, prof)

    add("## Machine and versions")
    add("")
    add(f"- machine: {machine}")
    if meta.get("loadavg_start") is not None:
        add(f"- load average (1 min) at the start of the run {meta['loadavg_start']}, at the end "
            f"{meta.get('loadavg_end', '–')}: anything else running shows here")
    add("- " + ", ".join(f"{k} {x}" for k, x in v.items()))
    add("")
    notes = dict(res.get("skipped", {}))
    if notes or res.get("errors"):
        add("## Skipped and failed")
        add("")
        for k, why in notes.items():
            add(f"- {k}: skipped — {why}")
        for k, why in res.get("errors", {}).items():
            add(f"- {k}: failed — {why}")
        add("")
    add("## Caveats")
    add("")
    add("- Everything that waits for one round trip at a time (enqueue one by one, idle latency) wanders by "
        "up to 2× from one second to the next on this small VM (loopback wake-ups); the drains, which keep "
        "many requests in flight, are steadier. Compare within a run, and repeat a run before trusting a "
        "difference under 20%.")
    add("- A no-op job measures the job system, not jobs: with real work the differences shrink to the "
        "per-job overhead shown here (worker CPU µs and round trips per job).")
    add("- The drain starts with the whole backlog already queued; pushing is measured on its own "
        "(Enqueue). Peers without a bulk push (dramatiq, huey) were filled through their one-job call with "
        "the Redis commands collected on a pipeline; that only shortens the filling, not the drain.")
    add("- Concurrency differs by each system's custom (cogworker 10 and 25 threads, Sidekiq 10, dramatiq, "
        "huey and celery 8, rq one job at a time); every Python worker here is bound by one GIL per process.")
    add("- Reliable fetch (the default) keeps every running job on an in-progress list, so a crash loses "
        "nothing; basic fetch (BRPOP) does not, and costs less. Celery (Redis transport, acks on receipt), "
        "dramatiq and huey each make their own trade; see their documentation.")
    add("")
    return "\n".join(L)


def merge(res: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``res`` with the sections of ``other`` (a run of some sections only) in place of its own; each
    remembers the run it came from (``merged``, and a section's ``from_run``)."""
    own = {"meta", "machine", "versions", "skipped", "errors", "merged"}
    m, machine = other["meta"], other["machine"]
    idle = f", cpuidle driver {machine['cpuidle_driver'] or 'none'}" if "cpuidle_driver" in machine else ""
    source = {"timestamp": m["timestamp"], "git": other["versions"].get("git", "?"),
              "machine": f"{machine['nproc']} CPUs ({machine['cpu_model']}{idle})", "argv": m.get("argv", []),
              "load": [m.get("loadavg_start"), m.get("loadavg_end")]}
    out = {**res, "merged": dict(res.get("merged", {})), "skipped": dict(res.get("skipped", {})),
           "errors": dict(res.get("errors", {}))}
    for section, value in other.items():
        if section in own:
            continue
        out[section] = {**value, "from_run": source} if isinstance(value, dict) else value
        out["merged"][section] = source
    out["skipped"].update(other.get("skipped", {}))
    out["errors"].update(other.get("errors", {}))
    return out


def write(res: dict[str, Any], doc: Path = DOC, png: Path = PNG) -> None:
    has_png = chart(res, png)
    if not has_png and res.get("merged") and png.exists():
        has_png = True  # (the drains, which it shows, are the first file's: the chart on disk is theirs)
        print(f"kept {png}: matplotlib is not installed here to redraw it", file=sys.stderr)
    doc.write_text(render(res, has_png))
    print(f"wrote {doc}" + (f" and {png}" if has_png else " (no chart: matplotlib is not installed here)"),
          file=sys.stderr)


if __name__ == "__main__":
    sources = [Path(a) for a in sys.argv[1:]] or [BENCH / "results" / "latest.json"]
    results = json.loads(sources[0].read_text())
    for extra in sources[1:]:
        results = merge(results, json.loads(extra.read_text()))
    write(results)
