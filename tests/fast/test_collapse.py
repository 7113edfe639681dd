"""Pushes that collapse (features/collapse/): debounce, throttle and keep_last_if_active, through the
project's client on the suite's Redis, and keep_last's run through a processor called on the test's
thread (``make_processor``); the options refused at the class or the push, naming the option."""

from __future__ import annotations

import json
import logging
import math
import uuid

import pytest
from engine_fixtures import make_processor_fixture  # noqa: F401 - the make_processor fixture

from django_cogworker import Batch, Job
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run.hooks import Outcome
from django_cogworker.errors import CogworkerError, InvalidArgument
from django_cogworker.push.runtime import get_redis

K = Keys()
QUEUE = "collapse-fast"
RAN: list[tuple[str, int]] = []
# What a KeepLast run pushes while it runs: token -> the numbers to push, and their outcomes.
DURING: dict[str, list[int]] = {}
OUTCOMES: dict[str, list] = {}


class Debounced(Job):
    queue = QUEUE
    debounce = 5

    def perform(self, token: str, n: int) -> None:
        RAN.append((token, n))


class Throttled(Job):
    queue = QUEUE
    throttle = 30

    def perform(self, token: str, n: int) -> None:
        RAN.append((token, n))


class KeepLast(Job):
    queue = QUEUE
    keep_last_if_active = True

    def perform(self, token: str, n: int) -> None:
        RAN.append((token, n))
        for i in DURING.pop(token, []):
            OUTCOMES.setdefault(token, []).append(KeepLast.set(dedup_key=token).push(token, i))


class KeepLastBoom(KeepLast):
    def perform(self, token: str, n: int) -> None:
        RAN.append((token, n))
        for i in DURING.pop(token, []):
            OUTCOMES.setdefault(token, []).append(KeepLastBoom.set(dedup_key=token).push(token, i))
        raise RuntimeError("boom")


def ran(token: str) -> list[int]:
    return [n for t, n in RAN if t == token]


def scheduled(r) -> list[dict]:
    return [json.loads(raw) for raw in r.zrange(K.schedule, 0, -1)]


def make_due(r) -> None:
    """Make every schedule entry due now (instead of waiting out the debounce)."""
    for raw in r.zrange(K.schedule, 0, -1):
        r.zadd(K.schedule, {raw: 0}, xx=True)


def test_100_debounced_pushes_leave_one_job_with_the_last_arguments_and_it_runs_once(make_processor, r):
    token = uuid.uuid4().hex
    outcomes = [Debounced.set(dedup_key=token).push(token, n) for n in range(100)]
    assert [o.status for o in outcomes] == ["pushed"] + ["replaced"] * 99
    assert all(later.other == earlier.jid for earlier, later in zip(outcomes, outcomes[1:], strict=False))
    [job] = scheduled(r)
    assert job["args"] == [token, 99] and job["jid"] == outcomes[-1].jid
    assert r.zscore(K.schedule, r.zrange(K.schedule, 0, 0)[0]) - job["created_at"] == pytest.approx(5, abs=0.5)
    called = make_processor(QUEUES=[QUEUE])
    make_due(r)
    assert called.sweep() == 1
    run = called.run_next()
    assert run.decision.outcome is Outcome.SUCCESS and ran(token) == [99] and called.waiting() == 0


def test_a_debounce_push_after_its_job_left_the_schedule_pushes_a_new_one(make_processor, r):
    token = uuid.uuid4().hex
    first = Debounced.perform_async(token, 1)
    make_due(r)
    make_processor(QUEUES=[QUEUE]).sweep()
    again = Debounced.set().push(token, 1)
    assert again.status == "pushed" and again.jid != first and len(scheduled(r)) == 1


def test_dedup_key_makes_pushes_with_other_arguments_equal(r):
    token = uuid.uuid4().hex
    a = Debounced.set(dedup_key="user:42").push(token, 1)
    b = Debounced.set(dedup_key="user:42").push(token, 2)
    c = Debounced.set(dedup_key="user:43").push(token, 3)
    assert (a.status, b.status, c.status) == ("pushed", "replaced", "pushed")
    assert sorted(job["args"][1] for job in scheduled(r)) == [2, 3]


def test_100_throttled_pushes_write_the_first_and_return_its_jid(make_processor, r):
    token = uuid.uuid4().hex
    jids = [Throttled.set(dedup_key=token).perform_async(token, n) for n in range(100)]
    assert set(jids) == {jids[0]}
    assert Throttled.set(dedup_key=token).push(token, 100) == ("dropped", jids[0], None)
    assert Throttled.set().push(token, 100).status == "pushed"  # (no key: its arguments are another job's)
    r.delete(K.queue(QUEUE))
    r.lpush(K.queue(QUEUE), json.dumps({"jid": jids[0], "class": Throttled.name, "args": [token, 0], "kwargs": {},
                                        "queue": QUEUE, "retry": True, "created_at": 1.0,
                                        "collapse": ["throttle", 30, "x"]}))
    called = make_processor(QUEUES=[QUEUE])
    called.drain()
    assert ran(token) == [0]


def test_perform_bulk_collapses_item_by_item(r):
    token = uuid.uuid4().hex
    jids = Debounced.set(dedup_key=token).perform_bulk([(token, n) for n in range(5)])
    assert len(jids) == 5 and [job["args"][1] for job in scheduled(r)] == [4]
    pushed = Throttled.perform_bulk([(token, 1), (token, 1), (token, 2)])
    assert len(pushed) == 2  # (the drop is left out, as a unique job's duplicate is)


def test_keep_last_if_active_keeps_one_follow_up_with_the_last_arguments(make_processor, r):
    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    first = KeepLast.set(dedup_key=token).push(token, 0)
    assert first.status == "pushed"
    # While it waits, an equal push writes nothing: the waiting job stands for it.
    assert KeepLast.set(dedup_key=token).push(token, 99) == ("dropped", first.jid, None)
    DURING[token] = [1, 2, 3]
    run = called.run_next()
    assert run.decision.outcome is Outcome.SUCCESS
    assert [o.status for o in OUTCOMES[token]] == ["pushed", "replaced", "replaced"]
    assert OUTCOMES[token][0].other == first.jid
    assert called.waiting() == 1  # (the follow-up, written by the run's settlement)
    called.drain()
    assert ran(token) == [0, 3]
    assert r.exists(K.collapse(run.payload["collapse"][2])) == 0  # (released: nothing kept)


def test_a_keep_last_run_that_fails_keeps_its_follow_up_for_its_retry(make_processor, r):
    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastBoom.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    unit = called.take()
    state = K.collapse(json.loads(unit.raw)["collapse"][2])
    run = called.processor.process(unit)
    assert run.decision.outcome is Outcome.RETRY
    assert called.waiting() == 0 and r.hget(state, "next_jid") == OUTCOMES[token][0].jid
    assert r.hget(state, "running") is None  # (waiting again: its retry runs, then the follow-up)


def test_a_state_key_of_the_wrong_type_is_quarantined_and_the_push_goes_through(r, caplog):
    token = uuid.uuid4().hex
    Debounced.set(dedup_key=token).push(token, 1)
    state = K.collapse(json.loads(r.zrange(K.schedule, 0, 0)[0])["collapse"][2])
    r.delete(state)
    r.zremrangebyrank(K.schedule, 0, -1)
    r.rpush(state, "garbage")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert Debounced.set(dedup_key=token).push(token, 2).status == "pushed"
    assert r.type(state) == "hash" and [k for k in r.keys(K.quarantine_prefix + "*") if state in k]
    assert "is no collapse state" in caplog.text


@pytest.mark.parametrize("option, value, said", [
    ("debounce", -1, "debounce must be a positive number of seconds"),
    ("debounce", math.nan, "debounce must be a positive number of seconds"),
    ("throttle", "5", "throttle must be a positive number of seconds"),
    ("throttle", True, "throttle must be a positive number of seconds"),
    ("keep_last_if_active", 1, "keep_last_if_active must be True or False"),
    ("dedup_key", 42, "dedup_key must be a non-empty string"),
    ("dedup_key", "", "dedup_key must be a non-empty string"),
    ("dedup_key", "k" * 201, "dedup_key must be at most 200 characters"),
])
def test_bad_values_are_refused_at_the_push_naming_the_option(option, value, said, r):
    with pytest.raises(InvalidArgument, match=said):
        Debounced.set(**{option: value}).perform_async("t", 1)
    assert r.zcard(K.schedule) == 0


def test_bad_values_and_combinations_are_refused_at_class_definition():
    with pytest.raises(InvalidArgument, match="debounce must be a positive number"):
        type("BadSeconds", (Job,), {"debounce": -2, "__module__": __name__})
    with pytest.raises(InvalidArgument, match="debounce can't be combined with unique_for"):
        type("BadMix", (Job,), {"debounce": 2, "unique_for": 60, "__module__": __name__})
    with pytest.raises(InvalidArgument, match="debounce and throttle can't be combined"):
        type("BadTwo", (Job,), {"debounce": 2, "throttle": 2, "__module__": __name__})
    with pytest.raises(InvalidArgument, match="dedup_key is given but none of"):
        type("BadKey", (Job,), {"dedup_key": "x", "__module__": __name__})


def test_a_push_combining_what_its_class_cant_is_refused_at_set():
    with pytest.raises(InvalidArgument, match="throttle can't be combined with unique_for"):
        Throttled.set(unique_for=60)
    with pytest.raises(InvalidArgument, match="debounce and keep_last_if_active can't be combined"):
        Debounced.set(keep_last_if_active=True)


def test_a_collapsing_push_in_a_batch_is_refused(r):
    batch = Batch()
    with pytest.raises(CogworkerError, match="can't be part of a batch"), batch.jobs():
        Debounced.perform_async("t", 1)


def test_a_plain_push_reports_pushed_and_pays_no_state(r):
    class Plain(Job):
        queue = QUEUE

        def perform(self, n: int) -> None: ...

    outcome = Plain.set().push(1)
    assert outcome.status == "pushed" and outcome.jid and not r.keys(K.collapse("*"))
    assert get_redis().llen(K.queue(QUEUE)) == 1
