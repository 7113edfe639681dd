"""Batches (django_cogworker/features/batches/): jobs pushed together, their callbacks, their status, and the
errors a bad call gets at once. Real workers (runcogworker subprocesses) against the suite's Redis."""

from __future__ import annotations

import json
import re

import pytest

from django_cogworker import Batch, BatchError, BatchNotFound, CogworkerError, Job, chain
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches.steps import BatchStep, BatchSteps, settle
from django_cogworker.features.tracing.carried import LINKS_MAX
from django_cogworker.push import runtime
from django_cogworker.push.client import Client
from testproject.demo.jobs import BatchCallbackJob, RecordJob

K = Keys()


def test_bad_calls_fail_at_the_call(r):
    batch = Batch()
    with pytest.raises(BatchError, match="unknown batch event 'finish'"):
        batch.on("finish", BatchCallbackJob)
    with pytest.raises(BatchError, match="must be a Job class"):
        batch.on("success", print)
    with pytest.raises(TypeError, match="options"):
        batch.on("success", BatchCallbackJob, key=object())
    with pytest.raises(BatchNotFound, match="nope"):
        Batch.status("nope")
    with pytest.raises(BatchNotFound):
        with Batch(bid="nope").jobs():
            pass
    done = Batch()
    with done.jobs():
        pass
    with pytest.raises(BatchError, match="has finished"):
        with Batch(bid=done.bid).jobs():
            RecordJob.perform_async("never")
    assert r.llen(K.queue("default")) == 0


def test_a_ttl_past_what_redis_can_expire_is_refused_at_the_call_and_nothing_is_written(r):
    # (1e16 was taken, then failed inside the opening script, after it had written the batch's
    # keys without an expiry; 10**400 raised OverflowError.)
    for ttl in (1e16, 10**400, 1e9 + 1):
        with pytest.raises(CogworkerError, match=r"a batch's ttl must be at most 1e9 seconds \(about 31 years\), "
                                                 r"got "):
            Batch(ttl=ttl)
    assert r.dbsize() == 0
    batch = Batch(ttl=1e9)  # (the bound itself: Redis keeps it as the batch's expiry)
    with batch.jobs():
        RecordJob.perform_async("k")
    assert 1e9 - 60 < r.ttl(K.batch(batch.bid).meta) <= 1e9


def test_a_callback_that_is_the_job_base_class_is_refused(r):
    # (It has no name: AttributeError, from the batch and from a workflow's on().)
    with pytest.raises(BatchError, match=r"a batch callback must be a Job class \(a subclass of Job\), got <class "
                                         r"'django_cogworker\.push\.job\.Job'>"):
        Batch().on("complete", Job)
    with pytest.raises(BatchError, match=r"a batch callback must be a Job class"):
        chain(RecordJob.s("k")).on("success", Job)
    with pytest.raises(BatchError, match=r"unknown batch event None"):
        Batch().on(None, BatchCallbackJob)  # type: ignore[arg-type]
    assert r.dbsize() == 0


def test_callback_options_nested_past_max_depth_are_refused_naming_the_limit(r):
    from django_cogworker.bounds import MAX_DEPTH

    def nested(levels):
        value: dict = {}
        for _ in range(levels - 1):
            value = {"a": value}
        return value

    Batch().on("complete", BatchCallbackJob, key=nested(MAX_DEPTH))  # (the deepest taken)
    for levels in (MAX_DEPTH + 1, 2000):  # (2,000 raised RecursionError)
        with pytest.raises(CogworkerError, match=rf"^batch callback {re.escape(BatchCallbackJob.name)} on 'complete': "
                                                 rf"options\['key'\]\['a'\].* nests lists and dicts more than "
                                                 rf"{MAX_DEPTH} deep"):
            Batch().on("complete", BatchCallbackJob, key=nested(levels))
    assert r.dbsize() == 0


@pytest.mark.parametrize("field", ["bid", "description", "callback_queue"])
def test_text_that_utf8_can_not_carry_is_refused_at_the_call_and_nothing_is_written(r, field):
    # (A lone surrogate raised UnicodeEncodeError from redis-py, the bid's after a parent was told of it.)
    with pytest.raises(CogworkerError, match=r"must be text UTF-8 can encode \(no lone surrogate\), got "
                                             r"'x\\ud800'"):
        Batch(**{field: "x\ud800"})
    with pytest.raises(CogworkerError, match=r"bid must be"):
        Batch.status("\udcff")
    with pytest.raises(CogworkerError, match=r"bid must be a non-empty string, got 5"):
        Batch.status(5)  # type: ignore[arg-type]
    assert r.dbsize() == 0


def test_a_push_that_fails_or_is_stopped_inside_the_block_is_not_counted(r, monkeypatch):
    def stopper(next_):
        def call(payload):
            if payload["args"] == ["stop"]:
                return None  # (a middleware that stops a push)
            if payload["args"] == ["boom"]:
                raise RuntimeError("push refused")
            return next_(payload)
        return call

    monkeypatch.setattr(runtime, "_client", Client(runtime.get_config(), runtime.get_redis(), middleware=[stopper]))
    batch = Batch()
    with pytest.raises(RuntimeError, match="push refused"):
        with batch.jobs():
            RecordJob.perform_async("ok")
            assert RecordJob.perform_async("stop") is None
            RecordJob.perform_async("boom")
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.committed) == (1, 1, True)
    assert r.llen(K.queue("default")) == 1


def test_callback_options_must_fit_the_callback(r):
    class NoOptions(Job):
        def perform(self, status):
            pass

    with pytest.raises(TypeError):
        Batch().on("success", NoOptions, extra=1)


def test_a_status_names_at_most_a_hundred_failing_jobs_and_counts_them_all(r, rb):
    from django_cogworker.features.batches import steps

    batch = Batch()
    with batch.jobs():
        jids = RecordJob.perform_bulk([["k"]] * 150)
    for jid in jids:  # (each job's step as a worker runs it when the job failed)
        steps.settle(rb, K, batch.bid, jid, "failure", json.dumps({"error": "RuntimeError"}), 60)
    status = Batch.status(batch.bid)
    assert (status.failures, status.pending, status.complete) == (150, 150, True)
    assert len(status.failed) == 100 and set(status.failed) <= set(jids)


# -- the worker's steps run together (features/batches/steps.py: BatchSteps.run_many) ---------------------


def _callbacks_queued(r) -> int:
    return sum(json.loads(raw)["class"] == BatchCallbackJob.name for raw in r.lrange(K.queue("default"), 0, -1))


def test_steps_run_together_move_each_job_once_and_fire_once_whatever_the_reruns(r):
    batch = Batch().on("success", BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [RecordJob.perform_async("x") for _ in range(3)]
    redis = runtime.get_redis()
    # One of them failed first: the steps taken together clear its failure as one alone would.
    settle(redis, K, batch.bid, jids[0], "failure", json.dumps({"error": "RuntimeError"}), 3600.0)
    assert Batch.status(batch.bid).failures == 1
    steps = BatchSteps(redis, K, 3600.0)
    succeeded = [BatchStep(batch.bid, jid, "success", "") for jid in jids]
    steps.run_many(succeeded[:2])
    status = Batch.status(batch.bid)
    assert (status.pending, status.failures, status.success) == (1, 0, False)
    # Again with the last one (the first two ran again after a crash: they move nothing twice).
    steps.run_many(succeeded)
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.failures, status.success) == (3, 0, 0, True)
    assert _callbacks_queued(r) == 1
    steps.run_many(succeeded)  # and once more: nothing fires again
    assert _callbacks_queued(r) == 1
    assert 3500 < r.ttl(K.batch(batch.bid).meta) <= 3600


def test_steps_of_several_batches_go_in_one_round_trip_each_batch_its_own_step(r):
    first, second = Batch().on("success", BatchCallbackJob, key="cb"), Batch()
    with first.jobs():
        one = RecordJob.perform_async("x")
    with second.jobs():
        two = [RecordJob.perform_async("x") for _ in range(2)]
    BatchSteps(runtime.get_redis(), K, 3600.0).run_many(
        [BatchStep(first.bid, one, "success", ""), BatchStep(second.bid, two[0], "success", "")])
    assert Batch.status(first.bid).success and _callbacks_queued(r) == 1
    assert (Batch.status(second.bid).pending, Batch.status(second.bid).success) == (1, False)


def test_a_batch_keeps_its_first_members_traces_up_to_the_cap_and_once_full_never_reads_them_again(r):
    # (What a callback links to: features/tracing/. Full, a step asks the field's length alone: a
    # batch of a million traced members read and searched 1.8 KB of traces a step before.)
    batch = Batch()
    with batch.jobs():
        jids = [RecordJob.perform_async("x") for _ in range(LINKS_MAX + 3)]  # (one left: nothing fires)
    traces = [f"00-{i + 1:032x}-{i + 1:016x}-01" for i in range(LINKS_MAX + 3)]
    redis = runtime.get_redis()
    steps = BatchSteps(redis, K, 3600.0)
    steps.run_many([BatchStep(batch.bid, jids[i], "success", "", traces[i]) for i in range(LINKS_MAX)])
    meta = K.batch(batch.bid).meta
    assert r.hget(meta, "traces").split() == traces[:LINKS_MAX]
    r.config_resetstat()
    steps.run_many([BatchStep(batch.bid, jids[LINKS_MAX], "success", "", traces[LINKS_MAX])])
    settle(redis, K, batch.bid, jids[-2], "failure", json.dumps({"error": "RuntimeError"}), 3600.0, traces[-2])
    called = r.info("commandstats")
    assert called["cmdstat_hstrlen"]["calls"] == 2 and "cmdstat_hget" not in called
    assert r.hget(meta, "traces").split() == traces[:LINKS_MAX]
    assert (Batch.status(batch.bid).pending, Batch.status(batch.bid).failures) == (2, 1)


def test_a_success_that_fires_nothing_refreshes_the_batch_s_ttl_only_once_it_ran_down(r):
    batch = Batch(ttl=3600).on("success", BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [RecordJob.perform_async("x") for _ in range(3)]
    keys = K.batch(batch.bid)
    steps = BatchSteps(runtime.get_redis(), K, 3600.0)

    def ran_down_to(seconds):
        for key in (keys.meta, keys.jobs, keys.pending):
            r.expire(key, seconds)

    ran_down_to(3590)  # (within the slack: a hundredth of a 1-hour TTL, 36 s)
    steps.run_many([BatchStep(batch.bid, jids[0], "success", "")])
    assert r.ttl(keys.meta) <= 3590
    ran_down_to(3500)
    steps.run_many([BatchStep(batch.bid, jids[1], "success", "")])
    assert all(r.ttl(key) > 3590 for key in (keys.meta, keys.jobs, keys.pending))
    ran_down_to(3590)
    steps.run_many([BatchStep(batch.bid, jids[2], "success", "")])  # fires success: writes, so refreshes
    assert all(r.ttl(key) > 3590 for key in (keys.meta, keys.jobs))
    assert Batch.status(batch.bid).success and _callbacks_queued(r) == 1


def test_a_job_sent_to_dead_by_no_run_of_its_own_tells_its_batch_once(r, rb):
    # (What orphan recovery and the admin's kill call: features/batches/steps.py died.)
    from django_cogworker.features.batches import steps

    batch = Batch().on("death", BatchCallbackJob, key="cb")
    with batch.jobs():
        jid = RecordJob.perform_async("k")
    payload = json.loads(rb.lindex(K.queue("default"), 0))
    for _ in range(2):  # (a move to dead interrupted, and judged again)
        steps.died(rb, K, payload, "Orphaned", "orphaned too many times", 60)
    steps.died(rb, K, {"jid": "x", "class": "c"}, "Orphaned", "no batch", 60)  # (nothing to tell)
    status = Batch.status(batch.bid)
    assert (status.dead, status.death, status.failed[jid]["error"]) == (1, True, "Orphaned")
    assert [json.loads(p)["class"] for p in r.lrange(K.queue("default"), 0, -1)].count(BatchCallbackJob.name) == 1
