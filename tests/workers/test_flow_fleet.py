"""Limiters across a fleet (django_cogworker/features/limits/): real workers, four processes in two
``runcogworker --processes 2 -c 10`` (two hosts' worth), sharing limits through Redis alone.

A fault test as test_batch_chaos.py is: named for what it does to the whole. What must hold
(docs/flow-control.md): a concurrency limit is never exceeded fleet-wide, whatever the contention;
a holder killed -9 frees its place within its lease (and a second); a rate limit admits no more
than its size in any of its periods; no job is lost or failed for being over a limit.

The jobs record what they saw themselves (testproject/demo/flow_jobs.py): how many ran at once
(a Redis counter, raised and lowered around each run), and when each started. Each test prints a
FIGURES line (run with -s).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker.broker.keys import Keys
from testproject.demo.flow_jobs import MailJob, PartnerCallJob, SoloJob, solo

LEASE = 2.0  # seconds: the workers' demo leases (at least twice FAST_ENV's heartbeat of 0.5 s)
FLEET_ENV = {**FAST_ENV, "DEMO_LIMIT_LEASE": str(LEASE), "COGWORKER_CONCURRENCY": "10"}
KEYS = Keys()


@pytest.fixture
def fleet():
    """Two supervisors of two worker processes each, ten processors a process; killed at the end."""
    workers = [Worker("--processes", "2", env=FLEET_ENV) for _ in range(2)]
    try:
        yield workers
    finally:
        for worker in workers:
            # (Each with its children at once: killed alone, a supervisor TERMs its children, which
            # stopped gracefully into the next test's Redis, their counts flushed after its FLUSHDB.)
            worker.kill_group()
            worker.wait()


def settled(r) -> dict[str, int]:
    """What is left anywhere a job can wait: must be nothing once all ran."""
    return {"queue": r.llen(KEYS.queue("default")), "schedule": r.zcard(KEYS.schedule),
            "retry": r.zcard(KEYS.retry), "dead": r.zcard(KEYS.dead)}


def test_a_concurrency_limit_of_3_holds_across_four_processes_and_loses_nothing(r, fleet):
    jids = set(PartnerCallJob.perform_bulk([["fleet", 0.01]] * 1000))
    pushed = time.monotonic()
    wait_until(lambda: r.llen("fleet:done") >= 1000, timeout=150, interval=0.2,
               message=f"1,000 limited jobs not done; done {r.llen('fleet:done')}, left {settled(r)}")
    drained = time.monotonic() - pushed
    stats = r.hgetall(KEYS.limit("demo:partner").stats)
    print(f"\nFIGURES concurrent(3), 1,000 jobs of 10 ms on 4 processes x 10: max at once {r.get('fleet:max')}, "
          f"drain {drained:.1f}s, granted {stats.get('granted')}, refused {stats.get('over')}, "
          f"rescheduled {stats.get('rescheduled')}, failed {stats.get('failed', 0)}")
    assert int(r.get("fleet:max")) == 3  # never more; and the limit was reached, so it was contended
    done = r.lrange("fleet:done", 0, -1)
    assert set(done) == jids and len(done) == 1000  # each ran once: none lost, none run twice
    assert settled(r) == {"queue": 0, "schedule": 0, "retry": 0, "dead": 0}
    assert int(stats.get("failed", 0)) == 0 and int(stats["rescheduled"]) > 0
    assert r.zcard(KEYS.limit("demo:partner").holders) == 0  # every place given back


def test_a_holder_killed_9_frees_its_place_within_its_lease_and_its_job_runs_again(r):
    holder = Worker(env=FLEET_ENV)
    try:
        jid = SoloJob.perform_async("solo", 60)
        wait_until(lambda: r.llen("solo:started") == 1, timeout=20, message="the holder never started")
        assert r.zcard(KEYS.limit("demo:solo").holders) == 1
        holder.kill9()
        holder.wait()
        killed = time.monotonic()
        with solo.within(wait=LEASE + 5):
            freed = time.monotonic() - killed
        print(f"\nFIGURES a killed holder's place (lease {LEASE:g}s) was taken again {freed:.2f}s after the kill -9")
        assert freed <= LEASE + 1
    finally:
        holder.kill9()
        holder.wait()
    with Worker(env=FLEET_ENV) as again:  # (orphan recovery puts the killed run's job back)
        again.wait_ready()
        wait_until(lambda: r.lrange("solo:done", 0, -1) == [jid], timeout=30,
                   message="the killed holder's job did not run again")
    assert settled(r) == {"queue": 0, "schedule": 0, "retry": 0, "dead": 0}


def test_a_limiter_key_of_the_wrong_type_is_quarantined_once_and_its_jobs_run(r, tmp_path):
    # (Its jobs went back to the schedule every 2 s for ever, not counted toward OVER_LIMIT_MAX,
    # 180 WRONGTYPE lines a minute: no key guard round knows the keys of each limiter.)
    holders = KEYS.limit("demo:solo").holders
    r.set(holders, "not mine")
    jids = {SoloJob.perform_async("poisoned", 0) for _ in range(3)}
    with Worker(env=FLEET_ENV, log_path=tmp_path / "worker.log") as worker:
        wait_until(lambda: r.llen("poisoned:done") == 3, timeout=30, interval=0.1,
                   message=f"the limited jobs never ran; left {settled(r)}")
        time.sleep(1)  # (a few beats: none of them may meet it again)
        log = worker.log()
    assert set(r.lrange("poisoned:done", 0, -1)) == jids and settled(r) == {"queue": 0, "schedule": 0, "retry": 0,
                                                                             "dead": 0}
    (moved,) = r.scan_iter(match=f"{KEYS.quarantine_prefix}{holders}:*")
    assert r.get(moved) == "not mine"
    assert log.count(f"{holders} held a string, not a zset: moved to {moved}") == 1
    assert "WRONGTYPE" not in log and "could not be taken" not in log
    assert r.zcard(holders) == 0  # (every place given back, into the fresh key)


# Starts a second may exceed the limit's 50 by: a job records its start a moment after its take,
# and the takes of a fetch's jobs are made together as it is fetched (features/limits/hook.py): a
# job taken ahead waits for a processor, on a loaded vCPU into the next second ([42, 58, 50, ...]
# before, 62 once since). The limit holds on takes; starts lag them by the hand-over, not more.
SPILL = 25


def test_a_bucket_of_50_a_second_admits_at_most_50_starts_in_each_second_across_the_fleet(r, fleet):
    for worker in fleet:
        wait_until(lambda w=worker: len(w.children(r)) == 2, timeout=30, message="the fleet did not start")
    pushed = time.time()
    MailJob.perform_bulk([["mail"]] * 500)
    wait_until(lambda: r.llen("mail:starts") >= 500, timeout=60, interval=0.2,
               message=f"500 jobs not started; started {r.llen('mail:starts')}, left {settled(r)}")
    starts = sorted(float(t) for t in r.lrange("mail:starts", 0, -1))
    per_second = Counter(int(t) for t in starts)
    drain = starts[-1] - pushed
    print(f"\nFIGURES bucket(50, per=1), 500 jobs on 4 processes x 10: starts per second "
          f"{[per_second[s] for s in sorted(per_second)]}, drain {drain:.2f}s (push to last start)")
    # The limit, on the clock it counts with: over any run of k clock seconds, at most 50 k starts.
    # A job records its start a moment after its take (on a loaded vCPU, tens of milliseconds), so
    # a few taken at a second's end show in the next: SPILL of them, once per run ([42, 58, 50, ...]
    # was seen here, with every take in its second).
    seconds = sorted(per_second)
    for i, first in enumerate(seconds):
        for last in seconds[i:]:
            started_in = sum(per_second[s] for s in range(first, last + 1))
            assert started_in <= 50 * (last - first + 1) + SPILL, (first, last, started_in)
    # Hence 500 starts take at least ten clock seconds: the first is what is left of the push's
    # second, so the last start comes 8 s or more after the push.
    assert len(per_second) >= 10 and drain >= 8.0
    # And the fleet used the rate it was given, not a fraction of it: 40 processors take far more
    # than 50 short jobs a second, even on a loaded 2-CPU machine, so at most twice the 10 s the
    # limit needs. (Exactly 50 in each of 9 seconds failed there: a slow second of one vCPU started
    # 47; what users rely on is the bound above and a drain of about the rate.)
    assert drain <= 20.0
    assert settled(r) == {"queue": 0, "schedule": 0, "retry": 0, "dead": 0}
