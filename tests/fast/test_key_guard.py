"""The key guard: keys of the wrong type are moved to quarantine, logged, and work carries on.

In-process tests drive KeyGuard against the suite's Redis; the end-to-end test plants a wrong
type on every fixed key and on a queue key in turn under a running `runcogworker`.
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
import redis

from django_cogworker.broker.keys import Keys, Want
from django_cogworker.broker.quarantine import QUARANTINE_TTL, guarded, quarantine_key, quarantine_wrong
from django_cogworker.engine.recovery.key_guard import KeyGuard

K = Keys()
FIXED = K.fixed_types()


def plant(r, key: str, expected: str) -> str:
    """Replace ``key`` with a value of the wrong type (atomically); return the type planted."""
    pipe = r.pipeline(transaction=True)
    pipe.delete(key)
    if expected == "string":
        pipe.rpush(key, "planted")
    else:
        pipe.set(key, "planted")
    pipe.execute()
    return "list" if expected == "string" else "string"


def make_right(r, key: str, expected: str) -> None:
    {"zset": lambda: r.zadd(key, {"m": 1}), "set": lambda: r.sadd(key, "m"), "hash": lambda: r.hset(key, "f", "v"),
     "list": lambda: r.rpush(key, "m"), "string": lambda: r.set(key, "1")}[expected]()


def quarantined(r, key: str, keys: Keys = K) -> list[str]:
    return sorted(r.scan_iter(match=f"{keys.quarantine_prefix}{key}:*", count=1000))


def assert_quarantine_name(name: str, key: str, keys: Keys = K) -> None:
    m = re.fullmatch(re.escape(f"{keys.quarantine_prefix}{key}:") + r"(\d+):([0-9a-f]+)", name)
    assert m, name
    assert abs(int(m.group(1)) - time.time()) < 60


@pytest.mark.parametrize("key,expected", sorted(FIXED.items()), ids=sorted(FIXED))
def test_fixed_key_of_wrong_type_is_quarantined(rb, r, caplog, key, expected):
    planted = plant(r, key, expected)
    guard = KeyGuard(rb, K, ["default"])
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert guard.check() == [key]
    assert r.exists(key) == 0  # a fresh, empty key: the next write creates the right type
    [name] = quarantined(r, key)
    assert_quarantine_name(name, key)
    assert r.type(name) == planted
    assert (r.get(name) if planted == "string" else r.lrange(name, 0, -1)) in ("planted", ["planted"])
    assert QUARANTINE_TTL - 60 < r.ttl(name) <= QUARANTINE_TTL == 30 * 24 * 3600
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
    assert any(key in m and name in m for m in errors), errors
    make_right(r, key, expected)  # work carries on with the key
    assert guard.check() == []


def test_right_types_and_missing_keys_are_left_alone(rb, r):
    guard = KeyGuard(rb, K, ["default", "mail"])
    assert guard.check() == []  # nothing exists yet
    for key, expected in FIXED.items():
        make_right(r, key, expected)
    r.delete(K.queues)
    r.sadd(K.queues, "default")
    r.rpush(K.queue("default"), "job")
    before = {key: r.type(key) for key in r.keys("*")}
    assert guard.check() == []
    assert {key: r.type(key) for key in r.keys("*")} == before


def test_queue_keys_from_config_and_from_the_registries(rb, r):
    r.sadd(K.queues, "listed")
    r.sadd(K.paused_queues, "paused")
    for q in ("configured", "listed", "paused"):
        r.set(K.queue(q), "not a list")
    r.set(K.queue("unknown"), "never looked at")  # named nowhere: not ours to judge
    moved = KeyGuard(rb, K, ["configured"]).check()
    assert sorted(moved) == sorted(K.queue(q) for q in ("configured", "listed", "paused"))
    for q in ("configured", "listed", "paused"):
        assert r.exists(K.queue(q)) == 0
        assert len(quarantined(r, K.queue(q))) == 1
    assert r.get(K.queue("unknown")) == "never looked at"


def test_per_process_keys_of_listed_identities(rb, r):
    r.sadd(K.in_progress_identities, "host:1:aa")
    r.sadd(K.processes, "host:2:bb")
    r.set(K.in_progress("host:1:aa"), "x")
    r.set(K.process("host:2:bb"), "x")
    r.rpush(K.workers("host:2:bb"), "x")
    r.set(K.signals("host:2:bb"), "x")
    moved = KeyGuard(rb, K, ["default"]).check()
    assert sorted(moved) == sorted([K.in_progress("host:1:aa"), K.process("host:2:bb"), K.workers("host:2:bb"),
                                    K.signals("host:2:bb")])


def test_the_keys_of_this_processs_periodic_entries(rb, r):
    # Either of the wrong type failed every claim of its entry, for good.
    r.rpush(K.periodic_last_slot("nightly"), "x")
    r.rpush(K.periodic_running("hourly"), "x")
    r.set(K.periodic_last_slot("hourly"), "1700000000")  # right type: left alone
    moved = KeyGuard(rb, K, ["default"], periodic=["nightly", "hourly"]).check()
    assert sorted(moved) == sorted([K.periodic_last_slot("nightly"), K.periodic_running("hourly")])
    assert r.get(K.periodic_last_slot("hourly")) == "1700000000"


def test_a_registry_of_the_wrong_type_is_quarantined_and_its_members_checked_next_round(rb, r):
    r.set(K.queues, "not a set")
    r.set(K.queue("other"), "not a list")
    guard = KeyGuard(rb, K, ["default"])
    assert guard.check() == [K.queues]  # the unreadable listing names no queue this round
    r.sadd(K.queues, "other")  # the next push relists it
    assert guard.check() == [K.queue("other")]


def test_two_quarantines_of_one_key_in_the_same_second_keep_both(rb, r):
    guard = KeyGuard(rb, K, ["default"])
    r.set(K.dead, "first")
    guard.check()
    r.set(K.dead, "second")
    guard.check()
    names = quarantined(r, K.dead)
    assert len(names) == 2
    assert sorted(r.get(n) for n in names) == ["first", "second"]


def test_quarantine_rechecks_the_type_atomically(rb, r):
    # Between TYPE and the move the key may have been fixed, or deleted: then it stays.
    guard = KeyGuard(rb, K, ["default"])
    r.zadd(K.dead, {"m": 1})
    assert guard.quarantine(K.dead, "zset", "string") is False
    assert r.zcard(K.dead) == 1
    assert guard.quarantine(K.retry, "zset", "string") is False  # missing
    assert quarantined(r, K.dead) == [] and quarantined(r, K.retry) == []


# -- quarantine at once, by whoever meets a key (broker/quarantine.py: the features' keys) ----------


def test_guarded_moves_the_key_of_the_wrong_type_aside_and_calls_again(rb, r, caplog):
    key = K.result("j1")
    r.set(key, "not a hash")
    calls = []

    def write():
        calls.append(1)
        return rb.hset(key, "status", "RUNNING")

    with caplog.at_level(logging.WARNING):
        assert guarded(rb, K, {key: Want("hash"), K.cancels: Want("hash")}, write) == 1
    assert len(calls) == 2 and r.hgetall(key) == {"status": "RUNNING"}
    (moved,) = quarantined(r, key)
    assert r.get(moved) == "not a hash" and QUARANTINE_TTL - 60 < r.ttl(moved)
    assert [rec.getMessage() for rec in caplog.records] == [
        f"{key} held a string, not a hash: moved to {moved} (kept 30 days)"]


def test_guarded_calls_again_once_when_another_moved_the_key_first_and_raises_for_an_undeclared_key(rb, r):
    key = K.result("j1")
    r.set(key, "not a hash")
    calls = []

    def raced():  # (another process meets the key too, and moves it between our failure and our look)
        calls.append(1)
        try:
            return rb.hset(key, "status", "RUNNING")
        finally:
            quarantine_key(rb, K, key, "hash", "moved by another")

    assert guarded(rb, K, {key: Want("hash")}, raced) == 1 and len(calls) == 2
    r.set("elsewhere", "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        guarded(rb, K, {key: Want("hash")}, lambda: rb.hset("elsewhere", "f", "v"))
    assert r.get("elsewhere") == "not a hash"


def test_a_move_noted_in_a_hash_of_its_family_is_noted_in_the_same_step(rb, r):
    bk = K.batch("b1")
    r.hset(bk.meta, "created_at", "1")
    r.set(bk.pending, "not a set")
    r.set(bk.failed, "not a hash")
    assert sorted(quarantine_wrong(rb, K, bk.expected(60))) == sorted([bk.pending, bk.failed])
    assert set(r.hkeys(bk.meta)) == {"created_at", "lost:pending", "lost:failed"} and r.ttl(bk.meta) == -1
    r.set(bk.meta, "not a hash")  # (the note's own hash: moved first, the note made in a fresh one, with the TTL)
    r.set(bk.open, "not a set")
    assert sorted(quarantine_wrong(rb, K, bk.expected(60))) == sorted([bk.meta, bk.open])
    assert set(r.hkeys(bk.meta)) == {"lost:meta", "lost:open"} and 0 < r.ttl(bk.meta) <= 60


def test_custom_prefix(rb, r):
    keys = Keys("shop:")
    r.set(keys.schedule, "x")
    r.set(K.schedule, "another app's business")
    assert KeyGuard(rb, keys, ["default"]).check() == [keys.schedule]
    [name] = quarantined(r, keys.schedule, keys)
    assert_quarantine_name(name, keys.schedule, keys)
    assert r.get(K.schedule) == "another app's business"


def test_a_push_goes_through_while_the_queues_listing_holds_the_wrong_type(r, caplog):
    # Until the key guard's next round the listing is broken; a push that went through must not
    # look failed (the caller would push again: two runs).
    from testproject.demo.jobs import RecordJob

    r.set(K.queues, "wrong type")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        jid = RecordJob.perform_async("ran")
        bulk = RecordJob.perform_bulk([["ran"], ["ran"]])
    queued = [json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)]
    assert sorted(queued) == sorted([jid, *bulk])
    assert f"{K.queues} not updated" in caplog.text
    r.delete(K.queues)
    r.set(K.queue("mail"), "wrong type")  # the queue itself: that push did fail, and says so
    with pytest.raises(redis.ResponseError):
        RecordJob.set(queue="mail").perform_async("ran")


# -- end to end ----------------------------------------------------------------------------

def test_a_registry_member_that_is_not_utf8_is_skipped_said_once_and_the_rest_still_checked(rb, r, caplog):
    # No name the worker writes; one there (a bad client, a corrupted restore) failed every round
    # with UnicodeDecodeError, and then no key of the wrong type was moved aside anywhere.
    rb.sadd(K.queues, b"\xff\xfe-not-utf8", b"listed")
    rb.sadd(K.in_progress_identities, b"\xc3\x28")
    r.set(K.queue("listed"), "not a list")
    guard = KeyGuard(rb, K, ["default"])
    with caplog.at_level(logging.ERROR, logger="django_cogworker.engine.recovery.registry"):
        assert guard.check() == [K.queue("listed")]
        r.set(K.queue("listed"), "not a list, again")
        assert guard.check() == [K.queue("listed")]
    said = [rec.getMessage() for rec in caplog.records if "not UTF-8" in rec.getMessage()]
    assert len(said) == 2  # each bad member once, over both rounds
    assert any(K.queues in line for line in said) and any(K.in_progress_identities in line for line in said)
