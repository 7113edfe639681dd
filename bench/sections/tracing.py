"""Tracing's cost: no-op jobs pushed and run with OpenTelemetry's SDK on (its spans made, recorded,
ended and dropped by the one span processor: benchproject/dropped_spans.py) against TRACING off
(issue 46 point 1).

Two measures, each way ``reps`` times, in turn (off, on, off, ...: a drift in the machine's load
falls on both), medians kept:

* **push**: ``NoopIncr.perform_async`` one at a time in a fresh Python process (its own Django on
  the bench's settings and Redis, ``BENCH_TRACING`` naming the way), ``tracing_pushes`` of them: a
  PRODUCER span and its context injected into each payload;
* **run**: ``tracing_n`` no-op jobs pushed in bulk, in a process traced the same way (on: each
  payload carries its push's ``traceparent``, so each run extracts it, is that span's child and
  links to it, as a job a traced request pushed does), drained by ``runcogworker -c 10 --processes
  2`` (``Bench.drain``): a CONSUMER span around each run.

    python bench/run.py --sections tracing --no-venv     # this section alone (the venv with opentelemetry-sdk)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import harness
from environment import log
from markdown import Page, fmt, measured_where, table
from session import BENCH, ROOT, Bench
from systems import Cogworker, Ctx

NAME = "tracing"
QUICK = False  # (needs opentelemetry-sdk in the interpreter: the dev venv has it, bench/.venv may not)
PARAMS = {"tracing_n": (300, 10_000), "tracing_reps": (1, 3), "tracing_pushes": (300, 20_000)}
# off; on (the feature, the SDK recording every span); bare (TRACING off, one span per run with no
# attribute, context or link, made by a server middleware: what the SDK alone costs, the floor).
WAYS = ("off", "on", "bare")
MEDIANS = ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job")

# One way's pushes, timed in a process of its own (the tracer provider is set once per process).
_PUSHES = """
import json, sys, time
import django
django.setup()
from benchproject.jobs import NoopIncr
n = int(sys.argv[1])
NoopIncr.perform_async(0.0)
t = time.perf_counter()
for _ in range(n):
    NoopIncr.perform_async(0.0)
print(json.dumps({"pushes_per_s": n / (time.perf_counter() - t)}))
"""

# One way's drain, pushed in bulk in a process of its own traced the same way (chunks of 1,000 a
# perform_bulk, as Cogworker.push_bulk's): pushed by the bench itself, the "on" runs had no context
# to read and skipped the extract and the link a traced job's run pays.
_BULK = """
import sys, time
import django
django.setup()
from benchproject.jobs import NoopIncr
n = int(sys.argv[1])
for start in range(0, n, 1000):
    NoopIncr.perform_bulk([(time.time(),)] * min(1000, n - start))
"""


class Way(Cogworker):
    """The bench's cogworker system (reliable, -c 10, --processes 2), tracing on (the SDK) or off."""

    def __init__(self, how: str):
        super().__init__("reliable", 10, processes=2)
        self.how = how
        self.key = f"tracing-{how}"
        self.label = f"tracing {how}: {self.label}"

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None, **kwargs: Any) -> Any:
        return super().start(ctx, tag, extra_env={**(extra_env or {}), **env_of(self.how)}, **kwargs)

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "") -> None:
        subprocess.run([sys.executable, "-c", _BULK, str(n)], env=push_env(self.how), check=True, timeout=600)


def env_of(how: str) -> dict[str, str]:
    return {"BENCH_TRACING": {"on": "1", "bare": "bare"}.get(how, "0")}


def push_env(how: str) -> dict[str, str]:
    """A pushing process's environment: the bench's settings and Redis, traced ``how``."""
    return {**os.environ, **env_of(how), "DJANGO_SETTINGS_MODULE": "benchproject.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH)])}


def pushes(bench: Bench, how: str, n: int) -> float:
    """perform_async per second, one at a time, in a fresh process traced ``how``."""
    done = subprocess.run([sys.executable, "-c", _PUSHES, str(n)], env=push_env(how), capture_output=True,
                          text=True, check=True, timeout=600)
    bench.reset_redis()
    return float(json.loads(done.stdout.strip().splitlines()[-1])["pushes_per_s"])


def run(bench: Bench) -> dict[str, Any]:
    n, reps, pushed = bench.p["tracing_n"], bench.p["tracing_reps"], bench.p["tracing_pushes"]
    runs: dict[str, list[dict[str, Any]]] = {how: [] for how in WAYS}
    rates: dict[str, list[float]] = {how: [] for how in WAYS}
    for rep in range(reps):
        for how in WAYS:
            rates[how].append(pushes(bench, how, pushed))
            res = bench.drain(Way(how), n, latency=False, idle=False)
            runs[how].append(res)
            log(f"tracing {how} (run {rep + 1} of {reps}): {rates[how][-1]:,.0f} pushes/s, "
                f"{res['jobs_per_s']:,} jobs/s, {res['worker_cpu_us_per_job']} µs CPU/job")
    out: dict[str, Any] = {"ways": {}}
    for how in WAYS:  # (each run's pushes/s beside its drain's figures)
        with_rates = [{**r, "pushes_per_s": harness.rnd(p)} for r, p in zip(runs[how], rates[how], strict=True)]
        out["ways"][how] = harness.median_row(with_rates, (*MEDIANS, "pushes_per_s"))
    off, on = out["ways"]["off"], out["ways"]["on"]
    out["fewer_jobs_per_s_pct"] = harness.fewer_pct(off["jobs_per_s"], on["jobs_per_s"])
    out["fewer_pushes_per_s_pct"] = harness.fewer_pct(off["pushes_per_s"], on["pushes_per_s"])
    out["bare_fewer_jobs_per_s_pct"] = harness.fewer_pct(off["jobs_per_s"], out["ways"]["bare"]["jobs_per_s"])
    out.update(n=n, reps=reps, pushes=pushed, worker=Way("off").worker_desc)
    return out


def report(res: dict[str, Any]) -> str:
    """The same no-op jobs pushed and run with tracing off and on."""
    tr = res.get("tracing", {})
    if not tr.get("ways"):
        return ""
    page = Page()
    add = page.add
    add("## Tracing: what a span per push and per run costs")
    add("")
    measured_where(add, res, "tracing")
    add("")
    add(f"No-op jobs (`bench.NoopIncr`) with `TRACING` off and on, OpenTelemetry's SDK installed with one span "
        "processor that drops every span (made, recorded and ended: the cost to the job system, not an "
        f"exporter's). Push: {tr['pushes']:,} `perform_async` one at a time in a process of their own (a "
        f"PRODUCER span each, its context in the payload). Run: {tr['n']:,} pushed in bulk by a process traced "
        "the same way (on: each payload carries its push's `traceparent`), then drained by "
        f"{tr['worker']} (a CONSUMER span each, the child of its producer and linked to it). "
        f"{tr['reps']} time(s) each way, in turn; medians, with the "
        "range of jobs/s (docs/observability.md#traces).")
    add("")
    rows = []
    for how, d in tr["ways"].items():
        spread = [r["jobs_per_s"] for r in d["runs"]]
        rows.append([how, fmt(d["pushes_per_s"]), f"{fmt(d['jobs_per_s'])} ({fmt(min(spread))}–{fmt(max(spread))})",
                     d["worker_cpu_us_per_job"], d["redis_commands_per_job"], d["redis_round_trips_per_job"]])
    add(table(["tracing", "pushes/s", "jobs/s run (range)", "worker CPU µs/job", "Redis cmds/job",
               "round trips/job"], rows))
    add("")
    add(f"On: {fmt(tr['fewer_pushes_per_s_pct'])}% fewer pushes/s and {fmt(tr['fewer_jobs_per_s_pct'])}% fewer "
        "jobs/s run than off (issue 46's goal: 10% at most).")
    if "bare_fewer_jobs_per_s_pct" in tr:
        add("")
        add(f"*bare*: `TRACING` off and one span per run made by a server middleware with the same SDK "
            "(`benchproject.dropped_spans.BareSpan`: started and ended around the run; no attribute, no context "
            "read, linked or made current; its pushes untraced): what the SDK's span alone costs a worker, "
            f"{fmt(tr['bare_fewer_jobs_per_s_pct'])}% fewer jobs/s than off, the floor under any tracing of a "
            "run that records its spans.")
    add("")
    return page.text()
