"""Jobs that push jobs, through real workers of ten threads each (runtime.get_client and own_connection):
every child runs once, every step of a long chain once and in order, each callback once, and no
connection error is logged.

The failure this guards against: the process-wide push client was built on the connection held
by the processor thread that pushed first, so every thread pushed through that one connection,
and a thread that checked it before its command dropped it under another thread's command in
flight (ConnectionError: Connection closed by server). The job failed and ran again, pushing its
children again; a chain's hand-over that failed so left the chain stuck for good.
"""

from __future__ import annotations

import json
import time
from collections import Counter

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import Batch, chain, group
from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import BatchCallbackJob, ChainStepJob, PushFiveJob

K = Keys()
PARENTS = 1_000
CHILDREN = 5  # per parent: PushFiveJob's
STEPS = 500  # the chain's, the group among them
# Parents wait for the next tenth of a second before they push (PushFiveJob): the threads push
# together after a quiet moment, when a connection they shared was checked and dropped.
WAVE = 0.1
STUCK = 30  # seconds without progress: the run is stuck
# Nothing here is killed: a threshold the heartbeats of two busy workers on a loaded machine can't
# miss, so that no job is run again by orphan recovery (which the counts would take for the bug).
ENV = {**FAST_ENV, "COGWORKER_ORPHAN_THRESHOLD": "60"}
# What a worker logs when a command's connection was dropped under it (redis-py's errors).
CONNECTION_ERRORS = ("ConnectionError", "Connection closed", "Error while reading", "Error 32", "Broken pipe")


def run_workers(tmp_path, r, done, progress, message: str) -> str:
    """Run two workers of ten threads until ``done()``, stop them once nothing is left to run (a
    job pushed twice would be waiting still), and return their logs. Fail when ``progress()`` has
    not changed for STUCK seconds: a stuck chain never finishes."""
    # (One queue: a worker serving two blocks on one at a time, a hand-over waiting up to the idle
    # interval when it blocks on the other, which made the chain four times as long.)
    workers = [Worker("-c", "10", "-q", "default", env=ENV, log_path=tmp_path / f"worker{i}.log")
               for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        seen = [progress(), time.monotonic()]

        def finished() -> bool:
            if done():
                return True
            now = progress()
            if now != seen[0]:
                seen[:] = [now, time.monotonic()]
            assert time.monotonic() - seen[1] < STUCK, f"{message}: stuck at {now!r} for {STUCK}s"
            return False

        wait_until(finished, timeout=600, interval=0.2, message=message)
        wait_until(lambda: not (r.llen(K.queue("default")) or r.zcard(K.schedule) or r.zcard(K.retry)),
                   timeout=30, message="nothing left to run")
        for w in workers:
            w.term()
        for w in workers:
            assert w.wait(30) == 0
        return "\n".join(w.log() for w in workers)
    finally:
        for w in workers:
            w.__exit__()


def callbacks(r, key: str = "cb") -> Counter[str]:
    return Counter(json.loads(x)["event"] for x in r.lrange(key, 0, -1))


def connection_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(error in line for error in CONNECTION_ERRORS)]


def push_parents() -> Batch:
    """PARENTS PushFiveJobs, the jobs of one batch with a callback on complete and success."""
    batch = Batch("parents").on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with batch.jobs():
        PushFiveJob.perform_bulk([["runs", n, WAVE] for n in range(PARENTS)])
    return batch


def start_chain() -> tuple[Batch, list[str], int]:
    """A chain of STEPS steps each taking the previous value, its middle step a group of two, with
    a callback on each event; return its batch, the names its steps record in order, and its value.

    Step i adds i to the previous value; the group's members add 1000 and 2000 to it, and the
    step after takes their two values (summed).
    """
    middle = STEPS // 2
    steps: list = [ChainStepJob.s(None, 0, "0", "order")]
    for i in range(1, STEPS - 1):
        if i == middle:
            steps.append(group(ChainStepJob.s(1000, f"{i}a", "order").with_previous(),
                               ChainStepJob.s(2000, f"{i}b", "order").with_previous()))
        else:
            steps.append(ChainStepJob.s(i, str(i), "order").with_previous())
    steps.append(ChainStepJob.s(0, "last", "order").with_previous())
    flow = chain(*steps)
    for event in ("complete", "success", "death"):
        flow.on(event, BatchCallbackJob, key="chain-cb")
    names = [*(str(i) for i in range(middle)), f"{middle}a", f"{middle}b",
             *(str(i) for i in range(middle + 1, STEPS - 1)), "last"]
    return flow.perform_async(), names, 2 * sum(range(middle)) + 3000 + sum(range(middle + 1, STEPS - 1))


def test_jobs_pushing_jobs_and_a_long_chain_run_everything_once_with_no_connection_error(tmp_path, r):
    # Both at once, as a busy worker has them: the chain's hand-overs push among the parents' pushes.
    # (On a connection shared by the threads, the parents' pushes fail every run, about fifteen of
    # them; a hand-over only now and then: the chain is here for what it must do, once and in order.)
    parents = push_parents()
    flow, names, value = start_chain()

    log = run_workers(tmp_path, r, lambda: callbacks(r)["success"] and callbacks(r, "chain-cb")["success"],
                      lambda: (r.hlen("runs"), r.llen("order"), r.llen("cb"), r.llen("chain-cb")),
                      "the success of the parents' batch and of the chain")

    runs = r.hgetall("runs")
    assert sorted(runs) == sorted(f"{n}:{i}" for n in range(PARENTS) for i in range(CHILDREN))
    assert {name: count for name, count in runs.items() if count != "1"} == {}  # each child once
    assert callbacks(r) == {"complete": 1, "success": 1}
    status = Batch.status(parents.bid)  # (the parents and the two children each adds to their batch)
    assert (status.total, status.pending, status.failures) == (PARENTS * 3, 0, 0)

    order = r.lrange("order", 0, -1)
    middle = STEPS // 2
    order[middle:middle + 2] = sorted(order[middle:middle + 2])  # (the group's two run at once)
    assert order == names  # every step once, in order
    assert int(r.hget("order:value", "last")) == value
    assert callbacks(r, "chain-cb") == {"complete": 1, "success": 1}
    assert {json.loads(x)["bid"] for x in r.lrange("chain-cb", 0, -1)} == {flow.bid}

    assert connection_errors(log) == []
