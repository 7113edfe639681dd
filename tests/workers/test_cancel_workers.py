"""Cancelling a job by its jid (django_cogworker/features/cancellation/cancel.py): a waiting one is removed where it
waits, a running one is told through the heartbeat of the real worker that runs it, an unknown
or dead one is refused. Against the suite's Redis; the running cases with ``runcogworker``
subprocesses, or an in-process Launcher where a test job of this module is needed.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_cancel.py.
"""

from __future__ import annotations

import json
import re
import time

from engine_fixtures import GATES, RUNS, launcher_factory_fixture, new_token, runs  # noqa: F401
from helpers import wait_until, worker

from django_cogworker import cancel
from django_cogworker.broker.keys import Keys
from testproject.demo.flow_jobs import CancellableJob
from testproject.demo.jobs import GatedJob, RecordJob

K = Keys()


def settled_without_trace(r) -> bool:
    """Nothing left: no retry, no dead, no queue, no in-progress list with anything on it."""
    return (r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0 and r.zcard(K.schedule) == 0
            and r.llen(K.queue("default")) == 0
            and not any(r.llen(key) for key in r.keys(K.in_progress("*"))))


def test_a_running_cooperative_job_is_signalled_stops_and_is_not_retried(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = CancellableJob.perform_async("c", 400, 0.05)  # 20 s if nobody stops it
        wait_until(lambda: r.lrange("c:started", 0, -1) == [jid], timeout=15)

        assert cancel(jid) == "signalled"

        wait_until(lambda: r.lrange("c:stopped", 0, -1) == [jid], timeout=5, message="stopped when asked")
        wait_until(lambda: r.get(K.stat_cancelled) == "1", timeout=5)
        wait_until(lambda: settled_without_trace(r), timeout=5, message="acknowledged")
        time.sleep(1)  # (a retry or a requeue would show by now)
        assert settled_without_trace(r)
        assert r.lrange("c:started", 0, -1) == [jid] and not r.exists("c:finished")
        w.term()
        assert w.wait(30) == 0
    assert r.get(K.stat_cancelled) == "1"
    assert f"cancelled jid={jid} class=testproject.demo.flow_jobs.CancellableJob after" in w.log()


def test_a_cancels_entry_no_cancel_wrote_cancels_nothing_and_is_dropped(tmp_path, r):
    # (Garbage was taken for a request made "now": it cancelled its job, and never grew old, so
    # every beat of every process read it forever.)
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = RecordJob.perform_in(1.5, "ran")  # (due after a beat or two has read the hash)
        r.hset(K.cancels, mapping={jid: "not json", "other": json.dumps({"at": 1e300, "interrupt": True})})
        wait_until(lambda: r.lrange("ran", 0, -1) == [jid], timeout=15, message="the job ran")
        wait_until(lambda: not r.exists(K.cancels), timeout=5, message="both entries dropped")
        w.term()
        assert w.wait(30) == 0
    assert r.get(K.stat_cancelled) is None
    assert f"the cancel request stored for jid={jid} is no request (not json): dropped" in w.log()


def test_interrupt_stops_a_job_that_never_reads_cancelled_and_it_is_not_retried(tmp_path, r):
    # GatedJob polls a key that never comes, in 0.05 s sleeps, and would be retried (retry True).
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = GatedJob.perform_async("never-opened", "g", 30)
        wait_until(lambda: r.lrange("g", 0, -1) == [f"start:{jid}"], timeout=15)

        assert cancel(jid, interrupt=True) == "signalled"

        wait_until(lambda: r.get(K.stat_cancelled) == "1", timeout=5, message="interrupted within a beat or so")
        wait_until(lambda: settled_without_trace(r), timeout=5, message="acknowledged")
        time.sleep(1)
        assert settled_without_trace(r)
        assert r.lrange("g", 0, -1) == [f"start:{jid}"]  # (it never reached its end)
        # The processor lives on: the next job runs.
        RecordJob.perform_async("after")
        wait_until(lambda: r.llen("after") == 1, timeout=10)
        w.term()
        assert w.wait(30) == 0
    assert re.search(rf"cancelled jid={jid} class=testproject\.demo\.jobs\.GatedJob after [0-9.]+s", w.log())


def test_without_interrupt_a_job_that_never_reads_cancelled_runs_to_its_end_and_is_still_not_a_success(
        tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = GatedJob.perform_async("gate", "g", 30)
        wait_until(lambda: r.lrange("g", 0, -1) == [f"start:{jid}"], timeout=15)
        assert cancel(jid) == "signalled"
        time.sleep(1.5)  # (three beats: it was told, and ran on)
        assert r.lrange("g", 0, -1) == [f"start:{jid}"]
        r.set("gate", 1)
        wait_until(lambda: r.get(K.stat_cancelled) == "1", timeout=5)
        wait_until(lambda: settled_without_trace(r), timeout=5)
        assert r.lrange("g", 0, -1) == [f"start:{jid}", f"end:{jid}"]
        w.term()
        assert w.wait(30) == 0
