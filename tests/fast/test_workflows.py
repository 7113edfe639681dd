"""Workflows (django_cogworker/features/batches/workflows.py): chain, group and chord over batches, with real
workers: each step after the previous succeeded, the previous value for a step that asks for it,
a dying step stopping its chain, nested parts, and bad parts refused at the call."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import Batch, BatchError, CogworkerError, Job, chain, chord, group
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import ChainNext
from django_cogworker.push.client import Client
from testproject.demo.jobs import AddJob, BatchCallbackJob, BatchMemberJob, RecordJob, ValueJob

K = Keys()


def recorded(r, key: str) -> list:
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


def callbacks(r, key="cb") -> list[str]:
    return sorted(json.loads(x)["event"] for x in r.lrange(key, 0, -1))


def run_until(tmp_path, predicate, timeout=30, message=""):
    with Worker("-c", "4", env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(predicate, timeout=timeout, message=message)
        w.term()
        w.wait(30)
    return w


def test_a_chain_runs_its_steps_in_order_each_taking_the_previous_value(tmp_path, r):
    flow = chain(ValueJob.s(1, key="seen"), AddJob.s(2, "seen").with_previous(), AddJob.s(3, "seen").with_previous())
    batch = flow.on("success", BatchCallbackJob, key="cb").perform_async()
    assert r.llen(K.queue("default")) == 1  # only the first step is pushed
    run_until(tmp_path, lambda: callbacks(r) == ["success"], message="the chain's success")
    assert recorded(r, "seen") == [1, 3, 6]
    status = Batch.status(batch.bid)
    assert status.success and status.pending == 0 and status.total == 3  # the chain batch: one child per step


def test_a_chord_runs_its_callback_once_with_every_member_s_value(tmp_path, r):
    flow = chord(group(*[ValueJob.s(i) for i in range(1, 6)]), AddJob.s(100, "sum").with_previous())
    flow.on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb").perform_async()
    run_until(tmp_path, lambda: callbacks(r) == ["complete", "success"], message="the chord's callbacks")
    assert recorded(r, "sum") == [115]


def test_a_step_that_dies_stops_the_chain_and_fires_its_death(tmp_path, r):
    flow = chain(BatchMemberJob.s("m", fails=-1), RecordJob.s("never"))
    flow.on("death", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    flow.on("complete", BatchCallbackJob, key="cb")
    batch = flow.perform_async()
    run_until(tmp_path, lambda: callbacks(r) == ["complete", "death"], message="death and complete")
    assert r.llen("never") == 0 and r.zcard(K.dead) == 1
    status = Batch.status(batch.bid)
    assert status.dead == 1 and not status.success


def test_nested_and_mixed_parts_run_in_order(tmp_path, r):
    # a chain whose middle step is a group holding a chain; each records when it runs
    flow = chain(
        ValueJob.s("first", key="order"),
        group(chain(ValueJob.s("inner-1", key="order"), ValueJob.s("inner-2", key="order")),
              ValueJob.s("beside", key="order")),
        ValueJob.s("last", key="order"),
    )
    flow.on("success", BatchCallbackJob, key="cb").perform_async()
    run_until(tmp_path, lambda: callbacks(r) == ["success"], message="the workflow's success")
    order = recorded(r, "order")
    assert order[0] == "first" and order[-1] == "last"
    assert sorted(order[1:4]) == ["beside", "inner-1", "inner-2"]
    assert order.index("inner-1") < order.index("inner-2")


def test_a_group_step_gives_the_next_step_its_members_values_in_order(tmp_path, r):
    flow = chain(group(ValueJob.s(1), ValueJob.s(2), ValueJob.s(3)), ValueJob.s(key="values").with_previous())
    flow.perform_async()
    run_until(tmp_path, lambda: r.llen("values") == 1, message="the last step")
    assert recorded(r, "values") == [[1, 2, 3]]


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


def test_callback_queue_takes_every_callback_and_hand_over_of_a_workflow(tmp_path, r):
    flow = chain(group(ValueJob.s(1), ValueJob.s(2)), ValueJob.s(key="values").with_previous())
    flow.on("success", BatchCallbackJob, key="cb").perform_async(callback_queue="hand-overs")
    with Worker("-q", "default", env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: "django_cogworker.chain_next" in [json.loads(p)["class"] for p in r.lrange(
            K.queue("hand-overs"), 0, -1)], timeout=20, message="the step's hand-over queued")
        assert r.llen("values") == 0  # (nobody serves that queue here: the chain waits for it)
        w.term()
        w.wait(30)
    with Worker("-q", "default", "-q", "hand-overs", env=FAST_ENV, log_path=tmp_path / "worker2.log") as w:
        w.wait_ready()
        wait_until(lambda: callbacks(r) == ["success"], timeout=30, message="the chain's success")
        w.term()
        w.wait(30)
    assert recorded(r, "values") == [[1, 2]]


def test_without_a_callback_queue_hand_overs_go_to_a_queue_the_workers_read(tmp_path, r):
    """With QUEUES = ["mail"], the hand-overs (a chain's next step, a child's news to its parent)
    went to their class's "default", which no worker read: the workflow stopped after its first
    step (and manage.py check warned of the package's own jobs, cogworker.W001)."""
    mail = {"queue": "mail"}
    flow = chain(ValueJob.s(1, key="order").set(**mail),
                 group(chain(ValueJob.s(2, key="order").set(**mail), ValueJob.s(3, key="order").set(**mail)),
                       ValueJob.s(4, key="order").set(**mail)),
                 ValueJob.s(5, key="order").set(**mail))
    with override_settings(COGWORKER={"QUEUES": ["mail"]}):
        batch = flow.perform_async()
    with Worker("-q", "mail", "-c", "4", env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: Batch.status(batch.bid).success, timeout=30, message="the workflow's success")
        w.term()
        w.wait(30)
    order = recorded(r, "order")
    assert order[0] == 1 and order[-1] == 5 and order.index(2) < order.index(3)
    assert not r.exists(K.queue("default"))

def test_a_chord_pushes_its_group_in_bulk_and_runs_its_callback_once_with_every_value(tmp_path, r, monkeypatch):
    calls = {"push": 0, "push_bulk": 0}
    for name in calls:
        original = getattr(Client, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Client, name, counted)
    chord(group(*[ValueJob.s(i) for i in range(1500)]), AddJob.s(0, "sum").with_previous()).perform_async()
    assert calls == {"push": 0, "push_bulk": 2}  # (1,000 members a push)
    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("sum") == 1, timeout=60, message="the chord's callback")
        w.term()
        w.wait(30)
    assert json.loads(r.lindex("sum", 0)) == sum(range(1500))


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


def test_a_group_of_jobs_and_child_groups_gives_the_next_step_its_values_in_order(tmp_path, r):
    chain(group(ValueJob.s(1), ValueJob.s(2), group(ValueJob.s(3)), ValueJob.s(4)),
          ValueJob.s(key="got").with_previous()).perform_async()
    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("got") == 1, timeout=30, message="the last step")
        w.term()
        w.wait(30)
    assert json.loads(r.lindex("got", 0)) == [1, 2, None, 4]  # (a child group is no single job: None)
