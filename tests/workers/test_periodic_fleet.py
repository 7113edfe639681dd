"""Periodic entries across a fleet of real `runcogworker` processes: one slot, one run.

Every process ticks (PERIODIC_TICK_INTERVAL 0.1 s) and reads its time from the Redis key
`testclock` (COGWORKER_CLOCK = testproject.clock.redis_clock), so the test moves the whole fleet
from slot to slot by SETting it. The job (PeriodicSlotJob) records a "start" and an "end" event
with its `periodic_slot`, jid and pid.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import time

import pytest
from helpers import FAST_ENV, Worker, wait_until

JOB = "testproject.demo.jobs.PeriodicSlotJob"
KEY = "runs"
SLOT0 = 1_800_000_000  # a minute boundary
T0 = SLOT0 + 30
LAST_SLOT = "cogworker:periodic:last_slot:every-minute"


def slot(n: int) -> int:
    return SLOT0 + 60 * n


def env(entry: dict, **extra: str) -> dict[str, str]:
    return {**FAST_ENV, "COGWORKER_CLOCK": "testproject.clock.redis_clock", "COGWORKER_PERIODIC_TICK_INTERVAL": "0.1",
            "COGWORKER_PERIODIC": json.dumps([entry]), "COGWORKER_CONCURRENCY": "2", **extra}


def every_minute(**options) -> dict:
    return {"name": "every-minute", "cron": "* * * * *", "job": JOB, "args": [KEY], **options}


@contextlib.contextmanager
def fleet(n: int, worker_env: dict[str, str]):
    """n worker processes, ready; killed (-9) on the way out if still running."""
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(Worker(env=worker_env)) for _ in range(n)]
        for w in workers:
            w.wait_ready()
        yield workers


def stop(workers) -> None:
    for w in workers:
        w.term()
    for w in workers:
        assert w.wait(30) == 0, w.log()


def events(r, kind: str = "start") -> list[dict]:
    return [e for e in map(json.loads, r.lrange(KEY, 0, -1)) if e["event"] == kind]


def run_slots(r) -> list[int]:
    return [e["slot"] for e in events(r)]


def set_clock(r, n: int) -> None:
    """Move the fleet's clock to half a minute past slot n."""
    r.set("testclock", slot(n) + 30)


def test_three_processes_run_each_slot_exactly_once(r):
    set_clock(r, 0)
    with fleet(3, env(every_minute())) as workers:
        wait_until(lambda: r.get(LAST_SLOT) == str(slot(0)), timeout=15, message="entry primed")
        count = 40
        for n in range(1, count + 1):
            set_clock(r, n)
            # Claimed by one of them (so a loaded machine can't make the test skip a slot), then
            # left a few ticks for the other two to try it too.
            wait_until(lambda n=n: r.get(LAST_SLOT) == str(slot(n)), timeout=10, interval=0.02)
            time.sleep(0.3)
        wait_until(lambda: len(events(r)) >= count, timeout=15, message=f"{count} runs")
        time.sleep(1.0)  # room for a late duplicate to show up
        runs = run_slots(r)
        duplicates = len(runs) - len(set(runs))
        missing = sorted(set(slot(n) for n in range(1, count + 1)) - set(runs))
        # Which process won each claim (the ticker that enqueued it logs the slot).
        claimed = r"periodic every-minute: slot [-\d]+ [:\d]+\+00:00 \(UTC\) enqueued"
        claims = {w.pid: len(re.findall(claimed, w.log())) for w in workers}
        print(f"\nperiodic fleet: slots={count} runs={len(runs)} duplicates={duplicates} missing={len(missing)} "
              f"claims per process={sorted(claims.values(), reverse=True)}")
        assert duplicates == 0 and missing == [], (runs, missing)
        assert sorted(runs) == [slot(n) for n in range(1, count + 1)]
        assert sum(claims.values()) == count
        assert sum(1 for c in claims.values() if c) >= 2, claims  # the processes really raced for the slots
        published = json.loads(r.hget("cogworker:periodic:schedule", "every-minute"))
        assert published["cron"] == "* * * * *" and published["tz"] == "UTC"  # settings.TIME_ZONE
        stop(workers)


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_after_a_whole_fleet_stop_missed_slots_follow_catch_up(r, catch_up):
    worker_env = env(every_minute(), COGWORKER_PERIODIC_CATCH_UP=str(catch_up))
    set_clock(r, 0)
    with fleet(3, worker_env) as workers:
        wait_until(lambda: r.get(LAST_SLOT) == str(slot(0)), timeout=15, message="entry primed")
        set_clock(r, 1)
        wait_until(lambda: run_slots(r) == [slot(1)], timeout=10)
        stop(workers)
    set_clock(r, 11)  # ten slots pass with no process up
    with fleet(3, worker_env) as workers:
        expected = [slot(n) for n in range(1, 12)] if catch_up else [slot(1), slot(11)]
        wait_until(lambda: len(events(r)) >= len(expected), timeout=15)
        time.sleep(1.5)
        assert sorted(run_slots(r)) == expected  # on: the 10 missed slots, once each; off: only the latest
        stop(workers)


def test_re_enabled_from_the_admin_a_process_that_never_saw_it_disabled_does_not_catch_up(r, rb):
    # Disabled at slot 0; half an hour later enabled again; the process ticking next started
    # after that (or never ticked meanwhile): with catch-up on, it ran all 30 skipped slots.
    from django_cogworker import api
    from django_cogworker.broker.keys import Keys

    keys = Keys()
    r.set(LAST_SLOT, slot(0))
    rb.sadd(keys.periodic_disabled, "every-minute")
    set_clock(r, 30)
    api.PeriodicEntry("every-minute", {}, enabled=False, last_slot=None, redis=rb, keys=keys).enable(
        now=slot(30) + 30)  # (the fleet's clock)
    with fleet(2, env(every_minute(), COGWORKER_PERIODIC_CATCH_UP="True")) as workers:
        time.sleep(1.5)  # many ticks
        assert run_slots(r) == []
        set_clock(r, 31)
        wait_until(lambda: run_slots(r) == [slot(31)], timeout=10)
        time.sleep(0.5)
        assert run_slots(r) == [slot(31)]
        stop(workers)


def test_until_executed_prevents_overlap_and_recovers_after_kill_9(r):
    """A run outlasting several slots: no second run meanwhile, also when its process is killed (-9).

    The killed run is requeued by orphan recovery (ORPHAN_THRESHOLD 3 s) with its lock still held,
    so no slot fires in between; once the rerun ends, the entry runs again at its next slot.
    """
    set_clock(r, 0)
    running = "cogworker:periodic:running:every-minute"
    with fleet(3, env(every_minute(args=[KEY, 5], until_executed=True))) as workers:
        wait_until(lambda: r.get(LAST_SLOT) == str(slot(0)), timeout=15, message="entry primed")
        set_clock(r, 1)
        [first] = wait_until(lambda: events(r), timeout=10)
        assert first["slot"] == slot(1) and r.get(running) == first["jid"]
        n = 1
        for n in range(2, 5):  # slots 2-4 pass while it runs: skipped
            set_clock(r, n)
            time.sleep(0.4)
        assert len(events(r)) == 1 and r.get(LAST_SLOT) == str(slot(4))

        [victim] = [w for w in workers if w.pid == first["pid"]]
        victim.kill9()
        victim.wait(10)
        deadline = time.monotonic() + 30
        while not events(r, "end") and time.monotonic() < deadline:  # cron keeps ticking meanwhile
            n += 1
            set_clock(r, n)
            time.sleep(0.5)
            held = r.get(running)
            assert held == first["jid"] or events(r, "end"), held  # held throughout the rerun's wait
        [end] = events(r, "end")
        starts = events(r)
        assert [(e["slot"], e["jid"]) for e in starts[:2]] == [(slot(1), first["jid"])] * 2, starts
        assert starts[1]["pid"] != first["pid"]  # rerun elsewhere, requeued by orphan recovery
        assert end["jid"] == first["jid"] and end["pid"] == starts[1]["pid"]
        # No other run began before the rerun ended (a slot can fire right after it, legitimately).
        assert all(e["t"] >= end["t"] for e in starts[2:]), starts

        wait_until(lambda: len(events(r)) >= 3 or r.get(running) is None, timeout=5)
        n += 1
        set_clock(r, n)  # the entry runs again at its next slot
        wait_until(lambda: len(events(r)) >= 3, timeout=10)
        third = events(r)[2]
        assert third["jid"] != first["jid"] and third["slot"] > slot(4)
        stop([w for w in workers if w is not victim])
    by_jid = collections.Counter(e["jid"] for e in events(r))
    assert by_jid[first["jid"]] == 2 and len(by_jid) == 2


def test_a_run_interrupted_by_a_whole_fleet_crash_is_requeued_before_its_next_slot(r):
    """The whole fleet dies mid-run and stays down past the running lock's life: at restart the
    ticker waits for the first orphan check, which requeues the run and retakes its lock, so the
    slot due at restart is skipped instead of starting a second run."""
    set_clock(r, 0)
    running = "cogworker:periodic:running:every-minute"
    worker_env = env(every_minute(args=[KEY, 4], until_executed=True))
    with fleet(2, worker_env) as workers:
        wait_until(lambda: r.get(LAST_SLOT) == str(slot(0)), timeout=15, message="entry primed")
        set_clock(r, 1)
        [first] = wait_until(lambda: events(r), timeout=10)
        for w in workers:
            w.kill9()
        for w in workers:
            w.wait(10)
    r.delete(running)  # as if the outage outlasted the lock's TTL
    set_clock(r, 5)
    time.sleep(3.5)  # past ORPHAN_THRESHOLD: the dead processes' lists are orphans at the first check
    with fleet(2, worker_env) as workers:
        wait_until(lambda: events(r, "end"), timeout=20)
        starts = events(r)
        assert [(e["slot"], e["jid"]) for e in starts] == [(slot(1), first["jid"])] * 2, starts
        assert r.get(LAST_SLOT) == str(slot(5))  # the slot due at restart was skipped, not run beside it
        wait_until(lambda: r.get(running) is None, timeout=5)
        set_clock(r, 6)
        wait_until(lambda: len(events(r)) == 3, timeout=10)
        assert events(r)[2]["slot"] == slot(6)
        stop(workers)
