#!/usr/bin/env python3
"""Benchmark django-cogworker against its peers, side by side, in one run on one machine.

    make bench                          # = python3 bench/run.py: the default run (N = 100,000)
    python3 bench/run.py --full         # adds the 1,000,000-job memory run
    python3 bench/run.py --n 20000      # a smaller N
    python3 bench/run.py --quick --out /tmp/b.json   # tiny, cogworker + floor only (the test-suite)
    python3 bench/run.py --sections batches          # some sections only (see --help)

This is the driver: its arguments, the loop over the sections (bench/sections/: one module each,
its run and its report; that package's docstring says how to add one), and where results go. The
shared plumbing: session.py (the run's Redis, Django, drains), harness.py (measurements),
systems.py (how each job system pushes and is started), environment.py (the bench venv, Sidekiq,
the machine), markdown.py (tables); report.py writes the page.

The default and full modes create bench/.venv (the peers: rq, dramatiq, huey, celery; psutil,
matplotlib, py-spy), re-run themselves in it and try `apt-get install ruby-sidekiq` for Sidekiq.
--quick runs with the interpreter it is given, measures cogworker and the bare loop only, writes
only --out, and takes well under a minute. Every run starts its own redis-server on a free port
(no persistence).

Results: only the latest are kept (and committed). A run of every section writes
bench/results/latest.json, removes the files of the sections run alone before it, and writes
docs/benchmarks.md and docs/benchmarks.png from it. A run of some sections (--sections) writes
bench/results/<sections>.json (e.g. batches.json, drain+real_jobs.json), in place of the last
such run; with --out it writes only there (a run to look at, not for the page). Then
`python bench/report.py` puts it into the page: the page is latest.json with every results file
newer than it merged in. Commit bench/results/ as the run leaves it (`git add -A bench/results`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import environment
from environment import log
from sections import RUN, load

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
LATEST = RESULTS / "latest.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="tiny run, cogworker + bare loop only, no peer venv")
    mode.add_argument("--full", action="store_true", help="also the 1,000,000-job memory run")
    p.add_argument("--n", type=int, help="jobs per drain (default 100,000; quick: 300)")
    p.add_argument("--out", type=Path, help="write the JSON here (quick mode, and a run of some sections: only here)")
    p.add_argument("--only", help="comma-separated system keys to drain (e.g. cogworker-reliable-c10,floor); the "
                                  "real-jobs section keeps the listed ones of its systems, wake-ups run anyway")
    p.add_argument("--sections", help=f"comma-separated sections to run, of: {', '.join(RUN)} (default: all; "
                                      "then the results go to bench/results/<sections>.json, not the page)")
    p.add_argument("--batches-n", type=int, help="jobs per drain of the batches section (default 10,000; quick: 300)")
    p.add_argument("--batches-reps", type=int, help="drains of each way in the batches section (default 3; quick: 1)")
    p.add_argument("--limits-n", type=int, help="jobs per drain of the limits section (default 10,000; quick: 300)")
    p.add_argument("--limits-reps", type=int, help="drains of each way in the limits section (default 3; quick: 1)")
    p.add_argument("--fairness-n", type=int, help="jobs per drain of the fairness section (default 20,000; quick: 300)")
    p.add_argument("--fairness-groups", type=int, help="groups the fairness section's grouped drain spreads its jobs "
                                                         "over (default 1,000; quick: 10)")
    p.add_argument("--fairness-reps", type=int, help="drains (and push rounds) of each way in the fairness section "
                                                       "(default 3; quick: 1)")
    p.add_argument("--fairness-fetches", type=int, help="fetches timed per backlog in the fairness section "
                                                          "(default 5,000; quick: 200)")
    p.add_argument("--history-n", type=int, help="jobs per drain of the history section (default 10,000; quick: 300)")
    p.add_argument("--history-reps", type=int, help="drains of each way in the history section (default 3; quick: 1)")
    p.add_argument("--tracing-n", type=int, help="jobs per drain of the tracing section (default 10,000)")
    p.add_argument("--tracing-reps", type=int, help="drains of each way in the tracing section (default 3)")
    p.add_argument("--tracing-pushes", type=int, help="perform_async timed per way in the tracing section "
                                                       "(default 20,000)")
    p.add_argument("--async-n", type=int, help="jobs awaiting 1 ms per drain of the async-jobs section (default "
                                                 "20,000; quick: 300)")
    p.add_argument("--async-long-n", type=int, help="jobs awaiting 50 ms per drain of the async-jobs section "
                                                      "(default 2,000; quick: 200)")
    p.add_argument("--async-reps", type=int, help="drains of each system in the async-jobs section (default 3; "
                                                    "quick: 1)")
    p.add_argument("--iteration-rows", type=int, help="rows an iterable job walks in the iteration section (default "
                                                        "100,000; quick: 2,000)")
    p.add_argument("--iteration-reps", type=int, help="walks of each way in the iteration section (default 5; "
                                                        "quick: 1)")
    p.add_argument("--reps", type=int, default=1,
                   help="drains of each system in the drain and real-jobs sections, in turn (all systems, then "
                        "all again): the median by jobs/s is kept, with the range (default 1)")
    p.add_argument("--no-venv", action="store_true", help="run with this interpreter, not bench/.venv")
    p.add_argument("--no-sidekiq", action="store_true", help="don't try to install or run Sidekiq")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of a cogworker drain")
    p.add_argument("--baseline", metavar="REV",
                   help="also profile the worker of git revision REV (same job, same run): per-stage costs "
                        "before and after")
    p.add_argument("--no-docs", action="store_true", help="don't write docs/benchmarks.md and .png")
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(RUN) if args.sections else set()
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}: of {', '.join(RUN)}")
    return args


def check_values(obj: Any, where: str = "") -> list[str]:
    """Every number in the results must be finite (NaN and inf say a measurement went wrong)."""
    bad = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad += check_values(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += check_values(v, f"{where}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        bad.append(where)
    return bad


def run_section(bench: Any, name: str) -> None:
    """One section's run, its results stored; a failure recorded in ``errors`` (the run goes on)."""
    try:
        out = load(name).run(bench)
        if out is not None:
            bench.results[name] = out
    except Exception as exc:
        bench.results["errors"][name] = f"{type(exc).__name__}: {exc}"
        log(f"{name} FAILED: {exc}\n{traceback.format_exc()}")
    bench.save_partial()


def outputs(args: argparse.Namespace, sections: list[str], partial: bool) -> list[Path]:
    """Where the JSON goes (see the module's docstring: only the latest results are kept)."""
    if args.quick or (partial and args.out):
        return [args.out] if args.out else []
    own = LATEST if not partial else RESULTS / ("+".join(s for s in RUN if s in sections) + ".json")
    return [own, *([args.out] if args.out else [])]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.quick and not args.no_venv and not environment.in_bench_venv():
        python = environment.ensure_venv()
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])
    sections = [s for s in RUN if not args.sections or s in args.sections.split(",")]
    partial = set(sections) != set(RUN)
    sidekiq_note = None
    if not args.quick and not args.no_sidekiq and {"enqueue", "drain", "real_jobs", "scheduled"} & set(sections):
        sidekiq_note = environment.ensure_sidekiq()
    started = time.time()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    mode = "quick" if args.quick else "full" if args.full else "default"
    if args.quick:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="cogbench-", suffix=".tmp",
                                        dir=str(args.out.parent) if args.out else None))
    else:
        RESULTS.mkdir(exist_ok=True)
        workdir = RESULTS / f"{stamp}.tmp"
        workdir.mkdir()
    from session import Bench  # (redis-py and Django: only once in the bench venv)

    modules = [load(name) for name in RUN]
    bench = Bench(args, workdir, [kv for m in modules for kv in getattr(m, "PARAMS", {}).items()])
    ok = False
    try:
        res = bench.results
        res["meta"] = {"timestamp": stamp, "mode": mode, "n": bench.n, "argv": argv, "params": bench.p,
                       **({"sections": sections} if partial else {}), "loadavg_start": round(os.getloadavg()[0], 2)}
        res["machine"] = environment.machine()
        res["versions"] = environment.versions(bench.server.version())
        if sidekiq_note:
            res["skipped"]["sidekiq"] = sidekiq_note
        log(f"{mode} run, N = {bench.n:,}, redis {bench.server.url}, work dir {workdir}"
            + (f", sections {', '.join(sections)}" if partial else ""))
        for name in sections:
            if load(name).QUICK or not args.quick:
                run_section(bench, name)
        res["meta"]["duration_s"] = round(time.time() - started, 1)
        res["meta"]["loadavg_end"] = round(os.getloadavg()[0], 2)
        ok = True
    finally:
        bench.close()
        if not ok:
            log(f"run failed; logs and partial results kept in {workdir}")
    bad = check_values(bench.results)
    if bad:
        bench.results["errors"]["non_finite"] = bad
    text = json.dumps(bench.results, indent=1, default=str) + "\n"
    for path in outputs(args, sections, partial):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        log(f"wrote {path}")
    if not args.quick and not partial:
        # (This run replaces every section of the page: the files of sections run alone are stale.)
        for old in sorted(RESULTS.glob("*.json")):
            if old != LATEST:
                old.unlink()
                log(f"removed {old} (older than this run; `git add -A bench/results` commits that)")
        if not args.no_docs:
            import report

            report.write(bench.results)
    elif not args.quick and not args.out:
        log("to put these sections into the page: python bench/report.py")
    if bench.results["errors"]:
        log(f"errors: {json.dumps(bench.results['errors'], indent=1)}")
        log(f"worker logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
