"""The poller (engine/scheduled.py): due schedule and retry entries to their queues, and its rounds."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from engine_fixtures import (
    Note,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import wait_until

from django_cogworker import payload as payloads
from django_cogworker.connection import make_redis
from django_cogworker.engine.key_guard import KeyGuard
from django_cogworker.engine.orphans import OrphanRecovery
from django_cogworker.engine.retry import RetryPolicy
from django_cogworker.engine.scheduled import BATCH, Poller
from django_cogworker.keys import Keys

K = Keys()
NOW = 1_700_000_000.0


@pytest.fixture
def bclient(redis_url):
    client = make_redis(make_config(redis_url))
    yield client
    client.close()


class Failing:
    """A key guard or orphan recovery with a bug: every call raises."""

    def __init__(self):
        self.calls = 0

    def check(self):
        self.calls += 1
        raise RuntimeError("a bug in this step")


def make_poller(redis_url, client, *, process_count=lambda: 1, rng=None, key_guard=None, orphans=None,
                **settings):
    config = make_config(redis_url, **settings)
    retry = RetryPolicy(config, clock=lambda: NOW)
    return Poller(config, client, K, retry, key_guard or KeyGuard(client, K, config.queue_names),
                  orphans or OrphanRecovery(config, client, K, "poller:1:me", retry),
                  process_count=process_count, rng=rng, clock=lambda: NOW)


@pytest.fixture
def poller(redis_url, bclient):
    return make_poller(redis_url, bclient)


def entry(jid, queue="default", args=(), **extra):
    return payloads.encode({"jid": jid, "class": "x.Job", "args": list(args), "kwargs": {}, "queue": queue,
                            "retry": True, **extra})


def queued(r, queue="default"):
    """The payloads waiting in ``queue``, next to run first."""
    return [json.loads(raw) for raw in reversed(r.lrange(K.queue(queue), 0, -1))]


def test_due_entries_move_to_their_queues_and_the_rest_wait(poller, r):
    r.zadd(K.schedule, {entry("due-1", "mail", at=NOW - 5): NOW - 5, entry("due-2"): NOW,
                        entry("later"): NOW + 1})
    r.zadd(K.retry, {entry("retry-due", retry_count=0): NOW - 1, entry("retry-later"): NOW + 60})

    assert poller.enqueue_due() == 3

    assert [p["jid"] for p in queued(r, "mail")] == ["due-1"]
    assert [p["jid"] for p in queued(r)] == ["due-2", "retry-due"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.schedule, 0, -1)] == ["later"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.retry, 0, -1)] == ["retry-later"]
    moved = queued(r, "mail")[0]
    assert moved["enqueued_at"] == NOW and "at" not in moved
    assert queued(r)[1]["retry_count"] == 0  # the failure record travels with the job
    assert r.smembers(K.queues) == {"mail", "default"}


def test_large_integers_in_args_survive_exactly(poller, r):
    args = [2 ** 63 + 1, 12345678901234567890123, -(2 ** 70), 0.1, "9007199254740993"]
    r.zadd(K.schedule, {entry("big", args=args): NOW - 1})
    r.zadd(K.retry, {entry("big-retry", args=args): NOW - 1})

    poller.enqueue_due()

    for moved in queued(r):
        assert moved["args"] == args
    assert "12345678901234567890123" in r.lindex(K.queue("default"), 0)


def test_an_entry_whose_queue_key_holds_the_wrong_type_stays_in_the_set(poller, r):
    r.set(K.queue("broken"), "not a list")
    stuck = entry("stuck", "broken")
    r.zadd(K.schedule, {stuck: NOW - 2, entry("fine"): NOW - 1})
    r.zadd(K.retry, {entry("stuck-retry", "broken"): NOW - 1})

    assert poller.enqueue_due() == 1

    # Push first, then remove: the failed push removed nothing.
    assert r.zrange(K.schedule, 0, -1, withscores=True) == [(stuck, NOW - 2)]
    assert r.zcard(K.retry) == 1
    assert [p["jid"] for p in queued(r)] == ["fine"]
    assert r.get(K.queue("broken")) == "not a list"


def test_a_schedule_set_of_the_wrong_type_does_not_hold_up_the_retries(poller, r):
    r.set(K.schedule, "not a zset")
    r.zadd(K.retry, {entry("retry-due"): NOW - 1})

    assert poller.enqueue_due() == 1

    assert [p["jid"] for p in queued(r)] == ["retry-due"]


@pytest.mark.parametrize(("raw", "reason"), [
    ("{this is not json", "unparseable payload"),
    ('["a", "list"]', "not an object"),
    ('{"jid": "x", "args": []}', "no job class"),
    ('{"jid": "x", "class": "x.Job", "args": []}', "names no queue"),
    # Python's json reads NaN, but can't write it back: the move used to raise on every round,
    # before any due entry after it.
    ('{"jid": "x", "class": "x.Job", "args": [NaN], "kwargs": {}, "queue": "default"}', "NaN"),
])
def test_an_unreadable_due_entry_goes_to_dead_with_its_text(poller, r, raw, reason):
    r.zadd(K.schedule, {raw: NOW - 1, entry("fine"): NOW - 1})

    poller.enqueue_due()

    assert r.zcard(K.schedule) == 0
    assert [p["jid"] for p in queued(r)] == ["fine"]
    (dead,) = [json.loads(d) for d in r.zrange(K.dead, 0, -1)]
    assert dead["class"] == "(unparseable)"
    assert dead["raw"] == raw
    assert reason in dead["error_message"]


def test_more_than_a_batch_of_due_entries_all_move(poller, r):
    r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1000 + i for i in range(BATCH * 2 + 17)})

    assert poller.enqueue_due() == BATCH * 2 + 17

    assert [p["jid"] for p in queued(r)] == [f"j{i}" for i in range(BATCH * 2 + 17)]


def test_two_pollers_racing_move_each_entry_once(redis_url, r):
    clients = [make_redis(make_config(redis_url)) for _ in range(2)]
    try:
        pollers = [make_poller(redis_url, c) for c in clients]
        r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1 for i in range(300)})
        start = threading.Barrier(2)

        def run(p):
            start.wait()
            p.enqueue_due()

        threads = [threading.Thread(target=run, args=(p,)) for p in pollers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()

    assert sorted(p["jid"] for p in queued(r)) == sorted(f"j{i}" for i in range(300))


def test_unsettled_records_are_filed(poller, r):
    failed = entry("ran-and-failed", retry_count=0, error_class="RuntimeError")
    dead = entry("ran-and-died", error_class="RuntimeError")
    r.lpush(K.unsettled,
            payloads.encode({"target": "retry", "score": NOW + 30, "payload": failed}),
            payloads.encode({"target": "dead", "score": NOW, "payload": dead}),
            "not a record")

    assert poller.file_unsettled() == 2

    assert r.zrange(K.retry, 0, -1, withscores=True) == [(failed, NOW + 30)]
    assert r.zrange(K.dead, 0, -1, withscores=True) == [(dead, NOW)]
    assert r.lrange(K.unsettled, 0, -1) == ["not a record"]  # unreadable: left for a human, not dropped
    assert r.llen(K.queue("default")) == 0  # they ran: never requeued


class Extremes(random.Random):
    """uniform() returns its low or high bound."""

    def __init__(self, high):
        super().__init__(0)
        self.high = high

    def uniform(self, a, b):
        return b if self.high else a


@pytest.mark.parametrize("processes", [1, 4, 25])
def test_the_poll_interval_scales_with_the_process_count(redis_url, bclient, processes):
    def interval(high):
        return make_poller(redis_url, bclient, process_count=lambda: processes, rng=Extremes(high),
                           POLL_INTERVAL_AVERAGE=2).poll_interval()

    assert interval(high=False) == pytest.approx(2 * processes * 0.5)
    assert interval(high=True) == pytest.approx(2 * processes * 1.5)
    seeded = make_poller(redis_url, bclient, process_count=lambda: processes, rng=random.Random(1),
                         POLL_INTERVAL_AVERAGE=2)
    samples = [seeded.poll_interval() for _ in range(200)]
    assert min(samples) >= processes and max(samples) <= 3 * processes
    assert len(set(samples)) > 100  # randomised, so processes started together don't poll together


def test_the_poll_interval_counts_at_least_this_process(redis_url, bclient):
    p = make_poller(redis_url, bclient, process_count=lambda: 0, rng=Extremes(False), POLL_INTERVAL_AVERAGE=2)
    assert p.poll_interval() == pytest.approx(1.0)


def test_a_failing_step_does_not_stop_the_due_entries(redis_url, bclient, r):
    guard, orphans = Failing(), Failing()
    p = make_poller(redis_url, bclient, key_guard=guard, orphans=orphans)
    r.zadd(K.schedule, {entry("due"): NOW - 1})
    r.lpush(K.unsettled, payloads.encode({"target": "dead", "score": NOW, "payload": entry("ran")}))

    p.round()

    assert [q["jid"] for q in queued(r)] == ["due"]
    assert r.zcard(K.dead) == 1
    assert (guard.calls, orphans.calls) == (1, 1)
    # The ticker waits for an orphan check that really completed.
    assert not p.first_orphan_check_done.is_set()


def test_an_unreadable_last_beat_does_not_stall_the_schedule(poller, r):
    r.sadd(K.in_progress_identities, "ghost:1:abc")
    r.hset(K.last_beat, "ghost:1:abc", "not a time")
    r.zadd(K.schedule, {entry("due"): NOW - 1})

    poller.round()

    assert [q["jid"] for q in queued(r)] == ["due"]


def test_a_round_runs_the_key_guard_only_when_due(poller, r):
    r.set(K.retry, "not a zset")
    poller.round()
    assert r.type(K.retry) == "none"  # moved to quarantine
    assert len(r.keys(K.quarantine_prefix + "*")) == 1
    r.set(K.retry, "again")
    poller.round()
    assert r.get(K.retry) == "again"  # not before KEY_GUARD_INTERVAL


def test_a_running_launcher_runs_scheduled_and_due_retry_jobs(launcher_factory, r):
    token = new_token()
    running = launcher_factory()
    now = time.time()
    scheduled = dict(jid="sched", **{"class": Note.name, "args": [token, "scheduled"], "kwargs": {},
                                     "queue": "default", "retry": True})
    retried = dict(scheduled, jid="retried", args=[token, "retried"], retry_count=0)
    not_yet = dict(scheduled, jid="not-yet", args=[token, "not yet"])
    r.zadd(K.schedule, {payloads.encode(scheduled): now - 1, payloads.encode(not_yet): now + 3600})
    r.zadd(K.retry, {payloads.encode(retried): now - 1})

    wait_until(lambda: len(runs(token)) == 2, message="both due jobs ran")

    assert sorted(jid for jid, _ in runs(token)) == ["retried", "sched"]
    assert r.zcard(K.schedule) == 1 and r.zcard(K.retry) == 0
    running.stop()
    assert len(runs(token)) == 2  # the entry not yet due never ran
