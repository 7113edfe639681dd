"""Workflows (django_cogworker/features/batches/workflows.py): chain, group and chord over batches, with real
workers: each step after the previous succeeded, the previous value for a step that asks for it,
a dying step stopping its chain, nested parts, and bad parts refused at the call.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_workflows.py.
"""

from __future__ import annotations

import json

from django.test import override_settings
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import Batch, chain, chord, group
from django_cogworker.broker.keys import Keys
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


def test_a_group_of_jobs_and_child_groups_gives_the_next_step_its_values_in_order(tmp_path, r):
    chain(group(ValueJob.s(1), ValueJob.s(2), group(ValueJob.s(3)), ValueJob.s(4)),
          ValueJob.s(key="got").with_previous()).perform_async()
    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("got") == 1, timeout=30, message="the last step")
        w.term()
        w.wait(30)
    assert json.loads(r.lindex("got", 0)) == [1, 2, None, 4]  # (a child group is no single job: None)
