"""runtime.py: the shared clients, and a processor thread's own connection (``own_connection``).

What users rely on: a job's ``get_redis()`` works the same in a worker as anywhere (every command,
pipelines, after Redis restarts), its connection goes back to the pool when the thread is done,
and a thread outside the worker's processors keeps the shared client.
"""

from __future__ import annotations

import select
import threading
import time

from helpers import RedisServer, in_thread, wait_until

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from django_cogworker.push import runtime
from testproject.demo.jobs import RecordJob


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


def in_two_processor_threads(first, second) -> tuple[int, int]:
    """Run ``first`` on a thread inside own_connection, then ``second`` on another, each thread
    holding its connection until both are done; return the ids of their two connections."""
    ids: dict[str, int] = {}
    first_done, second_done = threading.Event(), threading.Event()

    def run(name, fn, after, done):
        with runtime.own_connection():
            ids[name] = runtime.get_redis().client_id()
            assert after is None or after.wait(10)
            fn()
            done.set()
            assert (second_done if done is first_done else first_done).wait(10)

    threads = [threading.Thread(target=run, args=("first", first, None, first_done)),
               threading.Thread(target=run, args=("second", second, first_done, second_done))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert first_done.is_set() and second_done.is_set()
    return ids["first"], ids["second"]


def last_commands(rb) -> dict[int, str]:
    """Each connection's last command, by connection id."""
    return {int(client["id"]): client["cmd"] for client in rb.client_list()}


def test_each_processor_thread_pushes_over_its_own_connection_not_the_first_pusher_s(rb):
    # The push client is built by the first push of the process, here a processor thread's: it
    # must not keep that thread's connection for the pushes of every other thread.
    runtime.reset()
    try:
        first, second = in_two_processor_threads(lambda: RecordJob.perform_async("k", "first"),
                                                 lambda: RecordJob.perform_async("k", "second"))
        commands = last_commands(rb)
        assert {commands[first], commands[second]} <= {"eval", "evalsha"}  # (PUSH; EVAL loads it)
    finally:
        runtime.reset()
    assert rb.llen(Keys().queue("default")) == 2


def test_an_api_object_made_in_a_processor_thread_never_sends_over_that_thread_s_connection(rb):
    # An object kept past its job (a module-level DeadSet(), say) is used from other threads.
    made = []
    rb.lpush(Keys().queue("default"), "a", "b")
    first, _second = in_two_processor_threads(lambda: made.append(api.Queue("default")),
                                              lambda: made.append(made[0].size()))
    assert made[1] == 2
    assert last_commands(rb)[first] == "client|id"  # (no LLEN of the other thread's over it)



def test_a_thread_s_own_client_handed_to_another_thread_never_drops_a_command_in_flight(rb):
    # A job may hand its get_redis() to a thread it starts (docs/jobs.md). The held connection's
    # check before a command (data waiting: the server's close) must not take the reply of the
    # other thread's command, sent and not read yet, for one: it dropped the connection under it.
    rb.set("k", "v")
    got: dict = {}

    def work():
        with runtime.own_connection():
            client = runtime.get_redis()
            client.ping()
            conn = client.connection
            real = conn.read_response
            handed = threading.Thread(target=lambda: got.update(other=client.get("k")))

            def slow_to_read(*args, **kwargs):
                conn.read_response = real  # (once: the other thread reads as usual)
                wait_until(lambda: select.select((client.connection._sock,), (), (), 0)[0],
                           message="the reply waiting, unread")
                handed.start()
                handed.join(0.5)  # (it sends its command now, or waits for this one to be read)
                return real(*args, **kwargs)

            time.sleep(runtime.QUIET_CHECK)  # (quiet that long: the next command is checked first)
            conn.read_response = slow_to_read
            try:
                got["mine"] = client.incr("counter")
            finally:
                handed.join(10)

    in_thread(work)
    assert got == {"mine": 1, "other": b"v"}
    assert rb.get("counter") == b"1"
