"""Per-stage costs of a cogworker drain, from a py-spy ``--gil`` profile (collapsed stacks).

Each sample is the stack of the thread holding the GIL at that instant; it is put in the first
stage below whose frame appears anywhere in the stack (so the job's own redis-py call counts as
the job, not as redis-py, and a fetch's parsing as the fetch). Samples / rate / jobs is GIL-held
time per job: the time no other thread of the worker could run Python, which is what bounds a
worker's throughput (its CPU per job adds the kernel's side of sockets and thread wake-ups).
Start-up (imports, Django setup) is counted apart and left out of the per-job figures.

Used by sections/profile.py (the profile section of docs/benchmarks.md) and on its own, to compare two
profiles: ``python bench/stages.py before.txt after.txt --jobs 50000 --rate 200``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

# (stage, frame markers): the first stage with a marker in a sample's stack takes the sample.
# A marker is matched against "function (file" of each frame.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("start-up (imports, Django setup; not per job)", ("<module> (manage.py", "Command.handle (runcogworker.py",
                                                       "launch (launcher.py", "Launcher.start (launcher.py")),
    ("the job's own code (one INCR through redis-py)", ("call_perform (job.py",)),
    # (A job of a batch. Before the fetch and settle stages, whose frames are in their stacks too:
    # the fetcher runs the steps held before each fetch; a step alone runs inside Settler.settle.)
    ("batch step (BATCH_SUCCEED or BATCH_SETTLE, delivery of callbacks)", (
        "BatchSteps.", "Settler.run_steps (settling.py", "settle (steps.py", "step_for (steps.py",
        "deliver (delivery.py")),
    ("ack or filing sent alone (a batch job's ack; a failure)", ("Settler._apply (settling.py",)),
    ("hand-over between threads (wait for a job, give back a slot)", (
        "Fetcher.next_unit (fetcher.py", "Fetcher.processor_idle (fetcher.py", "Fetcher.release (fetcher.py",
        "Processor.await_unit (processor.py", "Handover.", "Fetcher._gather (fetcher.py", "Fetcher._awake (fetcher.py",
        "Fetcher._hold_back (fetcher.py")),
    ("fetch (round trip with the acks riding on it, parse)", ("Fetcher._fetch_until_quiet (fetcher.py",
                                                               "Fetcher.fetch_round (fetcher.py",
                                                               "ReliableFetch.retrieve", "BasicFetch.retrieve")),
    ("payload decode (JSON)", ("decode (payload.py",)),
    ("ledger (what runs, for the heartbeat)", ("Ledger.",)),
    ("settle: settlement queue, stats", ("SettlementQueue.", "Outgoing.", "Settler.", "Stats.")),
    ("hooks (unique and periodic locks)", ("Processor._hook (processor.py", "run_hook", "Launcher.run_hook")),
    ("DB connection sweep and server middleware", ("CloseOldConnections.__call__ (db.py", "run_job (launcher.py")),
    ("logging (job context, start/done lines)", ("joblog.py", "Logger.")),
    ("rest of Processor.process", ("Processor.process (processor.py", "Processor.run (processor.py")),
    ("heartbeat, poller, ticker, other threads", ("Heartbeat", "Poller", "Ticker", "Supervisor", "Thread.run")),
]
OTHER = "other"


def stage_of(frames: list[str]) -> str:
    for stage, markers in STAGES:
        for frame in frames:
            if any(marker in frame for marker in markers):
                return stage
    return OTHER


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py:123)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


def tally(raw: str) -> Counter[str]:
    """Samples per stage of a py-spy raw profile."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f.strip()) for f in stack.split(";")
                  if f.strip() and not f.strip().startswith(("thread (", "process "))]
        counts[stage_of(frames)] += int(count)
    return counts


def per_job(raw: str, jobs: int, rate: float) -> dict[str, Any]:
    """{"stages": [{"stage", "pct", "us_per_job"}...], "gil_us_per_job", "samples"}: shares of the
    per-job samples (start-up left out) and GIL-held µs per job."""
    counts = tally(raw)
    startup = STAGES[0][0]
    per_job_samples = sum(c for s, c in counts.items() if s != startup)
    us = lambda c: round(1e6 * c / rate / jobs, 1) if jobs else 0.0  # noqa: E731
    stages = [{"stage": s, "pct": round(100 * counts[s] / per_job_samples, 1) if per_job_samples else 0.0,
               "us_per_job": us(counts[s])}
              for s in [*(s for s, _ in STAGES[1:]), OTHER] if counts.get(s)]
    return {"samples": sum(counts.values()), "startup_samples": counts.get(startup, 0),
            "gil_us_per_job": us(per_job_samples), "stages": stages}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+", help="py-spy raw profiles (record -f raw)")
    p.add_argument("--jobs", type=int, required=True, help="jobs drained in each profile")
    p.add_argument("--rate", type=float, default=200, help="py-spy's sampling rate (Hz)")
    a = p.parse_args()
    results = [per_job(open(path).read(), a.jobs, a.rate) for path in a.profiles]
    names = [s for s, _ in STAGES[1:]] + [OTHER]
    print("| stage | " + " | ".join(f"{path}: µs/job (%)" for path in a.profiles) + " |")
    for name in names:
        cells = []
        for res in results:
            row = next((r for r in res["stages"] if r["stage"] == name), None)
            cells.append(f"{row['us_per_job']} ({row['pct']}%)" if row else "–")
        if any(c != "–" for c in cells):
            print(f"| {name} | " + " | ".join(cells) + " |")
    print("| **GIL-held µs per job** | " + " | ".join(str(r["gil_us_per_job"]) for r in results) + " |")


if __name__ == "__main__":
    main()
