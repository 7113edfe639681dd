"""Cancelling a job by its jid (django_cogworker/flow/cancel.py): a waiting one is removed where it
waits, a running one is told through the heartbeat of the real worker that runs it, an unknown
or dead one is refused. Against the suite's Redis; the running cases with ``runcogworker``
subprocesses, or an in-process Launcher where a test job of this module is needed."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from engine_fixtures import GATES, RUNS, launcher_factory_fixture, new_token, runs  # noqa: F401
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import Batch, Job, JobNotFound, cancel
from django_cogworker.broker.keys import Keys
from django_cogworker.push import payload as payloads
from testproject.demo.flow_jobs import CancellableJob
from testproject.demo.jobs import BatchCallbackJob, GatedJob, RecordJob

K = Keys()


def worker(tmp_path, *args):
    return Worker(*args, env=FAST_ENV, log_path=tmp_path / "worker.log")


def jids_in(r, key: str) -> list[str]:
    raws = r.zrange(key, 0, -1) if r.type(key) == "zset" else r.lrange(key, 0, -1)
    return [json.loads(raw)["jid"] for raw in raws]


def file_as_retrying(r, job: type[Job], *args) -> str:
    """A payload of ``job`` in the retry set, as a failed run files it; its jid."""
    payload = job.set().build(args, {})
    payload.update(retry_count=0, error_class="RuntimeError", error_message="boom", failed_at=time.time())
    r.zadd(K.retry, {payloads.encode(payload): time.time() + 60})
    return payload["jid"]


# -- a job still waiting: removed -------------------------------------------------------------------


def test_a_waiting_job_is_removed_from_its_queue_and_counted(r):
    kept = RecordJob.perform_async("k")
    jid = RecordJob.perform_async("k")

    assert cancel(jid) == "removed"

    assert jids_in(r, K.queue("default")) == [kept]
    assert r.get(K.stat_cancelled) == "1"
    # (Its one copy is gone: its request goes too, not read by every heartbeat for a day.)
    assert not r.hexists(K.cancels, jid)


def test_a_scheduled_job_is_removed_from_the_schedule(r):
    kept = RecordJob.perform_in(60, "k")
    jid = RecordJob.perform_in(60, "k")

    assert RecordJob.cancel(jid) == "removed"

    assert jids_in(r, K.schedule) == [kept]
    assert r.llen(K.queue("default")) == 0
    assert r.get(K.stat_cancelled) == "1"


def test_a_retrying_job_is_removed_from_the_retry_set(r):
    kept = file_as_retrying(r, RecordJob, "k")
    jid = file_as_retrying(r, RecordJob, "k")

    assert cancel(jid) == "removed"

    assert jids_in(r, K.retry) == [kept]
    assert r.zcard(K.dead) == 0  # (cancelled is not dead: nothing to delete later)
    assert r.get(K.stat_cancelled) == "1"


def test_a_job_on_a_queue_of_its_own_deep_in_a_long_queue_is_found(r):
    RecordJob.perform_bulk([("k",)] * 2500)
    jid = RecordJob.set(queue="mail").perform_async("k")
    deep = jids_in(r, K.queue("default"))[1234]

    assert cancel(jid) == "removed" and cancel(deep) == "removed"

    assert r.llen(K.queue("mail")) == 0
    assert r.llen(K.queue("default")) == 2499 and deep not in jids_in(r, K.queue("default"))
    assert r.get(K.stat_cancelled) == "2"


# -- nowhere to be found ----------------------------------------------------------------------------


def test_an_unknown_jid_is_not_found_and_its_request_withdrawn(r):
    RecordJob.perform_async("k")
    with pytest.raises(JobNotFound, match="no job 'nobody' is waiting, scheduled, retrying or running"):
        cancel("nobody")
    assert not r.hexists(K.cancels, "nobody")
    assert r.get(K.stat_cancelled) is None
    assert r.llen(K.queue("default")) == 1


def test_a_dead_job_is_not_found_and_the_error_says_it_is_dead(r):
    payload = RecordJob.set().build(("k",), {})
    payload.update(error_class="RuntimeError", error_message="boom", failed_at=time.time())
    r.zadd(K.dead, {payloads.encode(payload): time.time()})

    with pytest.raises(JobNotFound, match="is in the dead set"):
        cancel(payload["jid"])

    assert not r.hexists(K.cancels, payload["jid"])
    assert r.zcard(K.dead) == 1  # (left there: deleting it is the dead set's business)

def test_a_cancels_hash_of_the_wrong_type_is_moved_aside_and_the_cancel_goes_through(r, caplog):
    jid = RecordJob.perform_async("never")
    r.set(K.cancels, "not a hash")
    with caplog.at_level(logging.WARNING):
        assert cancel(jid) == "removed"
    assert jids_in(r, K.queue("default")) == []
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.cancels}:*"))) == 1
    assert "held a string, not a hash" in caplog.text


@pytest.mark.parametrize("jid", ["", None, 42])
def test_a_jid_that_is_not_a_non_empty_string_is_refused(jid):
    with pytest.raises(TypeError, match="cancel takes a job's jid"):
        cancel(jid)


class TakesAJid(Job):
    """Holds until GATES[token] opens; ``about`` carries another job's jid in its arguments."""

    def perform(self, token, about):
        RUNS[token].append(self.jid)
        GATES[token].wait(30)


def test_a_waiting_job_whose_arguments_hold_another_jid_is_not_taken_for_it(r):
    # (payloads are compact JSON: {"jid": X} in the arguments reads exactly as the job's own jid field)
    target = RecordJob.perform_in(60, "k")
    bystander = TakesAJid.perform_async("t", {"jid": target})
    assert f'"jid":"{target}"' in r.lindex(K.queue("default"), 0)

    assert cancel(target) == "removed"
    assert jids_in(r, K.queue("default")) == [bystander] and r.zcard(K.schedule) == 0

    with pytest.raises(JobNotFound):
        cancel(target)  # (only the bystander names it now)
    assert jids_in(r, K.queue("default")) == [bystander]


@pytest.mark.parametrize("fetch_mode", ["reliable", "basic"])
def test_a_running_job_whose_arguments_hold_another_jid_is_not_taken_for_it(launcher_factory, r, fetch_mode):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode)
    bystander = running.push(TakesAJid, token, {"jid": "nobody-runs-me"})["jid"]
    wait_until(lambda: runs(token) == [bystander])
    wait_until(lambda: r.hlen(K.workers(running.launcher.identity)) == 1, message="in the workers hash")

    with pytest.raises(JobNotFound) as caught:
        cancel("nobody-runs-me")

    # With basic fetch a process holds what it fetched out of sight (until its next beat): the
    # request is kept, and the error says so; with reliable fetch nothing is hidden, it is withdrawn.
    assert r.hexists(K.cancels, "nobody-runs-me") == (fetch_mode == "basic")
    assert ("basic fetch may hold it unseen" in str(caught.value)) == (fetch_mode == "basic")
    GATES[token].set()
    wait_until(lambda: r.get(K.stat_processed) == "1")
    assert r.get(K.stat_cancelled) is None


# -- a batch's job ----------------------------------------------------------------------------------


def test_a_batch_s_job_cancelled_while_waiting_counts_as_dead_for_its_batch(r):
    batch = Batch().on("death", BatchCallbackJob, key="cb")
    with batch.jobs():
        jid = RecordJob.perform_async("k")
        other = RecordJob.perform_async("k")

    assert cancel(jid) == "removed"

    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.dead, status.death) == (2, 2, 1, True)
    assert status.failed[jid]["error"] == "Cancelled"
    assert status.failed[jid]["message"] == "cancelled before it ran"
    queued = [json.loads(raw) for raw in r.lrange(K.queue("default"), 0, -1)]
    assert [p["jid"] for p in queued if p["class"] == RecordJob.name] == [other]
    assert [p["class"] for p in queued].count(BatchCallbackJob.name) == 1  # its death fired


# -- a running job, with a real worker --------------------------------------------------------------


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
