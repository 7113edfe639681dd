"""The poller's housekeeping (engine/recovery/housekeeping.py): key guard when due, orphan check, unsettled jobs."""

from __future__ import annotations

from peek import queued_payloads
from poller_fixtures import (
    NOW,
    K,
    bclient_fixture,  # noqa: F401 - the bclient fixture (the poller fixture's)
    entry,
    poller_fixture,  # noqa: F401 - the poller fixture
)

from django_cogworker.engine.settle.settling import file_unsettled
from django_cogworker.push import payload as payloads


def test_unsettled_records_are_filed(poller, r):
    failed = entry("ran-and-failed", retry_count=0, error_class="RuntimeError")
    dead = entry("ran-and-died", error_class="RuntimeError")
    r.lpush(K.unsettled,
            payloads.encode({"target": "retry", "score": NOW + 30, "payload": failed}),
            payloads.encode({"target": "dead", "score": NOW, "payload": dead}),
            "not a record")

    assert file_unsettled(poller.redis, K, poller.retry) == 2

    assert r.zrange(K.retry, 0, -1, withscores=True) == [(failed, NOW + 30)]
    assert r.zrange(K.dead, 0, -1, withscores=True) == [(dead, NOW)]
    assert r.lrange(K.unsettled, 0, -1) == ["not a record"]  # unreadable: left for a human, not dropped
    assert r.llen(K.queue("default")) == 0  # they ran: never requeued


def test_the_ticker_is_not_released_while_another_process_recovers_a_dead_list(poller, r):
    r.sadd(K.in_progress_identities, "dead:1:abc")
    r.hset(K.last_beat, "dead:1:abc", "1000.0")  # its last beat long ago: dead
    r.lpush(K.in_progress("dead:1:abc"), entry("interrupted"))
    r.set(K.orphan_lock("dead:1:abc"), "another:2:def", ex=60)

    poller.housekeeping.orphan_check()
    assert not poller.first_orphan_check_done.is_set()

    r.delete(K.orphan_lock("dead:1:abc"))
    poller.housekeeping.orphan_check()
    assert poller.first_orphan_check_done.is_set()
    assert [q["jid"] for q in queued_payloads(r)] == ["interrupted"]


def test_the_key_guard_runs_only_when_due(poller, r):
    r.set(K.retry, "not a zset")
    poller.housekeeping.guard()
    assert r.type(K.retry) == "none"  # moved to quarantine
    assert len(r.keys(K.quarantine_prefix + "*")) == 1
    r.set(K.retry, "again")
    poller.housekeeping.guard()
    assert r.get(K.retry) == "again"  # not before KEY_GUARD_INTERVAL

