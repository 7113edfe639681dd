"""Cancelling a job by its jid (django_cogworker/features/cancellation/cancel.py): a waiting one is removed where it
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
from helpers import wait_until

from django_cogworker import Batch, CogworkerError, Job, JobNotFound, cancel, chain
from django_cogworker.broker.keys import Keys
from django_cogworker.errors import NotCancellable
from django_cogworker.features.batches import ChainNext
from django_cogworker.push import payload as payloads
from testproject.demo.jobs import BatchCallbackJob, RecordJob

K = Keys()


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


def test_a_jid_that_utf8_can_not_carry_is_refused_before_anything_is_written(r):
    # (A lone surrogate, what Python makes of argv bytes that aren't UTF-8 (`cogworker cancel`),
    # raised UnicodeEncodeError from redis-py.)
    for jid in ("\ud800", "abc\udcff"):
        with pytest.raises(CogworkerError, match=r"cancel's jid must be text UTF-8 can encode \(no lone surrogate\)"):
            cancel(jid)
    assert r.dbsize() == 0


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


# -- a batch's hand-over job: refused ---------------------------------------------------------------


def test_a_chain_s_hand_over_jobs_are_not_cancelled_and_the_chain_goes_on(launcher_factory, r):
    # Cancelled, django_cogworker.chain_next answered "removed" and the chain never went on nor
    # fired complete or death. Its hand-overs wait here in a queue no worker serves yet.
    launcher_factory()
    flow = chain(RecordJob.s("steps", 1), RecordJob.s("steps", 2)).on("success", BatchCallbackJob, key="cb")
    bid = flow.perform_async(callback_queue="handovers").bid
    wait_until(lambda: r.llen(K.queue("handovers")) == 2, message="the first step done, its hand-overs waiting")
    waiting = {json.loads(raw)["class"]: json.loads(raw)["jid"] for raw in r.lrange(K.queue("handovers"), 0, -1)}
    assert set(waiting) == {"django_cogworker.chain_next", "django_cogworker.batch_child_done"}
    queued = r.lrange(K.queue("handovers"), 0, -1)

    for name, whose in (("chain_next", f"chain {bid!r}"), ("batch_child_done", f"batch {bid!r}")):
        with pytest.raises(NotCancellable, match=rf"is {re.escape(whose)}'s own bookkeeping .*To stop"):
            cancel(waiting[f"django_cogworker.{name}"], interrupt=True)

    assert r.lrange(K.queue("handovers"), 0, -1) == queued  # left where they wait
    assert not r.exists(K.cancels) and r.get(K.stat_cancelled) is None
    # A request a worker read while cancel was still looking (before it withdrew it) is ignored.
    r.hset(K.cancels, waiting["django_cogworker.chain_next"], json.dumps({"at": time.time(), "interrupt": True}))
    launcher_factory(QUEUES=["handovers"])
    wait_until(lambda: r.lrange("cb", 0, -1), message="the chain's success")
    assert r.lrange("steps", 0, -1) == ["1", "2"] and json.loads(r.lindex("cb", 0))["bid"] == bid
    assert Batch.status(bid).success and r.get(K.stat_cancelled) is None


def test_a_hand_over_job_taken_by_a_worker_is_not_signalled(r):
    payload = ChainNext.set().build([{"bid": "step-bid", "event": "success"}], {"chain": "chain-bid", "steps": [],
                                                                                "index": 1})
    r.sadd(K.in_progress_identities, "host:1:abc")
    r.lpush(K.in_progress("host:1:abc"), payloads.encode(payload))  # fetched, or running

    with pytest.raises(NotCancellable, match="chain 'chain-bid'"):
        cancel(payload["jid"])

    assert r.llen(K.in_progress("host:1:abc")) == 1 and not r.exists(K.cancels)


# -- a running job, with a real worker --------------------------------------------------------------


