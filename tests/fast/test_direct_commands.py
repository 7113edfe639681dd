"""broker/replies.py's direct commands: a plain command on a held connection, without redis-py's wrapping.

What a job relies on: ``get_redis()`` in a worker answers exactly as redis-py does (values,
callbacks and their options, decoding, error replies and their classes), packs exactly the
bytes redis-py would, leaves to redis-py whatever it can't cover the same way, and a connection
that fails under a command is made again as redis-py's retries would (not at all when they are
none). Against a real Redis: the suite's, and a private one for the connection that fails.
"""

from __future__ import annotations

import pytest
import redis
from helpers import in_thread
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.broker import replies as direct
from django_cogworker.broker.replies import accounted
from django_cogworker.push import runtime

PLAIN = [("SET", "k", "v"), ("INCRBY", "x", 1), ("SET", b"k\x00\xff", "é✓"), ("ZADD", "z", 10**30, "m"),
         ("SET", "k", -5), ("GET", ""), ("get", "k")]


def test_plain_commands_are_packed_as_redis_py_packs_them(rb):
    conn = rb.connection_pool.get_connection()
    try:
        for args in PLAIN:
            assert direct.packed(args, {}) == [b"".join(conn.pack_command(*args))], args
    finally:
        rb.connection_pool.release(conn)


def test_what_redis_py_encodes_or_splits_its_own_way_is_left_to_it():
    for args in [("SET", "k", 1.5), ("SET", "k", True), ("SET", "k", None), ("CONFIG GET", "x"),
                 ("SET", "k", memoryview(b"x")), ("SET", "k", bytearray(b"x")), ("SET", "k", "\udc80"),
                 ("HIMPORT", "SET", "k", "f"), ("himport set", "k"), (b"GET", "k")]:
        assert direct.packed(args, {}) is None, args
    assert direct.packed(("GET", "k"), {"keys": ["k"]}) is not None
    assert direct.packed(("GET", "k"), {"keys": ["k"], "NEVER_DECODE": True}) is None
    assert direct.packed(("ZRANGE", "z", 0, -1), {"withscores": True}) is None


def test_only_a_utf8_resp2_client_without_a_cache_goes_this_way(redis_url):
    assert direct.usable(redis.Redis.from_url(redis_url))
    assert direct.usable(redis.Redis.from_url(redis_url, decode_responses=True))
    assert not direct.usable(redis.Redis.from_url(redis_url, encoding="latin-1"))
    assert not direct.usable(redis.Redis.from_url(redis_url, encoding_errors="replace"))
    assert not direct.usable(redis.Redis.from_url(redis_url, protocol=3))


def answers(client: redis.Redis) -> list:
    """What ``client`` answers to commands whose replies redis-py shapes, errors as (class, message)."""
    client.rpush("l", "a", "b")
    client.set("s", "text")
    out: list = []
    for call in (lambda: client.set("k", "v"), lambda: client.get("k"), lambda: client.get("missing"),
                 lambda: client.incr("n"), lambda: client.incrbyfloat("f", 1.5), lambda: client.hset("h", "a", 1),
                 lambda: client.hgetall("h"), lambda: client.zadd("z", {"m": 2}),
                 lambda: client.zrange("z", 0, -1, withscores=True), lambda: client.exists("k", "missing"),
                 lambda: client.lrange("l", 0, -1), lambda: client.ping(), lambda: client.incr("s"),
                 lambda: client.lpush("s", "x"), lambda: client.evalsha("0" * 40, 0),
                 lambda: client.type("l"), lambda: client.ttl("k"), lambda: client.expire("k", 100)):
        try:
            out.append(call())
        except redis.RedisError as exc:
            out.append((type(exc), str(exc)))
    return out


def held_answers() -> list:
    result: list = []

    def work():
        with runtime.own_connection():
            client = runtime.get_redis()
            assert client._direct  # (premise: this client's plain commands go the direct way)
            result.extend(answers(client))

    in_thread(work)
    return result


def test_a_held_client_answers_as_redis_py_does(rb):
    expected = answers(rb)
    rb.flushdb()
    assert held_answers() == expected
    assert [type(a) for a in expected[-6:-3]] == [tuple] * 3  # (premise: the error replies were made)
    assert expected[-4][0] is redis.exceptions.NoScriptError


INCR = ("INCRBY", "n", 1)


def cut_client(rb, redis_url: str, retries: int) -> redis.Redis:
    """A held client with ``retries`` retries whose connection the server has just closed."""
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=accounted(redis.Connection),
                                         retry=Retry(NoBackoff(), retries))
    client = redis.Redis(connection_pool=pool, single_connection_client=True, retry=Retry(NoBackoff(), retries))
    client.ping()
    rb.client_kill_filter(_id=client.client_id())
    return client


def test_a_connection_closed_under_a_command_is_made_again_as_redis_py_retries(rb, redis_url):
    client = cut_client(rb, redis_url, retries=2)
    assert direct.execute(client, client.connection, direct.packed(INCR, {}), INCR, {}) == 1
    assert rb.get("n") == b"1"  # (once: the first send never reached the server)
    client.close()


def test_with_no_retries_a_connection_closed_under_a_command_raises(rb, redis_url):
    client = cut_client(rb, redis_url, retries=0)
    with pytest.raises(redis.ConnectionError):
        direct.execute(client, client.connection, direct.packed(INCR, {}), INCR, {})
    assert rb.get("n") is None  # (never made again)
    assert client.incr("n") == 1  # (the client reconnects for the next)
    client.close()
