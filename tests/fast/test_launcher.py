"""The launcher, in process: run in a thread (no signal handlers), stopped with ``stop()``.

Jobs run in this process and record through the suite's Redis (``runtime.get_redis()``); the
launcher itself talks to the suite's Redis, or to a RedisServer a test stops and starts.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import redis
from engine_fixtures import fail_acks, make_config
from helpers import RedisServer, wait_until
from peek import left_no_trace
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.push.client import Client
from testproject.demo.jobs import RecordJob, SleepJob

K = Keys()


# What these tests run a process with, over the fast config.
LAUNCHING = {"QUEUES": ["default"], "CONCURRENCY": 2, "ORPHAN_THRESHOLD": 3, "HEARTBEAT_INTERVAL": 0.5,
             "POLL_INTERVAL_AVERAGE": 0.2, "SHUTDOWN_TIMEOUT": 2}


class Running:
    """A Launcher running in a thread; ``stop()`` returns its exit code."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, name="test-launcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.launcher.run(install_signals=False)

    def stop(self, timeout: float = 30) -> int | None:
        self.launcher.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "launcher did not stop"
        return self.code


@pytest.fixture
def start():
    running: list[Running] = []
    clients: list[redis.Redis] = []

    def _start(config, client=None, **kwargs) -> Running:
        if client is None:
            client = redis.Redis.from_url(config.redis_url)
            clients.append(client)
        launcher = Launcher(config, client, **kwargs)
        running.append(Running(launcher))
        return running[-1]

    yield _start
    for run in running:
        if run.thread.is_alive():
            run.stop()
    for client in clients:
        client.close()


def registered(r, identity: str) -> bool:
    return r.sismember(K.processes, identity)


@pytest.mark.parametrize("fetch", ["reliable", "basic"])
def test_runs_jobs_and_stops_cleanly(start, redis_url, r, fetch):
    run = start(make_config(redis_url, LAUNCHING, FETCH=fetch))
    identity = run.launcher.identity
    wait_until(lambda: registered(r, identity), timeout=10)
    jids = {RecordJob.perform_async("ran") for _ in range(20)}
    wait_until(lambda: set(r.lrange("ran", 0, -1)) == jids, timeout=10)
    assert run.stop() == 0
    assert left_no_trace(r, identity)
    assert r.get(K.stat_processed) == "20"  # the last counts are flushed at exit
    assert sorted(r.lrange("ran", 0, -1)) == sorted(jids)


def test_a_redis_user_without_client_nor_time_runs_jobs(start, redis_url, r):
    # Naming connections (CLIENT SETNAME on every connect) kept such a user from starting at all.
    r.acl_setuser("plain", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all", "-client", "-time"])
    try:
        config = make_config(redis_url.replace("redis://", "redis://plain:pw@"), LAUNCHING)
        client = make_redis(config)  # (the project's client, with its default options)
        run = start(config, client)
        identity = run.launcher.identity
        wait_until(lambda: registered(r, identity), timeout=10)
        jid = RecordJob.perform_async("ran")
        wait_until(lambda: r.lrange("ran", 0, -1) == [jid], timeout=10)
        assert run.stop() == 0
        client.close()
    finally:
        r.acl_deluser("plain")


def test_stop_while_waiting_for_redis_at_startup(start, redis_url, caplog):
    config = make_config("redis://127.0.0.1:1/0", LAUNCHING)
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        run = start(config, client)
        time.sleep(1.0)
        assert run.thread.is_alive()  # still waiting for its first heartbeat
        started = time.monotonic()
        assert run.stop(timeout=10) == 0
    assert time.monotonic() - started < 10
    assert "lost the connection" in caplog.text
    assert "stopped before the first heartbeat" in caplog.text


def test_stop_right_after_the_first_heartbeat_exits_cleanly(redis_url, r, rb):
    # TERM between the first good beat and the start of the threads: nothing started to stop,
    # but the process did register, so it must leave the registry (it used to crash on
    # joining threads never started, exiting 1 with a traceback).
    launcher = Launcher(make_config(redis_url, LAUNCHING), rb)
    first_beat = launcher.heartbeat.beat_until_ok

    def beat_then_term(give_up):
        ok = first_beat(give_up)
        launcher.stop()
        wait_until(give_up.is_set, timeout=5)  # the startup waiter took the stop
        return ok

    launcher.heartbeat.beat_until_ok = beat_then_term
    assert launcher.run(install_signals=False) == 0
    assert left_no_trace(r, launcher.identity)


@pytest.mark.parametrize("fetch", ["reliable", "basic"])
def test_stop_hands_an_unfinished_job_back_to_the_head_of_its_queue(start, redis_url, r, fetch):
    run = start(make_config(redis_url, LAUNCHING, FETCH=fetch, CONCURRENCY=1, SHUTDOWN_TIMEOUT=0.3))
    identity = run.launcher.identity
    wait_until(lambda: registered(r, identity), timeout=10)
    long_jid = SleepJob.perform_async(1.5, "marks")
    wait_until(lambda: f"start:{long_jid}" in r.lrange("marks", 0, -1), timeout=10)
    waiting = [RecordJob.perform_async("ran") for _ in range(2)]
    assert run.stop() == 0
    queue = [json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)]
    assert queue[-1] == long_jid  # the end the fetch pops: it runs next
    assert sorted(queue[:-1]) == sorted(waiting)
    assert left_no_trace(r, identity)
    # (In a real process the exit ends the cut-short run; here its thread finishes on its own.)
    wait_until(lambda: f"end:{long_jid}" in r.lrange("marks", 0, -1), timeout=10)


def test_quiet_then_stop_leaves_new_jobs_queued(start, redis_url, r):
    run = start(make_config(redis_url, LAUNCHING))
    identity = run.launcher.identity
    wait_until(lambda: registered(r, identity), timeout=10)
    run.launcher._signals_put("quiet")
    wait_until(lambda: r.hget(K.process(identity), "quiet") == "true", timeout=10)
    jid = RecordJob.perform_async("ran")
    time.sleep(1.0)
    assert r.llen("ran") == 0
    assert run.stop() == 0
    assert [json.loads(x)["jid"] for x in r.lrange(K.queue("default"), 0, -1)] == [jid]


def test_dump_logs_every_threads_stack(start, redis_url, r, caplog):
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        run = start(make_config(redis_url, LAUNCHING))
        wait_until(lambda: registered(r, run.launcher.identity), timeout=10)
        run.launcher._signals_put("dump")
        wait_until(lambda: "thread dump" in caplog.text, timeout=10)
        assert run.stop() == 0
    for name in ("cogworker-heartbeat", "cogworker-poller", "cogworker-fetcher", "cogworker-processor-0"):
        assert name in caplog.text


@pytest.mark.parametrize("fetch", ["reliable", "basic"])
def test_a_job_received_after_quiet_is_handed_back_not_run_nor_lost(start, redis_url, r, fetch):
    # An idle fetcher sits in a blocking call for up to 2 s. A job that call receives after
    # quiet must not start; after the shutdown deadline (shorter than that wait here) it used to
    # live only in the exiting process's memory: lost, with basic fetch.
    run = start(make_config(redis_url, LAUNCHING, FETCH=fetch, CONCURRENCY=1, SHUTDOWN_TIMEOUT=0.1))
    wait_until(lambda: registered(r, run.launcher.identity), timeout=10)
    time.sleep(0.3)  # idle: the fetcher is blocked
    run.launcher.stop()
    wait_until(lambda: run.launcher.manager.quiet, timeout=10)
    time.sleep(0.3)  # past the deadline: processors gone, the blocking call still waiting
    jid = RecordJob.perform_async("ran")
    run.thread.join(30)
    assert run.code == 0
    assert [json.loads(x)["jid"] for x in r.lrange(K.queue("default"), 0, -1)] == [jid]
    assert r.llen("ran") == 0
    assert left_no_trace(r, run.launcher.identity)


def test_ack_that_keeps_failing_is_not_rerun_at_shutdown(start, redis_url, r, caplog):
    # The ack fails at the job's end and on every retry (the connection cut each time): at
    # shutdown the finished job is dropped from the in-progress list in the same step as the
    # requeue of the rest, never handed back to run again.
    run = start(make_config(redis_url, LAUNCHING))
    launcher = run.launcher

    fail_acks(launcher.fetch, lambda raw: True)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        wait_until(lambda: registered(r, launcher.identity), timeout=10)
        jid = RecordJob.perform_async("ran")
        wait_until(lambda: launcher.manager.pending_settlements(), timeout=10)
        assert r.llen(K.in_progress(launcher.identity)) == 1  # ran, not acknowledged
        assert run.stop() == 0
    assert "settling jid=" in caplog.text
    assert r.lrange("ran", 0, -1) == [jid]
    assert not r.exists(K.queue("default"))
    assert left_no_trace(r, launcher.identity)


def test_ack_lost_while_redis_is_down_is_not_rerun(start, tmp_path, r):
    # The real thing: Redis goes away while a job runs, so its ack fails; Redis comes back before
    # the shutdown. The heartbeat is slow here, so it is the shutdown that settles it.
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    client = redis.Redis.from_url(srv.url, socket_timeout=5, socket_connect_timeout=1)
    srv_r = srv.client(decode_responses=True)
    try:
        config = make_config(srv.url, LAUNCHING, HEARTBEAT_INTERVAL=30, ORPHAN_THRESHOLD=120)
        run = start(config, client)
        launcher = run.launcher
        wait_until(lambda: registered(srv_r, launcher.identity), timeout=10)
        payload = SleepJob.set().build([1.5, "marks"], {})  # records to the suite's Redis
        Client(config, srv.client()).push(payload)
        jid = payload["jid"]
        wait_until(lambda: f"start:{jid}" in r.lrange("marks", 0, -1), timeout=10)
        srv.stop()
        went_down = time.monotonic()
        wait_until(lambda: f"end:{jid}" in r.lrange("marks", 0, -1), timeout=10)
        wait_until(lambda: launcher.manager.pending_settlements(), timeout=30, message="the ack failed")
        srv.start()
        down_for = time.monotonic() - went_down
        assert run.stop() == 0
        assert not srv_r.exists(K.queue("default"))
        assert not srv_r.exists(K.in_progress(launcher.identity))
        assert left_no_trace(srv_r, launcher.identity)
        assert r.lrange("marks", 0, -1) == [f"start:{jid}", f"end:{jid}"]
        print(f"\nFIGURES ack lost (in process): Redis down {down_for:.1f}s around the job's end; "
              f"ack settled at shutdown; runs of the job: 1")
    finally:
        srv_r.close()
        srv.cleanup()
