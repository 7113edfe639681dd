"""errors.is_unavailable on the replies a real Redis gives: refusing for now, or failing for good.

Each case makes a redis-server of its own give the reply (config changes never reach the suite's).
"""

from __future__ import annotations

import threading

import pytest
import redis
from helpers import RedisServer, free_port, wait_until
from redis._parsers.base import BaseParser

from django_cogworker.errors import RedisUnavailable, error_code, is_unavailable


@pytest.fixture
def server(tmp_path):
    srv = RedisServer(tmp_path).start()
    yield srv
    srv.cleanup()


def raised(call) -> BaseException:
    with pytest.raises(redis.RedisError) as info:
        call()
    return info.value


def oom(c, server):
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", 1)
    return raised(lambda: c.set("k", "v"))


def readonly(c, server):
    c.replicaof("127.0.0.1", free_port())
    return raised(lambda: c.set("k", "v"))


def masterdown(c, server):
    c.config_set("replica-serve-stale-data", "no")
    c.replicaof("127.0.0.1", free_port())
    return raised(lambda: c.get("k"))


def noreplicas(c, server):
    c.config_set("min-replicas-to-write", 1)
    return raised(lambda: c.set("k", "v"))


def unblocked(c, server):
    """A blocking fetch cut by a failover (the master made a replica)."""
    blocked = server.client()
    errors: list[BaseException] = []

    def block():
        try:
            blocked.blmove("q", "p", 10, "RIGHT", "LEFT")
        except redis.RedisError as exc:
            errors.append(exc)

    thread = threading.Thread(target=block)
    thread.start()
    try:
        wait_until(lambda: c.info("clients")["blocked_clients"] == 1, timeout=10)
        c.replicaof("127.0.0.1", free_port())
    finally:
        thread.join(15)
        blocked.close()
    return errors[0]


def busy(c, server):
    """A script running past busy-reply-threshold: every other command is refused until it ends."""
    c.config_set("busy-reply-threshold", 50)
    looping = server.client()

    def loop():
        with pytest.raises(redis.ResponseError, match="killed"):  # by the SCRIPT KILL below
            looping.eval("while true do end", 0)

    def refused():
        try:
            c.set("k", "v")
        except redis.ResponseError as exc:
            return exc
        return None

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        return wait_until(refused, timeout=10)
    finally:
        c.script_kill()
        thread.join(10)
        looping.close()


def wrongtype(c, server):
    c.rpush("k", "v")
    return raised(lambda: c.get("k"))


def noperm(c, server):
    c.acl_setuser("limited", enabled=True, nopass=True, keys=["*"], commands=["+@all", "-set"])
    limited = server.client(username="limited")
    try:
        return raised(lambda: limited.set("k", "v"))
    finally:
        limited.close()


def busygroup(c, server):
    c.xgroup_create("s", "g", mkstream=True)
    return raised(lambda: c.xgroup_create("s", "g"))


@pytest.mark.parametrize("make, code, unavailable", [
    (oom, "OOM", True), (readonly, "READONLY", True), (masterdown, "MASTERDOWN", True),
    (noreplicas, "NOREPLICAS", True), (unblocked, "UNBLOCKED", True), (busy, "BUSY", True),
    # These don't fix themselves: the caller backs off (and the key guard quarantines a wrong type).
    (wrongtype, "WRONGTYPE", False), (noperm, "NOPERM", False), (busygroup, "BUSYGROUP", False)])
def test_redis_refusing_for_now_is_unavailable_and_failing_for_good_is_not(server, make, code, unavailable):
    c = server.client()
    try:
        exc = make(c, server)
    finally:
        c.close()
    assert error_code(exc) == code
    assert is_unavailable(exc) is unavailable


def test_a_lost_connection_and_redis_loading_are_unavailable(server):
    c = server.client(socket_connect_timeout=0.5)
    server.stop()
    try:
        assert is_unavailable(raised(c.ping))
    finally:
        c.close()
    # LOADING comes only while a large data set loads: parsed as redis-py parses the reply.
    assert is_unavailable(BaseParser.parse_error("LOADING Redis is loading the dataset in memory"))
    assert is_unavailable(RedisUnavailable("OOM command not allowed (fetching queue 'default')"))
    assert not is_unavailable(RuntimeError("OOM"))  # only Redis's replies
