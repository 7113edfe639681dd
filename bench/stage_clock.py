"""Run ``manage.py runcogworker`` with each stage of the per-job path timed in thread CPU time.

    BENCH_STAGE_CLOCK_OUT=/tmp/stages.json python bench/stage_clock.py runcogworker -c 10 -q default

Wraps, from outside (the worker's code is not changed), the functions a job passes through, and
adds up for each the CPU time of the calling thread (``time.thread_time_ns``: a thread blocked on
the GIL, a queue or a socket is not counted, the kernel's side of its system calls is), exclusive
of the wrapped functions it calls, so the stages add up to the worker's CPU in them. Written as JSON
at exit: per stage, calls and nanoseconds, and the measured cost of one wrapper (two clock reads
and a Python call: subtract calls × that, profile_stages.py does). A sampling profiler can't give
this: py-spy's ``--gil`` misses most samples on Python 3.11, and without it counts a thread
waiting for the GIL as running.

bench/profile_stages.py --clock runs it and prints the table.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

_local = threading.local()
_totals: dict[str, list[int]] = {}  # stage -> [calls, exclusive ns]
_lock = threading.Lock()
now = time.thread_time_ns


def timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its exclusive thread CPU time added to ``stage``."""
    cell = _totals.setdefault(stage, [0, 0])

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(0)
        t = now()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = now() - t
            children = stack.pop()
            if stack:
                stack[-1] += elapsed
            # (Not under a lock: a lost update costs one call's figure; a lock would cost every call.)
            cell[0] += 1
            cell[1] += elapsed - children

    return wrapper


def wrap(owner: Any, name: str, stage: str) -> None:
    setattr(owner, name, timed(stage, getattr(owner, name)))


def wrapper_cost() -> int:
    """Thread CPU ns one wrapper adds to a call (the fastest of a few measurements)."""
    def noop() -> None:
        return None

    bare = timed("(calibration)", noop)
    best = None
    for _ in range(5):
        t = now()
        for _ in range(20_000):
            bare()
        spent = (now() - t) / 20_000
        t = now()
        for _ in range(20_000):
            noop()
        spent -= (now() - t) / 20_000
        best = spent if best is None else min(best, spent)
    _totals.pop("(calibration)", None)
    return round(best or 0)


def install() -> None:
    """Wrap the stages (after django.setup(): the engine's modules import models)."""
    from benchproject import jobs

    from django_cogworker import joblog
    from django_cogworker.engine.fetch import fetcher, ledger, reliable
    from django_cogworker.engine.process import launcher
    from django_cogworker.engine.run import cancels, db, hooks, processor
    from django_cogworker.engine.settle import queue, stats
    from django_cogworker.features.batches import hook as batches_hook
    from django_cogworker.features.cancellation import hook as cancellation_hook
    from django_cogworker.features.expiry import hook as expiry_hook
    from django_cogworker.features.locks import hook as locks_hook
    from django_cogworker.push import payload

    wrap(fetcher.Fetcher, "next_unit", "processor: hand-over, take a job (next_unit)")
    wrap(fetcher.Fetcher, "processor_idle", "processor: hand-over, give back a slot (processor_idle)")
    wrap(processor.Processor, "process", "processor: rest of Processor.process (scope, cancels, gate, timings)")
    wrap(payload, "decode", "processor: payload decode (JSON)")
    wrap(payload, "printable", "processor: jid and class escaped for the log lines (printable)")
    for owner, names in ((expiry_hook.Expiry, ("before",)), (cancellation_hook.Cancellation, ("before", "decide")),
                         (locks_hook.RunLockRelease, ("after",)), (batches_hook.Batches, ("settling",))):
        for name in names:
            wrap(owner, name, "processor: the features' hooks (before, decide, settling, after)")
    wrap(hooks.Plans, "plan", "processor: the class's plan (a dict lookup)")
    wrap(processor.Processor, "_conclude", "processor: settling hooks, settle, count, after hooks (rest of)")
    wrap(cancels.Cancels, "started", "processor: cancels registry (started, finished; a lock each)")
    wrap(cancels.Cancels, "finished", "processor: cancels registry (started, finished; a lock each)")
    wrap(ledger.Ledger, "job_started", "processor: ledger (job_started, job_finished)")
    wrap(ledger.Ledger, "job_finished", "processor: ledger (job_started, job_finished)")
    wrap(joblog, "enter", "processor: job log context and start/done lines (off at WARNING)")
    wrap(joblog, "leave", "processor: job log context and start/done lines (off at WARNING)")
    wrap(db.CloseOldConnections, "__call__", "processor: server middleware chain (DB sweep)")
    wrap(launcher, "call_perform", "processor: call_perform (args, awaitable check)")
    wrap(jobs.NoopIncr, "perform", "processor: the job itself (one INCR through redis-py)")
    wrap(queue.SettlementQueue, "put", "processor: settlement held for the fetch (put)")
    wrap(stats.Stats, "job_done", "processor: stats (job_done)")
    wrap(fetcher.Fetcher, "_fetch_until_quiet", "fetcher: rest of its loop (hand units over, tokens)")
    wrap(fetcher.Fetcher, "_awake", "fetcher: wait for an idle processor (_awake)")
    wrap(fetcher.Fetcher, "_gather", "fetcher: gather idle tokens (_gather)")
    wrap(reliable.ReliableFetch, "retrieve", "fetcher: fetch round trip, acks riding on it (retrieve)")
    wrap(ledger.Ledger, "hand", "fetcher: ledger (hand)")
    wrap(queue.SettlementQueue, "take", "fetcher: settlements taken for the fetch (take)")
    cost = wrapper_cost()
    out = os.environ.get("BENCH_STAGE_CLOCK_OUT")
    if out:
        atexit.register(_dump, Path(out), cost)
        # (Also on a TERM the worker turns into its own stop: dumped once more then, last wins.)
        _dump(Path(out), cost)


def _dump(path: Path, cost: int) -> None:
    path.write_text(json.dumps({"wrapper_ns": cost, "pid": os.getpid(),
                                "stages": {k: {"calls": v[0], "ns": v[1]} for k, v in _totals.items()}}))


def main() -> None:
    for path in (str(ROOT), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchproject.settings")
    import django

    django.setup()
    install()
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(["manage.py", *sys.argv[1:]])
    finally:
        out = os.environ.get("BENCH_STAGE_CLOCK_OUT")
        if out:
            _dump(Path(out), json.loads(Path(out).read_text())["wrapper_ns"])


if __name__ == "__main__":
    main()
