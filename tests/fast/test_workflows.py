"""Workflows (django_cogworker/features/batches/workflows.py): chain, group and chord over batches, with real
workers: each step after the previous succeeded, the previous value for a step that asks for it,
a dying step stopping its chain, nested parts, and bad parts refused at the call."""

from __future__ import annotations

import json

import pytest

from django_cogworker import Batch, BatchError, CogworkerError, Job, chain, group
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import ChainNext
from testproject.demo.jobs import BatchCallbackJob, RecordJob, ValueJob

K = Keys()


def test_bad_parts_are_refused_at_the_call(r):
    with pytest.raises(BatchError, match="at least one step"):
        chain()
    with pytest.raises(BatchError, match="must be a signature"):
        chain(ValueJob.s(1), 5)
    with pytest.raises(BatchError, match="must be a signature"):
        group(ValueJob)
    with pytest.raises(TypeError, match="args"):
        ValueJob.s(object())
    with pytest.raises(TypeError, match="can't take"):
        chain(RecordJob.s("key", "value", "one too many"))
    with pytest.raises(TypeError, match="can't take"):
        group(RecordJob.s("key", "value").with_previous())  # (no room for the previous value)
    with pytest.raises(BatchError, match="unknown batch event"):
        chain(ValueJob.s(1)).on("finished", BatchCallbackJob)
    assert r.dbsize() == 0  # nothing pushed, no batch made


def test_a_workflow_nested_past_max_depth_is_refused_when_built_and_the_deepest_taken_starts(r):
    from django_cogworker.bounds import MAX_DEPTH

    # (A chain nested 2,000 deep was built, then raised RecursionError when started.)
    part = ValueJob.s(1)
    with pytest.raises(CogworkerError, match=rf"^a workflow may nest {MAX_DEPTH} lists and dicts deep as its steps "
                                             rf"travel .*: this one nests {MAX_DEPTH + 1}$"):
        for _ in range(2000):
            part = chain(ValueJob.s(1), part)
    with pytest.raises(CogworkerError, match=r"a workflow may nest"):
        group(part, ValueJob.s(2))
    assert r.dbsize() == 0
    # The deepest taken starts: its first step's hand-over carries the rest, held to MAX_DEPTH too.
    batch = part.perform_async()
    assert Batch.status(batch.bid).total == 1 and r.llen(K.queue("default")) == 1
    with pytest.raises(BatchError, match=r"a workflow step must be a Job class \(a subclass of Job\)"):
        Job.s()  # (the base class has no name: AttributeError when the workflow was built)


def hand_over(r, chain_bid: str) -> tuple[str, dict]:
    """The chain's step now (its bid) and the payload of its hand-over (its success callback)."""
    [member] = r.smembers(K.batch(chain_bid).pending)
    step = member.removeprefix("b:")
    [(_queue, _jid, payload)] = json.loads(r.hget(K.batch(step).meta, "cb:success"))
    return step, json.loads(payload)


def test_a_500_step_chain_s_hand_over_carries_no_more_than_a_3_step_one_s(r):
    short = chain(*[ValueJob.s(i) for i in range(3)]).perform_async()
    long = chain(*[ValueJob.s(i, key="values") for i in range(500)]).perform_async()
    (_, carried), (_, few) = hand_over(r, long.bid), hand_over(r, short.bid)
    assert len(json.dumps(carried["kwargs"])) == len(json.dumps(few["kwargs"]))  # (the bids are as long)
    assert carried["kwargs"]["index"] == 1


def test_a_hand_over_run_again_before_it_settled_adds_the_same_next_step_and_no_other(r, monkeypatch):
    # Its process killed between adding the next step and settling the finished one, a hand-over
    # is run again (orphan recovery): the chain must not skip a step, nor add one twice.
    from django_cogworker.features.batches import steps
    from django_cogworker.push import scope

    flow = chain(ValueJob.s(1), ValueJob.s(2), ValueJob.s(3)).perform_async()
    first, payload = hand_over(r, flow.bid)

    def run():
        token = scope.running.set(scope.Running(payload))
        try:
            ChainNext(payload).perform({"bid": first, "event": "success"}, **payload["kwargs"])
        finally:
            scope.running.reset(token)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(steps, "settle", killed)
    with pytest.raises(KeyboardInterrupt):
        run()
    added = r.smembers(K.batch(flow.bid).jobs) - {f"b:{first}"}
    monkeypatch.undo()
    run()
    run()  # (and once more, after it settled: nothing)

    assert len(added) == 1 and r.smembers(K.batch(flow.bid).jobs) == {f"b:{first}", *added}
    assert r.smembers(K.batch(flow.bid).pending) == added  # the second step, the first settled
    [second] = added
    assert r.scard(K.batch(second.removeprefix("b:")).jobs) == 1
    queued = [json.loads(raw) for raw in r.lrange(K.queue("default"), 0, -1)]
    assert sorted(job["args"][0] for job in queued) in ([1, 2], [1, 2, 2])  # (the second step's job: again, at most)
    assert len({job["jid"] for job in queued if job["args"] == [2]}) == 1  # (one job, if pushed again)


