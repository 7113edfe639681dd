"""Batches (django_cogworker/features/batches/): jobs pushed together, their callbacks, their status, and the
errors a bad call gets at once. Real workers (runcogworker subprocesses) against the suite's Redis.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_batch.py.
"""

from __future__ import annotations

import json
import time

from helpers import wait_until, worker

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import AddToOwnBatchJob, BatchCallbackJob, BatchMemberJob

K = Keys()


def callbacks(r, key="cb") -> list[dict]:
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


def events(r, key="cb") -> list[tuple[str, str]]:
    return sorted((c["event"], c["bid"]) for c in callbacks(r, key))


def test_a_batch_that_succeeds_fires_complete_then_success_once_each_with_its_status(tmp_path, r):
    batch = Batch(description="import 42")
    batch.on("complete", BatchCallbackJob, key="cb", import_id=42)
    batch.on("success", BatchCallbackJob, key="cb", import_id=42)
    batch.on("death", BatchCallbackJob, key="cb", import_id=42)
    with batch.jobs():
        jids = [BatchMemberJob.perform_async("m", fails=1 if i % 3 == 0 else 0) for i in range(9)]
        BatchMemberJob.perform_bulk([["m"], ["m"]])
        BatchMemberJob.perform_in(0.5, "m")
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.failures, status.complete) == (12, 12, 0, False)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: len(callbacks(r)) == 2, timeout=30, message="complete and success")
        status = Batch.status(batch.bid)
        w.term()
        w.wait(30)
    got = callbacks(r)
    assert sorted(c["event"] for c in got) == ["complete", "success"]  # (pushed together: either may run first)
    assert all(c["options"] == {"import_id": 42} and c["bid"] == batch.bid for c in got)
    assert got[0]["status"]["description"] == "import 42" and got[0]["status"]["total"] == 12
    assert (status.total, status.pending, status.failures, status.dead, status.complete, status.success) == (
        12, 0, 0, 0, True, True)
    assert set(jids) <= set(r.hkeys("m:done"))
    assert 29 * 86400 < r.ttl(K.batch(batch.bid).meta) <= 30 * 86400


def test_a_job_that_dies_fires_death_once_and_complete_but_never_success(tmp_path, r):
    batch = Batch()
    for event in ("complete", "success", "death"):
        batch.on(event, BatchCallbackJob, key="cb")
    with batch.jobs():
        dying = [BatchMemberJob.perform_async("m", fails=-1) for _ in range(2)]
        for _ in range(3):
            BatchMemberJob.perform_async("m")
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: r.zcard(K.dead) == 2, timeout=30, message="both dead")
        wait_until(lambda: len(callbacks(r)) == 2, timeout=10, message="death and complete")
        status = Batch.status(batch.bid)
        w.term()
        w.wait(30)
    assert sorted(c["event"] for c in callbacks(r)) == ["complete", "death"]
    assert (status.pending, status.failures, status.dead, status.complete, status.success) == (2, 2, 2, True, False)
    assert set(status.failed) == set(dying)
    assert status.failed[dying[0]]["error"] == "RuntimeError"


def test_an_empty_batch_completes_and_succeeds_at_once(tmp_path, r):
    batch = Batch().on("success", BatchCallbackJob, key="cb").on("complete", BatchCallbackJob, key="cb")
    with batch.jobs():
        pass
    assert Batch.status(batch.bid).success
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: len(callbacks(r)) == 2, timeout=20)
        w.term()
        w.wait(30)
    assert sorted(c["event"] for c in callbacks(r)) == ["complete", "success"]


def test_a_job_adds_jobs_to_its_own_batch_and_a_child_batch_completes_before_its_parent(tmp_path, r):
    parent = Batch("parent").on("success", BatchCallbackJob, key="cb")
    with parent.jobs():
        AddToOwnBatchJob.perform_async("m", 5)
        child = Batch("child").on("success", BatchCallbackJob, key="cb")
        with child.jobs():
            BatchMemberJob.perform_async("m", seconds=0.5)
    assert Batch.status(child.bid).parent == parent.bid
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: len(callbacks(r)) == 2, timeout=30)
        w.term()
        w.wait(30)
    assert [c["bid"] for c in callbacks(r)] == [child.bid, parent.bid]
    status = Batch.status(parent.bid)
    assert (status.total, status.pending) == (7, 0)  # the adder, its 5 jobs and the child batch
    assert r.hlen("m:done") == 6


def test_an_outbox_of_the_wrong_type_when_the_last_job_ends_is_quarantined_and_the_callbacks_delivered(tmp_path, r):
    # (success was stamped done, its callback never reached the outbox; the job's step failed at
    # every beat, and once the key was cleared the callback was lost for good.)
    batch = Batch().on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with batch.jobs():
        BatchMemberJob.perform_async("m")
        BatchMemberJob.perform_async("m")
    outbox = K.batch(batch.bid).outbox
    r.set(outbox, "not a list")
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: len(callbacks(r)) == 2, timeout=30, message="complete and success")
        time.sleep(1)  # (a few beats: nothing pending may try the step again)
        w.term()
        w.wait(30)
    assert events(r) == [("complete", batch.bid), ("success", batch.bid)]
    assert Batch.status(batch.bid).lost == ["outbox"] and r.llen(outbox) == 0
    (moved,) = r.scan_iter(match=f"{K.quarantine_prefix}{outbox}:*")
    assert w.log().count(f"{outbox} held a string, not a list: moved to {moved}") == 1
    assert "WRONGTYPE" not in w.log() and "kept in memory" not in w.log()


def test_a_child_s_dead_job_fires_the_parent_s_death_at_once_and_its_complete_only_once_the_child_completed(
        tmp_path, r):
    parent = Batch("parent").on("death", BatchCallbackJob, key="cb").on("complete", BatchCallbackJob, key="cb")
    with parent.jobs():
        child = Batch("child")
        with child.jobs():
            BatchMemberJob.perform_async("m", fails=-1)
            slow = BatchMemberJob.perform_async("m", seconds=3)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: [c["event"] for c in callbacks(r)] == ["death"], timeout=20, message="the parent's death")
        assert not Batch.status(parent.bid).complete and not r.hexists("m:done", slow)  # (the slow job runs)
        wait_until(lambda: len(callbacks(r)) == 2, timeout=20, message="the parent's complete")
        w.term()
        w.wait(30)
    assert r.hexists("m:done", slow)
    status = Batch.status(parent.bid)
    assert (status.pending, status.failures, status.dead, status.complete, status.success) == (1, 1, 1, True, False)
