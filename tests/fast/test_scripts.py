"""scripts: the argument protocols built beside their scripts, and the tail four scripts share."""

from __future__ import annotations

import pytest
import redis

from django_cogworker.broker import scripts
from django_cogworker.features.limits import scripts as limit_scripts


def test_requeue_args_lists_each_queue_key_once_and_points_at_it_from_one():
    keys, args = scripts.requeue_args("ip", "queues", [b"ack1", b"ack2"], [
        (b"r1", b"p1", "queue:a", "a"), (b"r2", b"p2", "queue:b", "b"), (b"r3", b"p3", "queue:a", "a")])
    assert keys == ["ip", "queues", "queue:a", "queue:b"]
    assert args == [2, b"ack1", b"ack2", b"r1", b"p1", 3, "a", b"r2", b"p2", 4, "b", b"r3", b"p3", 3, "a"]
    assert scripts.requeue_args("ip", "queues", [], []) == (["ip", "queues"], [0])


def test_requeue_from_zset_batch_args_lists_each_queue_key_once():
    keys, args = scripts.requeue_from_zset_batch_args("retry", "queues", [
        (b"r1", "queue:a", "a", "p1"), (b"r2", "queue:a", "a", "p2"), (b"r3", "queue:b", "b", "p3")])
    assert keys == ["retry", "queues", "queue:a", "queue:b"]
    assert args == [b"r1", 3, "a", "p1", b"r2", 3, "a", "p2", b"r3", 4, "b", "p3"]


def test_the_filing_scripts_add_before_they_remove_and_trim_after():
    for script, remove in ((scripts.MOVE_BETWEEN_ZSETS, "ZREM"), (scripts.FILE_FAILURE, "LREM"),
                           (scripts.FILE_UNSETTLED, "LREM"), (scripts.ORPHAN_TO_DEAD, "LREM")):
        src = script.source
        assert src.index("ZADD") < src.index(f'"{remove}"') < src.index("ZREMRANGEBYSCORE") < src.index(
            "ZREMRANGEBYRANK")


def test_orphan_to_dead_trims_by_its_own_arguments(rb):
    rb.zadd("dead", {"old": 1.0, "kept": 50.0})
    rb.rpush("ip", "job")
    assert scripts.ORPHAN_TO_DEAD(rb, ["ip", "dead", "repeat"], ["job", 100.0, "job-dead", "record", 10.0, 2]) == 1
    assert rb.zrange("dead", 0, -1) == [b"kept", b"job-dead"]
    assert rb.lrange("ip", 0, -1) == [] and rb.lrange("repeat", 0, -1) == [b"record"]


def test_requeue_without_the_queues_set_requeues_in_one_slot_and_lists_nothing(rb):
    """A cluster's requeue: the list and its queue in one slot, the queues set in another."""
    keys, args = scripts.requeue_args("ip", None, [b"ack"], [(b"r1", b"p1", "queue:a", "a")])
    assert (keys, args) == (["ip", "queue:a"], [1, b"ack", b"r1", b"p1", 2, ""])
    rb.rpush("ip", "ack", "r1")
    assert scripts.REQUEUE(rb, keys, args) == 1
    assert rb.lrange("queue:a", 0, -1) == [b"p1"] and rb.llen("ip") == 0
    assert rb.keys("*") == [b"queue:a"]  # (nothing listed: the caller lists the queue)


def test_forget_identity_checks_the_lists_it_names_and_none_on_a_cluster(rb):
    rb.sadd("ids", "me")
    rb.hset("beats", "me", 1)
    rb.set("lock", "x")
    rb.rpush("ip", "job")
    assert scripts.FORGET_IDENTITY(rb, ["ip", "ids", "beats", "lock"], ["me"]) == 0  # a list not empty
    assert rb.sismember("ids", "me")
    assert scripts.FORGET_IDENTITY(rb, ["ids", "beats", "lock"], ["me"]) == 1  # (the caller saw them empty)
    assert rb.exists("ids", "beats", "lock") == 0


# -- limiters (features/limits/scripts.py) ------------------------------------------------------------------


def _limit(name, kind, size, per="", lease=""):
    """(KEYS, ARGV spec) of one limiter key, as Gate._script_args builds them."""
    keys = [f"limit:{name}:{part}" for part in ("holders", "starts", "state", "stats", "waiting", "parked")]
    return keys, [kind, size, per, lease]


def test_limit_take_takes_every_limiter_or_none(rb):
    conc_keys, conc = _limit("conc", "concurrent", 2, lease="30")
    full_keys, full = _limit("full", "bucket", 1, per="60")
    assert limit_scripts.LIMIT_TAKE(rb, full_keys, ["t0", "", "", *full]) == [1, 0]  # the bucket's only start
    reply = limit_scripts.LIMIT_TAKE(rb, conc_keys + full_keys, ["t1", "reschedule", "", *conc, *full])
    assert reply[:2] == [0, 2]  # the second limiter refused ...
    assert 0 < float(reply[2]) <= 60
    assert rb.zcard(conc_keys[0]) == 0  # ... so the first, which had room, took nothing
    assert rb.hget(conc_keys[3], "granted") is None
    assert rb.hmget(full_keys[3], "granted", "over", "rescheduled") == [b"1", b"1", b"1"]
    # In the other order the same: the refusal comes first, nothing after it is looked at.
    assert limit_scripts.LIMIT_TAKE(rb, full_keys + conc_keys, ["t2", "fail", "", *full, *conc])[:2] == [0, 1]
    assert rb.zcard(conc_keys[0]) == 0 and rb.hget(full_keys[3], "failed") == b"1"
    # With room in both, both are taken.
    free_keys, free = _limit("free", "window", 5, per="60")
    assert limit_scripts.LIMIT_TAKE(rb, conc_keys + free_keys, ["t3", "", "", *conc, *free]) == [1, 0]
    assert rb.zrange(conc_keys[0], 0, -1) == [b"t3"] and rb.zrange(free_keys[1], 0, -1) == [b"t3:2"]


def test_limit_take_of_an_unknown_kind_is_an_error_and_takes_nothing(rb):
    conc_keys, conc = _limit("conc", "concurrent", 2, lease="30")
    odd_keys, odd = _limit("odd", "burst", 1, per="1")
    with pytest.raises(redis.ResponseError, match="unknown limiter kind burst"):
        limit_scripts.LIMIT_TAKE(rb, conc_keys + odd_keys, ["t", "", "", *conc, *odd])
    assert rb.zcard(conc_keys[0]) == 0


def test_limit_release_undo_gives_each_rate_kind_s_start_back(rb):
    specs = [_limit("b", "bucket", 1, per="60"), _limit("w", "window", 1, per="60"),
             _limit("l", "leaky", 1, per="60")]
    keys = [k for ks, _ in specs for k in ks]
    argv = [a for _, spec in specs for a in spec]
    assert limit_scripts.LIMIT_TAKE(rb, keys, ["t1", "", "", *argv]) == [1, 0]
    assert limit_scripts.LIMIT_TAKE(rb, keys, ["t2", "", "", *argv])[:2] == [0, 1]  # all three full
    for ks, spec in specs:
        assert limit_scripts.LIMIT_TAKE(rb, ks, ["t2", "", "", *spec])[0] == 0, spec[0]
        assert rb.hget(ks[3], "granted") == b"1"
    assert limit_scripts.LIMIT_RELEASE(rb, keys, ["t1", "undo", *argv])[0] == 3
    for ks, spec in specs:
        assert rb.hget(ks[3], "granted") == b"0"  # (an undone start was never granted)
        assert limit_scripts.LIMIT_TAKE(rb, ks, ["t3", "", "", *spec]) == [1, 0], spec[0]  # the start is free again


def test_limit_release_without_undo_gives_back_only_a_concurrent_place(rb):
    conc_keys, conc = _limit("conc", "concurrent", 1, lease="30")
    rate_keys, rate = _limit("rate", "bucket", 1, per="60")
    token = '{"jid":"j","process":"p","since":1,"run":"r"}'
    assert limit_scripts.LIMIT_TAKE(rb, conc_keys + rate_keys, [token, "", "", *conc, *rate]) == [1, 0]
    assert limit_scripts.LIMIT_RELEASE(rb, conc_keys + rate_keys, [token, "release", *conc, *rate])[0] == 1
    assert rb.zcard(conc_keys[0]) == 0
    assert 0 <= float(rb.hget(conc_keys[3], "hold")) <= 3600  # (how long it was held: capped at an hour)
    assert limit_scripts.LIMIT_TAKE(rb, rate_keys, ["t2", "", "", *rate])[0] == 0  # the start was made: not given back
    assert limit_scripts.LIMIT_RELEASE(rb, conc_keys, [token, "release", *conc])[0] == 0  # (twice: nothing more)


def test_limit_take_many_takes_each_job_s_limiters_all_or_none_naming_each_key_once(rb):
    # (A fetch's takes in one call: each job's as LIMIT_TAKE's, one after the other.)
    conc_keys, conc = _limit("conc", "concurrent", 2, lease="30")
    rate_keys, rate = _limit("rate", "bucket", 2, per="60")
    head = [2, *conc, *rate]
    rb.zadd(conc_keys[4], {"j\n4": 1.0})  # (refused before, parked: a jid may hold a line break, it goes last)
    rb.hset(conc_keys[5], "j\n4", "{}")
    jobs = ["1,2\n\nt1\n", "2\nreschedule\nt2\n", "2,1\nfail\nt3\n", "1\n\nt4\nj\n4"]
    replies = limit_scripts.LIMIT_TAKE_MANY(rb, conc_keys + rate_keys, head + jobs)
    assert replies[0] == [1, 0] and replies[1] == [1, 0]  # (the bucket's two starts)
    assert replies[2][:2] == [0, 1]  # (its first limiter, the bucket, full: its concurrent place not taken)
    assert replies[3] == [1, 0]
    assert sorted(rb.zrange(conc_keys[0], 0, -1)) == [b"t1", b"t4"]
    assert rb.hmget(rate_keys[3], "granted", "over", "failed") == [b"2", b"1", b"1"]
    assert rb.hget(conc_keys[3], "granted") == b"2"
    assert rb.zcard(conc_keys[4]) == 0 and rb.hlen(conc_keys[5]) == 0  # (granted: unparked)


def test_limit_release_many_gives_back_each_holder_s_place_once_and_wakes_as_many_waiting(rb):
    conc_keys, conc = _limit("conc", "concurrent", 3, lease="30")
    other_keys, other = _limit("other", "concurrent", 3, lease="30")
    tokens = [f'{{"jid":"j{i}","process":"p","since":1,"run":"r{i}"}}' for i in range(3)]
    for token in tokens:
        assert limit_scripts.LIMIT_TAKE(rb, conc_keys + other_keys, [token, "", "", *conc, *other]) == [1, 0]
    rb.zadd(conc_keys[4], {"w1": 1.0})  # (a job refused before, parked: woken by the first place freed)
    rb.hset(conc_keys[5], "w1", '{"jid":"w1"}')
    argv = ["release", 2, *conc, *other, f"1,2\n{tokens[0]}", f"1\n{tokens[1]}", "2\nnever-held"]
    reply = limit_scripts.LIMIT_RELEASE_MANY(rb, conc_keys + other_keys, argv)
    assert reply[0] == 3 and reply[1:] == [b"", b'{"jid":"w1"}', b"1"]  # (none failed)
    assert rb.zrange(conc_keys[0], 0, -1) == [tokens[2].encode()]
    assert sorted(rb.zrange(other_keys[0], 0, -1)) == sorted([tokens[1].encode(), tokens[2].encode()])
    assert limit_scripts.LIMIT_RELEASE_MANY(rb, conc_keys + other_keys, argv)[0] == 0  # (again: nothing more)


def test_limit_take_many_stops_at_a_key_of_the_wrong_type_before_any_write(rb):
    # (Stopped partway, it kept the writes before the key: made again, a start or a refusal counted twice.)
    conc_keys, conc = _limit("conc", "concurrent", 2, lease="30")
    rate_keys, rate = _limit("rate", "window", 1, per="60")
    bad_keys, bad = _limit("bad", "bucket", 1, per="60")
    rb.set(bad_keys[3], "not mine")  # (its stats: written only at the call's end)
    jobs = ["1,2\n\nt1\n", "2\nreschedule\nt2\n", "3\n\nt3\n"]
    with pytest.raises(redis.ResponseError, match="^WRONGTYPE .*bad:stats holds a string, not a hash"):
        limit_scripts.LIMIT_TAKE_MANY(rb, conc_keys + rate_keys + bad_keys, [3, *conc, *rate, *bad, *jobs])
    assert sorted(rb.keys("*")) == [bad_keys[3].encode()]  # (nothing written)
    with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
        limit_scripts.LIMIT_TAKE(rb, conc_keys + bad_keys, ["t4", "", "", *conc, *bad])
    assert sorted(rb.keys("*")) == [bad_keys[3].encode()]


def test_limit_release_many_fails_only_the_holders_meeting_a_key_of_the_wrong_type(rb):
    conc_keys, conc = _limit("conc", "concurrent", 1, lease="30")
    bad_keys, bad = _limit("bad", "concurrent", 3, lease="30")
    tokens = [f'{{"jid":"j{i}","process":"p","since":1,"run":"r{i}"}}' for i in range(3)]
    assert limit_scripts.LIMIT_TAKE(rb, conc_keys, [tokens[0], "", "", *conc]) == [1, 0]
    for token in tokens[1:]:
        assert limit_scripts.LIMIT_TAKE(rb, bad_keys, [token, "", "", *bad]) == [1, 0]
    rb.zadd(conc_keys[4], {"w1": 1.0})
    rb.hset(conc_keys[5], "w1", '{"jid":"w1"}')
    rb.delete(bad_keys[0])
    rb.set(bad_keys[0], "not mine")
    argv = ["release", 2, *conc, *bad, f"2\n{tokens[1]}", f"1\n{tokens[0]}", f"2\n{tokens[2]}"]
    reply = limit_scripts.LIMIT_RELEASE_MANY(rb, conc_keys + bad_keys, argv)
    assert reply == [1, b"1,3", b'{"jid":"w1"}', b"1"]  # (the job the other holder woke: not lost)
    assert rb.zcard(conc_keys[0]) == 0 and rb.zcard(conc_keys[4]) == 0


def test_limit_renew_moves_only_the_leases_still_held(rb):
    rb.zadd("holders", {"mine": 1.0, "other": 2.0})
    assert limit_scripts.LIMIT_RENEW(rb, ["holders"], ["30", "mine", "lapsed"]) == 1
    now = float(rb.time()[0])
    assert now + 28 < rb.zscore("holders", "mine") <= now + 31
    assert rb.zscore("holders", "other") == 2.0 and rb.zscore("holders", "lapsed") is None


def test_every_script_the_core_s_and_the_features_compiles_under_its_sha(rb):
    # _base.EVERY lists them as they are made: a feature's, from its own folder, too.
    from django_cogworker.broker.scripts import _base
    from django_cogworker.features.batches import scripts as batch_scripts
    from django_cogworker.features.results import scripts as result_scripts

    made = [batch_scripts.BATCH_SETTLE, limit_scripts.LIMIT_TAKE, result_scripts.RESULT_FINISHED, scripts.PUSH]
    assert all(any(script is listed for listed in _base.EVERY) for script in made)
    for script in _base.EVERY:
        assert rb.script_load(script.source) == script.sha
