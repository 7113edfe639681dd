"""Limiters in the drain: what a job's ``limits`` cost it (issue 26).

N no-op jobs (one INCR of the counter, as ``NoopIncr``) are pushed in bulk, then drained by
``runcogworker -c 10 --processes 2`` through ``Bench.drain`` (session.py), as the bench's other drains
are: figures from the first job done to the last. Three ways, each a job class of
benchproject/jobs.py:

* plain: ``NoopIncr``, no limit (the reference);
* bucket: ``LimitedBucket``, a ``Limiter.bucket`` of a billion starts a second: a take before each
  run (the fetch's jobs in one LIMIT_TAKE_MANY), never refused;
* concurrent: ``LimitedConcurrent``, a ``Limiter.concurrent`` of 1,000 places (the drain runs 20
  jobs at once at most): a take before and a release after each run (each riding one call per
  fetch: LIMIT_TAKE_MANY, LIMIT_RELEASE_MANY), never refused.

So the differences against plain are a take's cost, and a take's and a release's. That no job was
refused is checked after each drain (the limiter's ``over`` count is 0, ``granted`` is N), and, for
the concurrency limit, that every place was given back (no holder left).

Each way runs ``reps`` times, in turn (plain, bucket, concurrent, plain, ...: a drift in the
machine's load falls on all three); each figure is the median of its runs, and the added cost per
job is that of the medians: worker CPU µs, Redis commands and round trips, Redis CPU µs.

    python bench/run.py --sections limits --no-venv                  # this section alone (2-3 minutes)
    python bench/run.py --sections limits --no-venv --limits-n 2000 --limits-reps 1
    python bench/run.py --sections limits --no-venv --baseline HEAD~1   # before and after, in one run
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, measured_where, table
from session import Bench
from systems import Cogworker, Ctx

NAME = "limits"
QUICK = True
# (quick, default): jobs per drain, drains of each way (--limits-n, --limits-reps).
PARAMS = {"limits_n": (300, 10_000), "limits_reps": (1, 3)}

# Way -> (job class in benchproject/jobs.py, its limiter's attribute there, or "").
VARIANTS = {"plain": ("NoopIncr", ""), "bucket": ("LimitedBucket", "BUCKET_LIMIT"),
            "concurrent": ("LimitedConcurrent", "CONCURRENT_LIMIT")}
# Figures of each run whose median is kept.
MEDIANS = ("jobs_per_s", "worker_cpu_us_per_job", "worker_cpu_cores", "redis_commands_per_job",
           "redis_round_trips_per_job", "redis_cpu_us_per_job")
# What a limit adds per job, against plain: the figures that grow with a job's cost.
ADDED = ("worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job", "redis_cpu_us_per_job")


class Variant(Cogworker):
    """The bench's cogworker system (reliable, -c 10, --processes 2), pushing one of VARIANTS' jobs."""

    def __init__(self, how: str, env: dict[str, str] | None = None, rev: str = ""):
        super().__init__("reliable", 10, processes=2)
        self.how = how
        self.env = env or {}  # (the worker's: a --baseline revision's package)
        self.key = f"limits-{how}"
        self.label = f"{how}{f' (worker of {rev})' if rev else ''}: {self.label}"

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None,
              wrap: Any = ()) -> list:
        return super().start(ctx, tag, {**self.env, **(extra_env or {})}, wrap)

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "") -> None:
        super().push_bulk(ctx, n, VARIANTS[self.how][0])


def limiter_check(r: Any, how: str, n: int, timeout: float = 5.0) -> dict[str, Any]:
    """The limiter's counts after a drain of ``n`` jobs: every job granted a place, none refused,
    and (concurrent) every place given back within ``timeout`` s; else RuntimeError."""
    attr = VARIANTS[how][1]
    if not attr:
        return {}
    from benchproject import jobs

    from django_cogworker.broker.keys import for_config
    from django_cogworker.push import runtime

    limiter = getattr(jobs, attr)
    keys = for_config(runtime.get_config()).limit(limiter.name)
    deadline = time.monotonic() + timeout
    while how == "concurrent" and r.zcard(keys.holders) and time.monotonic() < deadline:
        time.sleep(0.01)  # (the last runs give their places back just after their INCR)
    stats = {k.decode(): v.decode() for k, v in r.hgetall(keys.stats).items()}
    granted, over, held = int(stats.get("granted", 0)), int(stats.get("over", 0)), r.zcard(keys.holders)
    if granted != n or over or held:
        raise RuntimeError(f"limits {how}: granted {granted} of {n}, refused {over}, places still held {held}")
    return {"limit_granted": granted, "limit_over": over}


def run(bench: Bench) -> dict[str, Any]:
    """The section: each of VARIANTS drained ``reps`` times, in turn (and by the --baseline
    revision's worker after each, when given); medians and added costs."""
    n, reps = bench.p["limits_n"], bench.p["limits_reps"]
    workers: list[tuple[str, dict[str, str]]] = [("", {})]
    if bench.args.baseline:
        workers.append(bench.baseline_env())
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(rev, how): [] for rev, _env in workers for how in VARIANTS}
    for rep in range(reps):
        for how in VARIANTS:
            for rev, env in workers:
                system = Variant(how, env, rev)
                res = bench.drain(system, n, latency=False, idle=False,
                                  then=lambda _workers, how=how: limiter_check(bench.r, how, n))
                runs[rev, how].append(res)
                log(f"limits {how}{f' (worker of {rev})' if rev else ''} (run {rep + 1} of {reps}): "
                    f"{res['jobs_per_s']:,} jobs/s, {res['worker_cpu_us_per_job']} µs CPU/job, "
                    f"{res['redis_commands_per_job']} Redis commands/job")
    out = summarise({how: runs["", how] for how in VARIANTS})
    out.update(n=n, reps=reps, worker=Variant("plain").worker_desc)
    if len(workers) > 1:
        rev = workers[1][0]
        out["baseline"] = {"rev": rev, **summarise({how: runs[rev, how] for how in VARIANTS})}
    return out


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """{"variants": medians of each way's runs (and the runs), "added_per_job": against plain's}."""
    rnd = harness.rnd
    out: dict[str, Any] = {"variants": {}}
    for how, done in runs.items():
        row: dict[str, Any] = {k: rnd(statistics.median(r[k] for r in done)) for k in MEDIANS}
        middle = sorted(done, key=lambda r: r["jobs_per_s"])[len(done) // 2]
        row["commands_per_job"] = middle["commands_per_job"]
        row["runs"] = [{k: r[k] for k in MEDIANS} | {"other_cpu_cores": r.get("other_cpu_cores", 0.0)}
                       for r in done]
        out["variants"][how] = row
    plain = out["variants"]["plain"]
    out["added_per_job"] = {how: {k: rnd(row[k] - plain[k]) for k in ADDED}
                            for how, row in out["variants"].items() if how != "plain"}
    # (As the batches section's: % more time per job than plain, from jobs/s.)
    out["overhead_pct"] = {how: {"jobs_per_s": round(100 * (plain["jobs_per_s"] / row["jobs_per_s"] - 1), 1)}
                           for how, row in out["variants"].items() if how != "plain"}
    return out


def report(res: dict[str, Any]) -> str:
    """The same jobs plain, with a bucket limit and with a concurrency limit."""
    if not res.get("limits", {}).get("variants"):
        return ""
    page = Page()
    add = page.add
    lim = res["limits"]
    rows = lim["variants"]
    added = lim["added_per_job"]
    add("## Limits: what a limiter costs per job")
    add("")
    measured_where(add, res, "limits")
    add("")
    add(f"{lim['n']:,} no-op jobs (one `INCR bench:done`) pushed in bulk, then drained by {lim['worker']}, three "
        "ways: *plain* (`bench.NoopIncr`, no limit), *bucket* (`bench.LimitedBucket`: `limits = "
        "[Limiter.bucket(\"bench:bucket\", 10**9, per=1)]`, a take before each run) and "
        "*concurrent* (`bench.LimitedConcurrent`: `limits = [Limiter.concurrent(\"bench:concurrent\", 1000)]`, "
        "a take before and a release after each run). Neither limit ever refuses (checked after "
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
    add("The takes of the jobs one fetch brings go in one script call from the fetcher thread, right after the "
        "fetch (the limits feature's ``fetched`` hook: `LIMIT_TAKE_MANY`, each limiter key named once, four "
        "arguments a job); a concurrency limit's release waits with the job's ack and rides the next fetch's "
        "pipeline, every release held in one `LIMIT_RELEASE_MANY`: a limited job costs no round trip of its own, "
        "only its share of one per fetch (*round trips/job*). What is left is CPU: the worker's (that take's "
        "round trip, the token, the Ticket and the release step; `bench/tools/limit_stages.py` times each) and "
        "Redis's, running the scripts; on 2 CPUs both come out of the jobs' time. "
        "Inside Redis a call reads and writes each limiter key once for all its jobs (a bucket's state read once "
        "and written once a call); a concurrency limit's take still runs `ZREM` and `HDEL` of its jid from the "
        "line of waiting jobs, `ZSCORE` and `ZADD`, its release `ZREM` (and `ZPOPMIN` until the line is found "
        "empty); each script call counts as one "
        "command more (`EVALSHA`). A job that calls a rate-limited API "
        "spends milliseconds there: the limiter's share of it is the *added* column.")
    add("")
    other = {how: statistics.median(r.get("other_cpu_cores", 0.0) for r in d["runs"]) for how, d in rows.items()}
    if any(x >= 0.15 for x in other.values()):
        add("Other load on the machine during these drains (CPU cores busy outside the worker, Redis and the "
            "bench, median of each way's runs; the CPU figures are less trustworthy for it, the command counts "
            "are not): " + ", ".join(f"{how} {fmt(x)}" for how, x in other.items()) + ".")
        add("")
    return page.text()
