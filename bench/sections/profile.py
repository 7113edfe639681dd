"""Profile: a py-spy record (``--gil``) of one cogworker drain: the top frames, a flame graph
(bench/results/profile.svg), and the per-stage GIL-held time per job (bench/stages.py); with
``--baseline REV``, the same of REV's worker, measured in this run. Needs py-spy (the bench venv);
skipped in --quick.

Writes ``profile``: the system, N, samples, top frames (self and inclusive), stages, the SVG's path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import harness
import stages  # (bench/stages.py: which stage a sample's stack is in)
from environment import log
from markdown import Page, table
from session import Bench
from systems import Cogworker

NAME = "profile"
QUICK = True  # (it says why it is skipped there: "not asked for")
BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
SVG = BENCH / "results" / "profile.svg"


def run(bench: Bench) -> dict[str, Any] | None:
    """py-spy record of one cogworker drain, sampling the thread holding the GIL (``--gil``).

    A raw (collapsed stacks) run gives the top frames in the JSON; a second run, the flame graph
    SVG. The worker runs as py-spy's child (attaching to a pid needs ptrace rights that
    sandboxes often lack) and is stopped with SIGINT to the group, as Ctrl-C would.
    """
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if bench.quick or bench.args.no_profile or not spy:
        bench.results["skipped"]["profile"] = "py-spy not installed" if not spy else "not asked for"
        return None
    system = Cogworker("reliable", 10)
    n = min(bench.n, 50_000)
    out: dict[str, Any] = {"system": system.label, "n": n, "mode": "py-spy record --gil --function --rate 200"}
    svg = SVG
    for fmt, path in (("raw", bench.workdir / "profile.txt"), ("flamegraph", svg)):
        bench.reset_redis()
        system.push_bulk(bench.ctx, n)
        workers = system.start(bench.ctx, tag=f"-profile-{fmt}", wrap=[
            spy, "record", "--gil", "--function", "--rate", "200", "--format", fmt, "-o", str(path), "--"])
        try:
            harness.Counter(bench.r).wait_for(n, timeout=300, alive=workers[0].alive, interval=0.05)
            os.killpg(workers[0].pid, signal.SIGINT)
            try:
                workers[0].proc.wait(90)
            except subprocess.TimeoutExpired:
                log(f"py-spy ({fmt}) did not exit after SIGINT; killing it")
        except Exception as exc:
            bench.results["errors"][f"profile-{fmt}"] = f"{type(exc).__name__}: {exc}"
        finally:
            for w in workers:
                w.stop()
    raw = bench.workdir / "profile.txt"
    if raw.exists():
        out.update(summarise_profile(raw.read_text()))
        out["stages"] = stages.per_job(raw.read_text(), n, 200)
    out["svg"] = str(svg.relative_to(ROOT)) if svg.exists() else None
    if bench.args.baseline:
        out["baseline"] = _profile_baseline(bench, spy, system, n)
    return out

def _profile_baseline(bench: Bench, spy: str, system: Any, n: int) -> dict[str, Any]:
    """The same raw profile of the worker as of ``--baseline REV`` (its django_cogworker, this
    bench's job and settings): the per-stage costs before a change, measured in this run."""
    rev = bench.args.baseline
    try:
        sha, env = bench.baseline_env()
    except (subprocess.CalledProcessError, OSError) as exc:
        bench.results["errors"]["profile-baseline"] = f"{rev}: {exc}"
        return {"rev": rev}
    path = bench.workdir / "profile-baseline.txt"
    bench.reset_redis()
    system.push_bulk(bench.ctx, n)
    workers = system.start(bench.ctx, tag="-profile-baseline", extra_env=env, wrap=[
        spy, "record", "--gil", "--function", "--rate", "200", "--format", "raw", "-o", str(path), "--"])
    try:
        harness.Counter(bench.r).wait_for(n, timeout=300, alive=workers[0].alive, interval=0.05)
        os.killpg(workers[0].pid, signal.SIGINT)
        workers[0].proc.wait(90)
    except Exception as exc:
        bench.results["errors"]["profile-baseline"] = f"{type(exc).__name__}: {exc}"
    finally:
        for w in workers:
            w.stop()
    out: dict[str, Any] = {"rev": sha}
    if path.exists():
        out["stages"] = stages.per_job(path.read_text(), n, 200)
    return out


def summarise_profile(raw: str, top: int = 15) -> dict[str, Any]:
    """Top frames of a py-spy raw (collapsed stacks) profile: self samples and inclusive samples."""
    own: Tally[str] = Tally()
    incl: Tally[str] = Tally()
    threads: Tally[str] = Tally()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if frames and frames[0].startswith(("thread (", "process ")):
            threads[frames[0]] += n
        frames = [_short(f) for f in frames if not f.startswith(("thread (", "process "))]
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    pct = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {"samples": total,
            "top_self": [{"frame": f, "pct": pct(c)} for f, c in own.most_common(top)],
            "top_inclusive": [{"frame": f, "pct": pct(c)} for f, c in incl.most_common(top)]}


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py:123)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    return f"{name} ({where.rsplit('/', 1)[-1]})" if where else name


def report(res: dict[str, Any]) -> str:
    prof = res.get("profile")
    if not (prof and prof.get("top_self")):
        return ""
    page = Page()
    add = page.add
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
    return page.text()


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
