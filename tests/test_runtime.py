"""runtime.py: the shared clients, and a processor thread's own connection (``own_connection``).

What users rely on: a job's ``get_redis()`` works the same in a worker as anywhere (every command,
pipelines, after Redis restarts), its connection goes back to the pool when the thread is done,
and a thread outside the worker's processors keeps the shared client.
"""

from __future__ import annotations

from helpers import RedisServer, Sentinels, in_thread

from django_cogworker.push import runtime


def test_within_own_connection_every_command_of_a_thread_goes_over_one_connection_given_back_at_the_end(rb):
    shared = runtime.get_redis()
    pool = shared.connection_pool

    def work():
        with runtime.own_connection():
            client = runtime.get_redis()
            ids = {client.client_id() for _ in range(5)}
            client.incr("counter")
            pipe = client.pipeline(transaction=False)  # (pipelines take their own connection, as before)
            pipe.incr("counter")
            pipe.execute()
            held = client.connection
            in_use = held in pool._in_use_connections
            same_client = runtime.get_redis() is client
        return client, ids, held, in_use, same_client

    client, ids, held, in_use, same_client = in_thread(work)
    assert client is not shared and same_client
    assert len(ids) == 1  # one connection for every command of the thread
    assert in_use  # (checked out of the shared pool: same options, same server)
    assert held not in pool._in_use_connections  # given back when the thread left
    assert rb.get("counter") == b"2"
    assert runtime.get_redis() is shared  # (other threads: the shared client)


def test_a_thread_s_own_connection_comes_back_after_redis_restarts(tmp_path, monkeypatch):
    with RedisServer(tmp_path / "redis") as srv:
        monkeypatch.setenv("COGWORKER_REDIS_URL", srv.url)
        runtime.reset()
        try:
            def work():
                with runtime.own_connection():
                    client = runtime.get_redis()
                    client.set("before", 1)
                    srv.restart()  # (no persistence: "before" is gone)
                    client.set("after", 1)  # reconnects, as the shared client's connections do
                    return client.exists("before", "after")

            assert in_thread(work) == 1
        finally:
            runtime.reset()


def test_on_sentinel_a_thread_keeps_the_shared_client_so_that_failovers_are_followed(tmp_path, monkeypatch):
    # A held connection would skip the Sentinel pool's check of the primary on each checkout.
    sentinels = Sentinels(tmp_path / "servers").start()
    try:
        monkeypatch.setenv("COGWORKER_REDIS_URL", sentinels.url)
        runtime.reset()
        shared = runtime.get_redis()

        def work():
            with runtime.own_connection():
                client = runtime.get_redis()
                client.set("through", "the primary")
                return client

        assert in_thread(work) is shared
        assert sentinels.primary.client().get("through") == b"the primary"
    finally:
        runtime.reset()
        sentinels.cleanup()


def test_a_command_interrupted_before_its_reply_is_read_leaves_no_stale_reply_for_the_next(rb):
    # A job's timeout is raised at any bytecode of its thread: here, between a command sent and
    # its reply read. The thread's next command must get its own reply, not the one left unread.
    class Interrupted(BaseException):
        pass

    rb.set("k", "v")

    def work():
        with runtime.own_connection():
            client = runtime.get_redis()
            client.ping()
            real = client.parse_response

            def interrupted(*args, **kwargs):
                raise Interrupted()

            client.parse_response = interrupted
            try:
                client.incr("counter")  # sent; its reply (1) never read
            except Interrupted:
                pass
            finally:
                client.parse_response = real
            return client.get("k"), client.get("counter")

    assert in_thread(work) == (b"v", b"1")
