"""Batches in the drain: what a batch adds per job, and how soon its callback runs (issue 25).

N no-op jobs (``benchproject.jobs.BatchMember``: one INCR of the counter, like ``NoopIncr``) are
pushed, then drained by ``runcogworker -c 10 --processes 2`` through ``Bench.drain`` (session.py), as
the bench's other drains are: figures from the first job done to the last. Three ways:

* plain: ``perform_bulk``, 1,000 jobs per call, no batch (the reference);
* batch: the same calls inside one ``Batch(...).jobs()`` block, with a success callback;
* chord: ``chord(group(*[BatchMember.s(n) for ...]), BatchCallback.s())`` (a group pushes its
  single jobs 1,000 per call, as perform_bulk does).

The push is measured apart, in this process: jobs/s, its CPU per job, Redis commands and round
trips per job. The callback's delay: the member that brings the counter to N (its INCR is its
last act) stamps its end; the callback stamps its start first thing; both are ``time.time()`` on
this one machine. The callback also counts its runs: more than one is an error in the results.

Each way runs ``reps`` times, in turn (plain, batch, chord, plain, ...: a drift in the machine's
load falls on all three); each figure is the median of its runs, and the overheads are those of
the medians: time per job (plain's jobs/s ÷ the variant's − 1), worker CPU per job, Redis
commands and round trips per job. With ``--baseline REV`` each drain is run again at once by the
worker of REV (its django_cogworker; the push is this tree's), so a change is measured before and
after in the same run.

    python bench/run.py --sections batches --no-venv    # this section alone (about 2 minutes)
    python bench/run.py --sections batches --no-venv --batches-n 2000 --batches-reps 1
    python bench/run.py --sections batches --no-venv --baseline HEAD~1   # before and after
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, measured_where, other_load, table
from session import Bench
from systems import CHUNK, Cogworker, Ctx

NAME = "batches"
QUICK = True
# (quick, default): jobs per drain, drains of each way (--batches-n, --batches-reps).
PARAMS = {"batches_n": (300, 10_000), "batches_reps": (1, 3)}
VARIANTS = ("plain", "batch", "chord")
# Figures of each run whose median is kept (the rest of a run is kept as it was, in "runs").
MEDIANS = ("jobs_per_s", "worker_cpu_us_per_job", "worker_cpu_cores", "redis_commands_per_job",
           "redis_round_trips_per_job", "redis_cpu_us_per_job", "push_jobs_per_s", "push_cpu_us_per_job",
           "push_redis_commands_per_job", "push_round_trips_per_job", "callback_delay_ms")
# Overheads against plain: (figure, how it grows with the cost per job).
OVERHEADS = (("jobs_per_s", "inverse"), ("worker_cpu_us_per_job", "direct"),
             ("redis_commands_per_job", "direct"), ("redis_round_trips_per_job", "direct"))


def push(how: str, n: int) -> None:
    """Push ``n`` BatchMember jobs ``how`` (one of VARIANTS), in this process."""
    from benchproject.jobs import BatchCallback, BatchMember

    from django_cogworker import Batch, chord, group

    if how == "chord":
        chord(group(*[BatchMember.s(n) for _ in range(n)]), BatchCallback.s()).perform_async("bench chord")
        return

    def bulk() -> None:
        for start in range(0, n, CHUNK):
            BatchMember.perform_bulk([(n,)] * min(CHUNK, n - start))

    if how == "plain":
        bulk()
        return
    batch = Batch("bench batch").on("success", BatchCallback)
    with batch.jobs():
        bulk()


class Variant(Cogworker):
    """The bench's cogworker system (reliable, -c 10, --processes 2), pushing one of VARIANTS; its
    push measures itself (Bench.drain resets Redis's counters after the push)."""

    def __init__(self, how: str, env: dict[str, str] | None = None, rev: str = ""):
        super().__init__("reliable", 10, processes=2)
        self.how = how
        self.env = env or {}  # (the worker's: a --baseline revision's package)
        self.key = f"batches-{how}"
        self.label = f"{how}{f' (worker of {rev})' if rev else ''}: {self.label}"
        self.pushed: dict[str, Any] = {}

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None,
              wrap: Any = ()) -> list:
        return super().start(ctx, tag, {**self.env, **(extra_env or {})}, wrap)

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "") -> None:
        a, cpu, t = harness.snap(ctx.r), time.process_time(), time.perf_counter()
        push(self.how, n)
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        d = harness.delta(a, harness.snap(ctx.r))
        rnd = harness.rnd
        self.pushed = {"push_seconds": rnd(seconds), "push_jobs_per_s": rnd(n / seconds),
                       "push_cpu_us_per_job": rnd(cpu / n * 1e6), "push_redis_commands_per_job": rnd(d.commands / n),
                       "push_round_trips_per_job": rnd(d.round_trips / n),
                       "push_commands_per_job": {k: rnd(v / n) for k, v in
                                                 sorted(d.by_command.items(), key=lambda kv: -kv[1])
                                                 if v / n >= 0.001}}


def callback_delay(r: Any, workers: list, how: str, timeout: float, linger: float) -> dict[str, Any]:
    """Wait for the callback's stamp; return the delay from the last member's end, and its runs
    ``linger`` seconds later (a second run would show by then)."""
    from benchproject.jobs import CALLBACK_RUNS, CALLBACK_START, LAST_END

    if how == "plain":
        return {}
    deadline = time.monotonic() + timeout
    while r.get(CALLBACK_START) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{how}: no callback {timeout:.0f}s after the last job")
        if not all(w.alive() for w in workers):
            raise RuntimeError(f"{how}: the worker exited before the callback ran")
        time.sleep(0.002)
    time.sleep(linger)
    start, end, runs = (float(r.get(CALLBACK_START)), float(r.get(LAST_END)), int(r.get(CALLBACK_RUNS) or 0))
    if runs != 1:
        raise RuntimeError(f"{how}: the callback ran {runs} times")
    return {"callback_delay_ms": harness.rnd((start - end) * 1000), "callback_runs": runs}


def run(bench: Bench) -> dict[str, Any]:
    """The section: each of VARIANTS drained ``reps`` times, in turn (and by the --baseline
    revision's worker after each, when given); medians and overheads."""
    n, reps = bench.p["batches_n"], bench.p["batches_reps"]
    workers: list[tuple[str, dict[str, str]]] = [("", {})]
    if bench.args.baseline:
        workers.append(bench.baseline_env())
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(rev, how): [] for rev, _env in workers for how in VARIANTS}
    linger = 0.3 if bench.quick else 1.0
    for rep in range(reps):
        for how in VARIANTS:
            for rev, env in workers:
                system = Variant(how, env, rev)
                res = bench.drain(system, n, latency=False, idle=False,
                                  then=lambda ws, how=how: callback_delay(bench.r, ws, how, 30.0, linger))
                res.update(system.pushed)
                runs[rev, how].append(res)
                log(f"batches {how}{f' (worker of {rev})' if rev else ''} (run {rep + 1} of {reps}): "
                    f"{res['jobs_per_s']:,} jobs/s, {res['worker_cpu_us_per_job']} µs CPU/job, "
                    f"{res['redis_commands_per_job']} Redis commands/job, push {res['push_jobs_per_s']:,} jobs/s"
                    + (f", callback {res['callback_delay_ms']} ms after the last job" if how != "plain" else ""))
    out = summarise({how: runs["", how] for how in VARIANTS})
    out.update(n=n, reps=reps, worker=Variant("plain").worker_desc)
    if len(workers) > 1:
        rev = workers[1][0]
        out["baseline"] = {"rev": rev, **summarise({how: runs[rev, how] for how in VARIANTS})}
    return out


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """{"variants": medians of each way's runs (and the runs), "overhead_pct": against plain's}."""
    out: dict[str, Any] = {"variants": {}}
    for how, done in runs.items():
        row: dict[str, Any] = {k: harness.rnd(statistics.median(r[k] for r in done)) for k in MEDIANS
                               if all(k in r for r in done)}
        if how != "plain":
            row["callback_delay_ms_max"] = max(r["callback_delay_ms"] for r in done)
        middle = sorted(done, key=lambda r: r["jobs_per_s"])[len(done) // 2]
        row["commands_per_job"] = middle["commands_per_job"]
        row["push_commands_per_job"] = middle["push_commands_per_job"]
        row["runs"] = [{k: r[k] for k in MEDIANS if k in r} | {"other_cpu_cores": r.get("other_cpu_cores", 0.0)}
                       for r in done]
        out["variants"][how] = row
    plain = out["variants"]["plain"]
    out["overhead_pct"] = {how: {field: overhead(plain[field], row[field], kind) for field, kind in OVERHEADS}
                           for how, row in out["variants"].items() if how != "plain"}
    return out


def overhead(plain: float, variant: float, kind: str) -> float:
    """% more cost per job than plain: of a rate (``inverse``: jobs/s) or of a cost per job (``direct``)."""
    ratio = plain / variant if kind == "inverse" else variant / plain
    return round(100 * (ratio - 1), 1)


def report(res: dict[str, Any]) -> str:
    """The same jobs plain, in one batch, in a chord; and the callback's delay."""
    if not res.get("batches", {}).get("variants"):
        return ""
    page = Page()
    add = page.add
    bat = res["batches"]
    rows = bat["variants"]
    over = bat["overhead_pct"]
    add("## Batches: what a batch adds per job")
    add("")
    measured_where(add, res, "batches")
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
    add("Where a job of a batch costs more: its batch step waits in memory with its ack, and the worker's "
        "next fetch carries the steps held on its own pipeline, one `BATCH_SUCCEED` script per batch (five "
        "Redis commands while nothing of the batch fails; about ten jobs per call here), ahead of the fetch "
        "script: no round trip of their own. A step must land before its job's ack, so those acks ride the "
        "fetch after (engine/settle/outgoing.py); the few round trips more per job are the fetches a batch's "
        "settling makes (callbacks delivered, a batch that ran down). The push adds one `BATCH_ADD` per 1,000 "
        "jobs. (Issue 34's goal: a job in a batch at 0.95x a plain job's jobs/s or better.)")
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
    return page.text()
