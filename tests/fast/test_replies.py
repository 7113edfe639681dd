"""replies.py: a command that does not complete never leaves its reply for the next command; a
socket timeout holds with one system call per send and per read.

What users rely on: after a job's timeout (or any exception) interrupts a Redis command between
its send and its read, every later command on that thread, on the shared pool, in a pipeline,
on Sentinel and on Cluster gets its own reply, never the interrupted one's: whether that reply
had already arrived or was still on its way (held back here by ``CLIENT PAUSE``, which made the
old ``select`` check miss it every time).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import redis
import redis.connection
from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture  # noqa: F401 - fixtures
from helpers import RedisServer, in_thread
from redis._parsers import _HiredisParser, _RESP2Parser
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.replies import ReplyAccounting, accounted
from django_cogworker.push import runtime


class Interrupted(BaseException):
    """What a job's timeout raises in its thread (a BaseException, like JobTimeout's delivery)."""


@contextlib.contextmanager
def reads_interrupted(monkeypatch, times: int = 1):
    """The next ``times`` reply reads of this thread raise before reading: a command sent, its
    reply left unread, as when a timeout lands between the two."""
    real = redis.connection.AbstractConnection.read_response
    me = threading.get_ident()
    left = {"n": times}

    def read_response(self, *args, **kwargs):
        if threading.get_ident() == me and left["n"] > 0:
            left["n"] -= 1
            raise Interrupted()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read_response)
    try:
        yield
    finally:
        monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", real)


@contextlib.contextmanager
def writes_held_back(admin, ms: int = 400):
    """Every write command waits ``ms`` before it runs (CLIENT PAUSE ... WRITE): its reply is
    still on its way when the next command is sent. Reads go through."""
    admin.execute_command("CLIENT", "PAUSE", ms, "WRITE")
    try:
        yield
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")


def interrupted_incr(client, monkeypatch) -> None:
    with reads_interrupted(monkeypatch), pytest.raises(Interrupted):
        client.incr("counter")




def test_a_thread_s_held_connection_reads_its_own_reply_after_an_interrupt_while_the_reply_is_on_its_way(
        rb, monkeypatch):
    rb.set("k", "v")

    def work():
        with runtime.own_connection():
            client = runtime.get_redis()
            client.ping()
            with writes_held_back(rb):
                interrupted_incr(client, monkeypatch)  # sent; its reply (1) not even arrived yet
                got = client.get("k")
            return got

    assert in_thread(work) == b"v"
    # The interrupted INCR ran at most once (a command a dropped connection left in Redis's input
    # buffer is not run at all: like any command whose reply never came, it may or may not have).
    assert rb.get("counter") in (None, b"1")


def test_the_shared_pool_never_hands_out_a_connection_that_owes_a_reply(rb, monkeypatch):
    rb.set("k", "v")
    client = runtime.get_redis()
    client.ping()
    with writes_held_back(rb):
        interrupted_incr(client, monkeypatch)  # its connection goes back to the pool, reply owed
        assert client.get("k") == b"v"
        assert client.get("k") == b"v"


def test_a_pipeline_interrupted_between_its_send_and_its_replies_leaves_none_of_them_behind(rb, monkeypatch):
    rb.set("k", "v")
    client = runtime.get_redis()
    for transaction in (False, True):
        pipe = client.pipeline(transaction=transaction)
        pipe.incr("counter").incr("counter").get("k")
        with reads_interrupted(monkeypatch), pytest.raises(Interrupted):
            pipe.execute()
        assert client.get("k") == b"v"
        assert client.mget("k", "k") == [b"v", b"v"]
        assert client.pipeline().get("k").incr("other").execute()[0] == b"v"


def test_an_interrupted_blocking_pop_does_not_answer_the_next_command(rb, monkeypatch):
    # The fetcher's wait: BLMOVE on an empty queue, its nil reply due when the block ends.
    rb.set("k", "v")
    client = runtime.get_redis()
    for wait in (0, 0.4):  # the next command sent before the nil is due, then after it came
        with reads_interrupted(monkeypatch), pytest.raises(Interrupted):
            client.blmove("empty", "elsewhere", 0.3, "RIGHT", "LEFT")
        time.sleep(wait)
        assert client.get("k") == b"v"


def test_a_command_left_unread_is_never_read_by_the_next_in_a_thousand_tries(rb, monkeypatch):
    # The race the select check lost, tried over and over: the reply sometimes there already,
    # sometimes not yet. Every next command must read its own.
    rb.set("k", "v")

    def work():
        wrong = []
        with runtime.own_connection():
            client = runtime.get_redis()
            for i in range(1000):
                with reads_interrupted(monkeypatch), pytest.raises(Interrupted):
                    client.set("n", i)
                got = client.get("k")
                if got != b"v":
                    wrong.append((i, got))
        return wrong

    assert in_thread(work) == []
    assert rb.get("n") == b"999"


def test_a_pubsub_connection_is_left_alone_with_replies_unread(rb):
    # A subscriber's replies are read as messages come; owing some is its normal state.
    pubsub = runtime.get_redis().pubsub()
    try:
        pubsub.subscribe("channel")
        pubsub.ping("a")
        pubsub.ping("b")  # (two sent, none read: a reconnect here would drop the subscription)
        conn = pubsub.connection
        rb.publish("channel", "hello")
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b"hello" not in seen:
            message = pubsub.get_message(timeout=0.5)
            if message:
                seen.append(message["data"])
        assert b"hello" in seen
        assert pubsub.connection is conn and conn._sock is not None
    finally:
        pubsub.close()


def test_the_cluster_client_s_node_connections_count_replies(cluster, on_cluster):
    client = runtime.get_redis()
    node = client.get_default_node().redis_connection
    assert issubclass(node.connection_pool.connection_class, ReplyAccounting)
    assert accounted(redis.Connection) is accounted(redis.Connection)  # (one class per base)
    assert accounted(accounted(redis.Connection)) is accounted(redis.Connection)


def test_on_a_cluster_an_interrupted_command_leaves_no_reply_behind(cluster, cr, on_cluster, monkeypatch):
    client = runtime.get_redis()
    client.set("k", "v")
    admin = client.get_node_from_key("k").redis_connection
    with writes_held_back(admin):
        with reads_interrupted(monkeypatch), pytest.raises(Interrupted):
            client.set("k", "w")  # (same slot, same node, same connection next)
        assert client.get("k") == b"v"  # (the SET still held back: a read goes through)
        assert client.get("k") == b"v"
    assert client.get("k") in (b"v", b"w")  # (the interrupted SET ran, or not: never a stray reply)


class Target:
    """What make_redis reads of the config."""

    def __init__(self, url: str, **options):
        self.redis_url, self.redis_options, self.key_prefix = url, options, ""


@pytest.mark.parametrize("parser", ["redis-py", "hiredis"])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_socket_timeout_still_holds_when_the_kernel_keeps_it(tmp_path, transport, parser):
    # The timeout moved from Python to the kernel (one system call per send and per read, not a
    # poll first): a server that doesn't answer still fails the command after socket_timeout, as
    # redis-py's TimeoutError, and the client works again once it answers.
    socket_path = tmp_path / "redis.sock"
    server = RedisServer(tmp_path / "server", extra_args=["--unixsocket", str(socket_path),
                                                          "--unixsocketperm", "700"]).start()
    try:
        url = server.url if transport == "tcp" else f"unix://{socket_path}?db=0"
        parser_class = _HiredisParser if parser == "hiredis" else _RESP2Parser
        client = make_redis(Target(url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0), parser_class=parser_class))
        assert client.ping()
        conn = client.connection_pool.get_connection()
        try:
            assert isinstance(conn._parser, _HiredisParser) == (parser == "hiredis")
            assert conn._sock.gettimeout() is None  # (Python sees a blocking socket: no poll per call)
        finally:
            client.connection_pool.release(conn)
        server.client().execute_command("CLIENT", "PAUSE", 1500, "ALL")
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError, match="Timeout reading from"):
            client.get("k")
        assert 0.25 <= time.monotonic() - started < 1.2
        time.sleep(1.3)  # (the pause over)
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
    finally:
        server.cleanup()


def test_a_pubsub_wait_shorter_than_the_socket_timeout_still_returns_on_time(tmp_path):
    server = RedisServer(tmp_path).start()
    try:
        client = make_redis(Target(server.url, socket_timeout=5))
        pubsub = client.pubsub()
        pubsub.subscribe("channel")
        assert pubsub.get_message(timeout=1)["type"] == "subscribe"
        started = time.monotonic()
        assert pubsub.get_message(timeout=0.2) is None
        assert time.monotonic() - started < 1
        client.publish("channel", "hello")
        assert pubsub.get_message(timeout=1)["data"] == b"hello"
        pubsub.close()
        client.close()
    finally:
        server.cleanup()
