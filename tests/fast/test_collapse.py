"""Pushes that collapse (features/collapse/): debounce, throttle and keep_last_if_active, through the
project's client on the suite's Redis, and keep_last's run through a processor called on the test's
thread (``make_processor``); the options refused at the class or the push, naming the option."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable

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
# What a KeepLast run does besides, mid-run: token -> a callable.
MIDRUN: dict[str, Callable[[], None]] = {}


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
        MIDRUN.pop(token, lambda: None)()


class KeepLastBoom(KeepLast):
    def perform(self, token: str, n: int) -> None:
        RAN.append((token, n))
        for i in DURING.pop(token, []):
            OUTCOMES.setdefault(token, []).append(type(self).set(dedup_key=token).push(token, i))
        raise RuntimeError("boom")


class KeepLastLate(KeepLastBoom):
    """Fails, and retries two hours later: past UNIQUE_LOCK_TTL (an hour)."""

    def retry_in(self, count: int, exc: BaseException) -> float | None:
        return 7200.0


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


def test_a_debounce_push_after_its_job_started_pushes_a_new_one(make_processor, r):
    token = uuid.uuid4().hex
    first = Debounced.perform_async(token, 1)
    make_due(r)
    called = make_processor(QUEUES=[QUEUE])
    called.sweep()
    called.run_next()
    again = Debounced.set().push(token, 1)
    assert again.status == "pushed" and again.jid != first and len(scheduled(r)) == 1 and ran(token) == [1]


def test_a_debounce_push_while_its_job_waits_in_its_queue_replaces_it(make_processor, r):
    """Moved to its queue but not started, the job is replaced: dropped as it starts, and the push's
    job (the last arguments) runs; the state goes as that one starts."""
    token = uuid.uuid4().hex
    first = Debounced.set(dedup_key=token).push(token, 1)
    make_due(r)
    called = make_processor(QUEUES=[QUEUE])
    assert called.sweep() == 1 and called.waiting() == 1
    again = Debounced.set(dedup_key=token).push(token, 2)
    assert (again.status, again.other) == ("replaced", first.jid)
    dropped = called.run_next()
    assert dropped.decision.outcome is Outcome.DEAD and not dropped.ran and ran(token) == []
    make_due(r)
    called.sweep()
    called.drain()
    assert ran(token) == [2]
    state = K.collapse(dropped.payload["collapse"][2])
    # Let go as its job started (the replaced job's mark stays, for its TTL: see the test below).
    assert r.hget(state, "jid") is None and sorted(r.hgetall(state)) == ["mode", "out:" + first.jid]
    assert Debounced.set(dedup_key=token).push(token, 3).status == "pushed"


def test_a_replaced_debounce_job_back_from_orphan_recovery_is_dropped_again(redis_url, make_processor, rb, r):
    """A worker killed between the replaced job's drop and its ack: orphan recovery brings the job
    back, and its next start drops it again (its mark was kept): only the replacement runs."""
    from peek import redis_now

    from django_cogworker.conf import build_config
    from django_cogworker.engine.recovery.orphans import OrphanRecovery
    from django_cogworker.engine.settle.retry import RetryPolicy

    token = uuid.uuid4().hex
    Debounced.set(dedup_key=token).push(token, 1)
    make_due(r)
    called = make_processor(QUEUES=[QUEUE])
    called.sweep()
    assert Debounced.set(dedup_key=token).push(token, 2).status == "replaced"
    unit = called.take()
    dropped = called.processor.process(unit)
    assert dropped.decision.outcome is Outcome.DEAD and not dropped.ran
    # (as if its process died before the ack: the job left on that process's in-progress list)
    dead_one = "deadhost:1:debounce"
    r.sadd(K.in_progress_identities, dead_one)
    r.lpush(K.in_progress(dead_one), unit.raw)
    r.hset(K.last_beat, dead_one, repr(redis_now(r) - 10))
    config = build_config({"ORPHAN_THRESHOLD": 3.0, "HEARTBEAT_INTERVAL": 0.5},
                          {"COGWORKER_REDIS_URL": redis_url})
    assert OrphanRecovery(config, rb, K, "livehost:2:x", RetryPolicy(config)).check() == 1
    again = called.run_next()
    assert again.payload["jid"] == dropped.payload["jid"] and not again.ran and ran(token) == []
    make_due(r)
    called.sweep()
    called.drain()
    assert ran(token) == [2]


def test_a_debounce_state_lets_go_of_marks_a_ttl_old(r):
    """A replaced job's mark stamped with its drop more than the TTL ago goes at the next start of
    the job the state names (a digest pushed for ever doesn't gather one mark per replaced job);
    a mark whose job hasn't started yet stays."""
    from django_cogworker.features.collapse.scripts import RUN_BEGINS

    state = K.collapse("marks")
    old = int((time.time() - 7200) * 1000)
    r.hset(state, mapping={"mode": "debounce", "jid": "j3", "out:j1": old, "out:j2": "1"})
    assert RUN_BEGINS(r, [state], ["j3", 3600000, "debounce"]) == 1
    assert r.hgetall(state) == {"mode": "debounce", "out:j2": "1"}
    assert RUN_BEGINS(r, [state], ["j2", 3600000, "debounce"]) == 2
    assert RUN_BEGINS(r, [state], ["j2", 3600000, "debounce"]) == 2  # (again: a start after a crash)
    r.hset(state, mapping={"jid": "j4", "out:j2": old})
    assert RUN_BEGINS(r, [state], ["j4", 3600000, "debounce"]) == 1
    assert r.exists(state) == 0  # (nothing left but old marks: the state goes)


def test_a_debounce_state_outlives_its_due_time_by_unique_lock_ttl(r):
    """Pollers all down past the due time plus a minute: the state is still there, so the next push
    replaces the overdue job instead of scheduling a second beside it."""
    token = uuid.uuid4().hex
    first = Debounced.set(dedup_key=token).push(token, 1)
    state = K.collapse(scheduled(r)[0]["collapse"][2])
    assert r.pttl(state) > (5 + 3600 - 5) * 1000  # (debounce + UNIQUE_LOCK_TTL, not debounce + a minute)
    make_due(r)  # (overdue: no poller moved it)
    again = Debounced.set(dedup_key=token).push(token, 2)
    assert (again.status, again.other) == ("replaced", first.jid) and len(scheduled(r)) == 1


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
    [job] = scheduled(r)
    assert job["args"][1] == 4
    assert jids == [job["jid"]] * 5  # (each item's jid: the job that runs for it, not one replaced)
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


def test_a_push_sent_again_after_a_lost_reply_gets_the_first_answer(r):
    """redis-py sends a command again when its reply was lost: the second application answers as the
    first did ("replaced", naming the job replaced), writing nothing twice."""
    from django_cogworker.features.collapse import writer
    from django_cogworker.push.runtime import get_client

    client = get_client()
    token = uuid.uuid4().hex
    first = Debounced.set(dedup_key=token).push(token, 1)
    payload = Debounced.set(dedup_key=token).build([token, 2], {})
    said = writer.write(r, K, client.config, dict(payload), time.time())
    again = writer.write(r, K, client.config, dict(payload), time.time())
    assert said == again == ("replaced", payload["jid"], first.jid) and len(scheduled(r)) == 1


def test_a_follow_up_push_sent_again_gets_the_first_answer(make_processor, r):
    from django_cogworker.features.collapse import writer
    from django_cogworker.push.runtime import get_client

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLast.set(dedup_key=token).push(token, 0)
    answers = []

    def resend() -> None:
        KeepLast.set(dedup_key=token).push(token, 1)
        payload = KeepLast.set(dedup_key=token).build([token, 2], {})
        for _ in range(2):
            answers.append(writer.write(r, K, get_client().config, dict(payload), time.time()))

    MIDRUN[token] = resend
    called.run_next()
    assert answers[0] == answers[1] and answers[0].status == "replaced"


def test_a_keep_last_state_lives_until_a_retry_due_past_unique_lock_ttl(make_processor, r):
    """A run that fails with a follow-up kept, retried in two hours (UNIQUE_LOCK_TTL is one): its
    state lives until then and a TTL more, so the retry's success still writes the follow-up."""
    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastLate.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    run = called.run_next()
    assert run.decision.outcome is Outcome.RETRY
    state = K.collapse(run.payload["collapse"][2])
    [(_, due)] = r.zrange(K.retry, 0, -1, withscores=True)
    assert due - time.time() > 7000
    assert r.pttl(state) / 1000 > due - time.time() + 3600 - 60


def test_a_keep_last_run_longer_than_unique_lock_ttl_keeps_its_state(make_processor, r):
    """The worker's chores (after each heartbeat) keep the state of a run under way alive: a run
    longer than UNIQUE_LOCK_TTL keeps its follow-up."""
    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLast.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    left: list[int] = []

    def an_hour_later() -> None:
        [state] = [k for k in r.keys(K.collapse("*"))]
        r.pexpire(state, 1000)  # (as if the hour had nearly passed)
        for feature in called.features:
            for chore in feature.chores():
                chore(r)
        left.append(r.pttl(state))

    MIDRUN[token] = an_hour_later
    called.run_next()
    assert left and left[0] > 3500 * 1000
    called.drain()
    assert ran(token) == [0, 1]


def test_a_keep_last_job_killed_from_the_admin_lets_its_follow_up_run(make_processor, r):
    """A job that leaves its path (killed from the retry set here; orphaned too often goes through the
    same hook) hands over to its kept follow-up: written to its queue, and the state names it."""
    from django_cogworker.api.sorted_sets import RetrySet

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastBoom.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    run = called.run_next()
    assert run.decision.outcome is Outcome.RETRY and called.waiting() == 0
    [entry] = RetrySet(redis=r, keys=K).page().items
    assert entry.kill()
    state = K.collapse(run.payload["collapse"][2])
    assert called.waiting() == 1 and r.hget(state, "jid") == OUTCOMES[token][0].jid
    called.drain()
    assert ran(token) == [0, 1]


def test_a_keep_last_job_without_follow_up_killed_releases_its_state(make_processor, r):
    from django_cogworker.api.sorted_sets import RetrySet

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastBoom.set(dedup_key=token).push(token, 0)
    run = called.run_next()
    [entry] = RetrySet(redis=r, keys=K).page().items
    assert entry.kill()
    assert r.exists(K.collapse(run.payload["collapse"][2])) == 0
    assert KeepLast.set(dedup_key=token).push(token, 5).status == "pushed"


def test_a_follow_up_keeps_the_time_its_push_asked_for(make_processor, r):
    """A follow-up pushed with perform_in(3600) during the run is written to the schedule an hour
    out when the run ends, not to its queue at once."""
    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLast.set(dedup_key=token).push(token, 0)
    MIDRUN[token] = lambda: KeepLast.set(dedup_key=token).perform_in(3600, token, 7)
    called.run_next()
    assert called.waiting() == 0
    [job] = scheduled(r)
    assert job["args"] == [token, 7]
    assert r.zscore(K.schedule, r.zrange(K.schedule, 0, 0)[0]) - time.time() == pytest.approx(3600, abs=30)
    state = K.collapse(job["collapse"][2])
    assert r.hget(state, "jid") == job["jid"] and r.pttl(state) / 1000 > 3600 + 3600 - 60


def test_a_keep_last_job_orphaned_too_often_lets_its_follow_up_run(redis_url, make_processor, rb, r):
    """Sent to dead by orphan recovery past MAX_ORPHANINGS (its process died while running it each
    time), the job hands over to its kept follow-up, written to its queue."""
    from peek import redis_now

    from django_cogworker.conf import build_config
    from django_cogworker.engine.recovery.orphans import OrphanRecovery
    from django_cogworker.engine.settle.retry import RetryPolicy

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    first = KeepLast.set(dedup_key=token).push(token, 0)
    unit = called.take()  # (taken, its run begun: then its process dies)
    payload = json.loads(unit.raw)
    state = K.collapse(payload["collapse"][2])
    r.hset(state, "running", "1")
    follow = KeepLast.set(dedup_key=token).push(token, 1)
    assert (follow.status, follow.other) == ("pushed", first.jid)
    dead_one = "deadhost:1:collapse"
    r.sadd(K.in_progress_identities, dead_one)
    r.lpush(K.in_progress(dead_one), json.dumps({**payload, "orphan_count": 3}))
    r.hset(K.last_beat, dead_one, repr(redis_now(r) - 10))
    config = build_config({"ORPHAN_THRESHOLD": 3.0, "HEARTBEAT_INTERVAL": 0.5, "MAX_ORPHANINGS": 3},
                          {"COGWORKER_REDIS_URL": redis_url})
    assert OrphanRecovery(config, rb, K, "livehost:2:x", RetryPolicy(config)).check() == 1
    assert r.zcard(K.dead) == 1
    assert r.hget(state, "jid") == follow.jid
    assert [json.loads(raw)["jid"] for raw in r.lrange(K.queue(QUEUE), 0, -1)] == [follow.jid]


def test_a_keep_last_job_deleted_from_the_retry_set_lets_its_follow_up_run(make_processor, r):
    """Deleted from the retry set (a week's retry, say) with a follow-up kept: the follow-up, a push
    of its own, is written to its queue and runs, as after a kill (not held until the deleted job's
    retry would have been due plus UNIQUE_LOCK_TTL, when its state expired)."""
    from django_cogworker.api.sorted_sets import RetrySet

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastLate.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    run = called.run_next()
    assert run.decision.outcome is Outcome.RETRY and called.waiting() == 0
    [entry] = RetrySet(redis=r, keys=K).page().items
    assert entry.delete() and r.zcard(K.retry) == 0
    state = K.collapse(run.payload["collapse"][2])
    assert called.waiting() == 1 and r.hget(state, "jid") == OUTCOMES[token][0].jid
    called.drain()
    assert ran(token) == [0, 1]


def test_a_keep_last_job_deleted_without_follow_up_lets_equal_pushes_through(make_processor, r):
    from django_cogworker.api.sorted_sets import RetrySet

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastLate.set(dedup_key=token).push(token, 0)
    called.run_next()
    [entry] = RetrySet(redis=r, keys=K).page().items
    assert entry.delete()
    assert KeepLastLate.set(dedup_key=token).push(token, 5).status == "pushed"


def test_deleting_all_of_the_retry_set_releases_keep_last_states(make_processor, r):
    """delete_all: each keep_last job in the set releases its state (a kept follow-up written),
    plain jobs go as before, and the count is every entry."""
    from django_cogworker.api.sorted_sets import RetrySet

    kept, alone = uuid.uuid4().hex, uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastLate.set(dedup_key=kept).push(kept, 0)
    DURING[kept] = [1]
    called.run_next()
    KeepLastLate.set(dedup_key=alone).push(alone, 0)
    called.run_next()
    r.zadd(K.retry, {json.dumps({"jid": "plain", "class": "X", "queue": QUEUE, "args": []}): time.time() + 60})
    assert RetrySet(redis=r, keys=K).delete_all() == 3 and r.zcard(K.retry) == 0
    assert KeepLastLate.set(dedup_key=alone).push(alone, 5).status == "pushed"
    called.drain()
    assert ran(kept) == [0, 1] and ran(alone) == [0, 5]


def test_clearing_a_queue_releases_its_keep_last_and_debounce_states(make_processor, r):
    from django_cogworker.api.queues import Queue

    token, bounced = uuid.uuid4().hex, uuid.uuid4().hex
    KeepLast.set(dedup_key=token).push(token, 0)
    Debounced.set(dedup_key=bounced).push(bounced, 0)
    make_due(r)
    called = make_processor(QUEUES=[QUEUE])
    called.sweep()
    assert Queue(QUEUE, redis=r, keys=K).clear() == 2 and called.waiting() == 0
    assert KeepLast.set(dedup_key=token).push(token, 1).status == "pushed"
    assert Debounced.set(dedup_key=bounced).push(bounced, 1).status == "pushed"  # (not "replaced": it's gone)


def test_a_debounced_job_deleted_from_the_schedule_lets_the_next_push_write(r):
    from django_cogworker.api.sorted_sets import ScheduledSet

    token = uuid.uuid4().hex
    Debounced.set(dedup_key=token).push(token, 0)
    [entry] = ScheduledSet(redis=r, keys=K).page().items
    assert entry.delete()
    state = K.collapse(entry.payload["collapse"][2])
    assert r.hget(state, "jid") is None
    assert Debounced.set(dedup_key=token).push(token, 1).status == "pushed"


def test_a_kill_that_finds_its_entry_gone_leaves_the_state_alone(make_processor, r):
    """The poller moved the entry to its queue between the page and the kill: the job is to run,
    so nothing is released (no follow-up written beside its run)."""
    from django_cogworker.api.sorted_sets import RetrySet

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLastBoom.set(dedup_key=token).push(token, 0)
    DURING[token] = [1]
    run = called.run_next()
    [entry] = RetrySet(redis=r, keys=K).page().items
    r.zadd(K.retry, {entry.raw: 0})
    assert called.sweep() == 1  # (the poller's round, before the kill)
    assert not entry.kill()
    state = K.collapse(run.payload["collapse"][2])
    assert r.hget(state, "jid") == run.payload["jid"] and r.hget(state, "next_jid") == OUTCOMES[token][0].jid
    assert called.waiting() == 1 and r.zcard(K.dead) == 0


def test_a_keep_last_job_orphaned_too_often_and_discarded_lets_its_follow_up_run(redis_url, make_processor,
                                                                                  rb, r):
    """Past MAX_ORPHANINGS, a job with dead=False is discarded, not sent to dead: its kept follow-up
    is written all the same (else lost when the state expires)."""
    from peek import redis_now

    from django_cogworker.conf import build_config
    from django_cogworker.engine.recovery.orphans import OrphanRecovery
    from django_cogworker.engine.settle.retry import RetryPolicy

    token = uuid.uuid4().hex
    called = make_processor(QUEUES=[QUEUE])
    KeepLast.set(dedup_key=token, dead=False).push(token, 0)
    unit = called.take()
    payload = json.loads(unit.raw)
    state = K.collapse(payload["collapse"][2])
    r.hset(state, "running", "1")
    follow = KeepLast.set(dedup_key=token).push(token, 1)
    dead_one = "deadhost:1:discard"
    r.sadd(K.in_progress_identities, dead_one)
    r.lpush(K.in_progress(dead_one), json.dumps({**payload, "orphan_count": 3}))
    r.hset(K.last_beat, dead_one, repr(redis_now(r) - 10))
    config = build_config({"ORPHAN_THRESHOLD": 3.0, "HEARTBEAT_INTERVAL": 0.5, "MAX_ORPHANINGS": 3},
                          {"COGWORKER_REDIS_URL": redis_url})
    OrphanRecovery(config, rb, K, "livehost:2:x", RetryPolicy(config)).check()
    assert r.llen(K.in_progress(dead_one)) == 0 and r.zcard(K.dead) == 0  # (discarded)
    assert r.hget(state, "jid") == follow.jid
    assert [json.loads(raw)["jid"] for raw in r.lrange(K.queue(QUEUE), 0, -1)] == [follow.jid]


class UrgentThrottled(Job):
    queue = QUEUE
    throttle = 60
    priority = 50

    def perform(self, token: str, n: int) -> None:
        get_redis().rpush(token, n)


def test_a_prioritized_throttled_push_overtakes_the_jobs_waiting_as_a_prioritized_push_does(r):
    """The collapse script pushed it to the far end of the queue list, behind every job waiting,
    where the fetch routes it only on reaching it (a review's finding): to the end taken next."""
    for n in range(5):
        Throttled.set(dedup_key=f"k{n}").perform_async("plain", n)

    UrgentThrottled.perform_async("urgent", 1)

    assert r.llen(K.queue(QUEUE)) == 6
    assert json.loads(r.lindex(K.queue(QUEUE), -1))["class"].endswith("UrgentThrottled")
