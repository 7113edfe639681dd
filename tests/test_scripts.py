"""scripts: the argument protocols built beside their scripts, and the tail four scripts share."""

from __future__ import annotations

from django_cogworker.broker import scripts


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
