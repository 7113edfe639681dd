"""Async jobs on a real worker's event loop (engine/loop/runner.py): many at once on a bounded number
of threads, nothing lost to a kill -9, handed back at TERM, stopped by a timeout and by a cancel
with interrupt, a job blocking the loop named in the log, sync jobs running beside a busy loop.
The phases on a called processor, the routing and the lag watch alone: tests/fast/test_async_jobs.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from helpers import FAST_ENV, wait_until, worker

from django_cogworker import cancel
from django_cogworker.broker.keys import Keys
from django_cogworker.tasks.api import TaskResultStatus
from testproject.demo.async_jobs import AsyncBlockingJob, AsyncSleepJob, AsyncTimedJob, AsyncWaitJob
from testproject.demo.jobs import GatedJob, RecordJob
from testproject.demo.tasks import async_add

K = Keys()
THRESHOLD = float(FAST_ENV["COGWORKER_ORPHAN_THRESHOLD"])


def threads_of(pid: int) -> int:
    """The process's thread count, as the kernel has it (/proc/<pid>/status: Threads)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads line for pid {pid}")


def nothing_left(r) -> bool:
    return (r.llen(K.queue("default")) == 0 and r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0
            and not any(r.llen(key) for key in r.keys(K.in_progress("*"))))


def test_2000_jobs_awaiting_50ms_drain_on_the_loop_with_the_thread_count_bounded(tmp_path, r):
    with worker(tmp_path, "-c", "2", "--async-concurrency", "500") as w:
        w.wait_ready()
        AsyncSleepJob.perform_async(0, "warm")  # (each of its threads started once a job ran)
        RecordJob.perform_async("warm")
        wait_until(lambda: r.llen("warm") == 2, timeout=15)
        before = threads_of(w.pid)
        jids = AsyncSleepJob.perform_bulk([[0.05, "slept"]] * 2000)
        began = time.monotonic()
        counts = []
        while r.llen("slept") < 2000:
            counts.append(threads_of(w.pid))
            assert w.alive, w.log()[-3000:]
            time.sleep(0.01)
        drained = time.monotonic() - began
        wait_until(lambda: nothing_left(r), timeout=10, message="every job acked")
        w.term()
        assert w.wait(30) == 0
    done = [entry.split() for entry in r.lrange("slept", 0, -1)]
    assert sorted(jid for jid, _thread in done) == sorted(jids)  # each once
    assert {thread for _jid, thread in done} == {"cogworker-loop"}
    # 500 awaiting at once, none on a thread of its own: the process keeps the threads it started with
    # (a thread-per-job worker would have needed 500).
    assert max(counts) <= before + 2 and max(counts) < 40, (before, max(counts))
    print(f"\nFIGURES 2,000 async jobs of 50 ms at --async-concurrency 500: threads {before} at rest, "
          f"{max(counts)} at most while draining; drained in {drained:.2f}s (0.20s of waiting at 500 at once)")


def test_a_kill9_mid_drain_loses_no_async_job(tmp_path, r):
    with worker(tmp_path, "--async-concurrency", "50", name="victim") as victim:
        victim_id = victim.wait_ready()
        jids = AsyncSleepJob.perform_bulk([[0.2, "slept"]] * 400)
        wait_until(lambda: r.llen("slept") >= 50, timeout=20, message="the drain under way")
        victim.kill9()
        assert victim.wait(10) == -9
        assert r.llen(K.in_progress(victim_id)) > 0  # (the loop's jobs were on its in-progress list)
        with worker(tmp_path, name="survivor") as survivor:
            survivor.wait_ready()
            wait_until(lambda: set(e.split()[0] for e in r.lrange("slept", 0, -1)) == set(jids),
                       timeout=THRESHOLD + 40, message="every job ran")
            wait_until(lambda: nothing_left(r), timeout=10, message="every job acked")
            survivor.term()
            assert survivor.wait(30) == 0
    assert "recovered" in survivor.log() and victim_id in survivor.log()


def test_term_cancels_and_hands_back_the_async_jobs_still_running(tmp_path, r):
    with worker(tmp_path, env={"COGWORKER_SHUTDOWN_TIMEOUT": "1"}) as w:
        w.wait_ready()
        jids = AsyncWaitJob.perform_bulk([["held", 60]] * 5)
        wait_until(lambda: r.llen("held:started") == 5, timeout=15, message="five running on the loop")
        w.term()
        assert w.wait(30) == 0
    assert sorted(r.lrange("held:cancelled", 0, -1)) == sorted(jids)  # (their tasks cancelled: cleanup ran)
    assert not r.exists("held:finished")
    waiting = [json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)]
    assert sorted(waiting) == sorted(jids)  # handed back, none acked, none filed
    assert r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0
    assert "requeued 5 job(s) unfinished at shutdown" in w.log()


def test_a_timeout_cancels_the_async_job_with_job_timeout(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = AsyncTimedJob.perform_async("timed", 60)
        wait_until(lambda: r.zcard(K.retry) == 1, timeout=20, message="filed for retry")
        [raw] = r.zrange(K.retry, 0, -1)
        payload = json.loads(raw)
        assert payload["jid"] == jid and payload["error_class"] == "django_cogworker.errors.JobTimeout"
        assert r.lrange("timed:cancelled", 0, -1) == [jid] and not r.exists("timed:finished")
        w.term()
        assert w.wait(30) == 0
    assert f"jid={jid} ran past its timeout of 1s: raising JobTimeout in its task" in w.log()


def test_a_cancel_with_interrupt_cancels_the_async_job(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = AsyncWaitJob.perform_async("stop-me", 60)
        wait_until(lambda: r.lrange("stop-me:started", 0, -1) == [jid], timeout=15)

        assert cancel(jid, interrupt=True) == "signalled"

        wait_until(lambda: r.lrange("stop-me:cancelled", 0, -1) == [jid], timeout=10, message="interrupted")
        wait_until(lambda: r.get(K.stat_cancelled) == "1" and nothing_left(r), timeout=10)
        w.term()
        assert w.wait(30) == 0
    assert not r.exists("stop-me:finished")
    assert f"cancelled jid={jid} class=testproject.demo.async_jobs.AsyncWaitJob after" in w.log()


def test_a_job_blocking_the_loop_is_named_in_the_log(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = AsyncBlockingJob.perform_async(1.0, "blocked")
        wait_until(lambda: r.lrange("blocked", 0, -1) == [jid], timeout=15)
        wait_until(lambda: "the event loop runs again after" in w.log(), timeout=5)
        w.term()
        assert w.wait(30) == 0
    log = w.log()
    assert f"by jid={jid} class=testproject.demo.async_jobs.AsyncBlockingJob: a blocking call in async code" in log
    assert f"blocked by jid={jid} class=testproject.demo.async_jobs.AsyncBlockingJob" in log


def test_sync_jobs_keep_running_on_the_threads_beside_a_full_loop(tmp_path, r):
    with worker(tmp_path, "-c", "2", "--async-concurrency", "5") as w:
        w.wait_ready()
        AsyncWaitJob.perform_bulk([["busy", 60]] * 5)
        wait_until(lambda: r.llen("busy:started") == 5, timeout=15, message="the loop full")
        jids = RecordJob.perform_bulk([["sync"]] * 20)

        wait_until(lambda: r.llen("sync") == 20, timeout=20, message="the sync jobs ran")
        assert sorted(r.lrange("sync", 0, -1)) == sorted(jids)
        assert r.llen("busy:started") == 5 and not r.exists("busy:finished")  # (the loop still busy)
        w.kill9()


def test_an_async_django_task_runs_on_the_loop(tmp_path, r):
    result = async_add.enqueue(2, 3)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: async_add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, timeout=15)
        assert async_add.get_result(result.id).return_value == 5
        w.term()
        assert w.wait(30) == 0
    started = rf" cogworker-loop class=\S*async_add jid={result.id} \S+processor: start$"
    assert re.search(started, w.log(), re.M), w.log()[-2000:]


def test_a_sync_job_fetched_for_the_loop_while_the_thread_is_busy_waits_for_the_thread(tmp_path, r):
    # Its jobs async lately, the worker fetches for its loop's places while its one thread is busy:
    # a sync job that comes goes back to the head of its queue at once, never started or recorded
    # as running, and runs once the thread frees (routing.py's rule).
    # (One queue: the fetch for the loop's places blocks on it, and takes the sync job the moment it
    # is pushed. That it was handed back, never recorded as taken, is seen in test_async_jobs.py.)
    with worker(tmp_path, "-c", "1", "--async-concurrency", "2", "-q", "default",
                env={"COGWORKER_PREFETCH": "0"}) as w:
        identity = w.wait_ready()
        AsyncSleepJob.perform_bulk([[0, "warm"]] * 60)
        wait_until(lambda: r.llen("warm") == 60, timeout=20, message="the async jobs ran")
        held = GatedJob.perform_async("gate", "marks")
        wait_until(lambda: r.lrange("marks", 0, -1) == [f"start:{held}"], timeout=15, message="the thread busy")
        sync_jid = RecordJob.perform_async("sync")
        AsyncSleepJob.perform_async(0, "after")

        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # (watched a while: never run, never listed as running)
            running = [json.loads(v)["payload"] for v in r.hvals(K.workers(identity))]
            assert r.llen("sync") == 0 and not any(sync_jid in payload for payload in running)
            time.sleep(0.02)
        r.set("gate", "open")
        wait_until(lambda: r.lrange("sync", 0, -1) == [sync_jid] and r.llen("after") == 1, timeout=15)
        wait_until(lambda: nothing_left(r), timeout=10)
        w.term()
        assert w.wait(30) == 0
    assert r.lrange("marks", 0, -1) == [f"start:{held}", f"end:{held}"]
