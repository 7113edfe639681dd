"""The test infrastructure itself: private Redis, per-test isolation, fault-test servers."""

import os

import pytest
import redis
from helpers import RedisServer, free_port, wait_until


def test_suite_redis_is_private(redis_url, r):
    assert os.environ["COGWORKER_REDIS_URL"] == redis_url
    assert r.connection_pool.connection_kwargs["port"] != 6379
    assert r.connection_pool.connection_kwargs["host"] == "127.0.0.1"
    assert r.ping()


# The two tests below run in file order: the first leaves a key, the second must not see it.
def test_flushdb_isolation_leaves_key(r):
    r.set("infra:leftover", "1")
    assert r.dbsize() == 1


def test_flushdb_isolation_key_is_gone(r):
    assert r.dbsize() == 0


def test_free_port_is_bindable():
    assert 0 < free_port() < 65536


def test_wait_until_returns_value_and_times_out():
    assert wait_until(lambda: 42, timeout=1) == 42
    with pytest.raises(AssertionError, match="never true"):
        wait_until(lambda: False, timeout=0.2, message="never true")


def test_redis_server_kill_restart_keeps_appendonly_data(tmp_path):
    with RedisServer(tmp_path / "aof", appendonly=True) as srv:
        port, pid = srv.port, srv.pid
        client = srv.client(decode_responses=True)
        try:
            client.rpush("infra:list", "a", "b")
            srv.kill()
            assert not srv.running
            with pytest.raises(redis.ConnectionError):
                client.ping()
            srv.restart()
            assert (srv.port, srv.running) == (port, True)
            assert srv.pid != pid
            assert client.lrange("infra:list", 0, -1) == ["a", "b"]  # the client reconnects
        finally:
            client.close()
    assert not srv.running


def test_redis_server_without_appendonly_loses_data_on_kill(tmp_path):
    # The contrast that shows the test above measures persistence, not luck.
    with RedisServer(tmp_path / "plain") as srv:
        client = srv.client()
        try:
            client.set("infra:k", "v")
            srv.kill()
            srv.restart()
            assert client.get("infra:k") is None
        finally:
            client.close()
