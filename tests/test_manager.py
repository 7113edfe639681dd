"""The manager (engine/manager.py) through a real in-process Launcher: settling, pending settlements, stop."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis
from engine_fixtures import (
    GATES,
    Boom,
    Hold,
    Note,
    fail_acks,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    new_token,
    runs,
)
from helpers import RedisServer, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import payload as payloads
from django_cogworker.engine.fetch import Unit
from django_cogworker.engine.retry import Filing
from django_cogworker.keys import Keys

K = Keys()
# Retries with backoff inside redis-py would only slow the outage tests down.
NO_RETRY = {"socket_timeout": 0.75, "socket_connect_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}


@pytest.fixture(params=["reliable", "basic"])
def fetch_mode(request):
    return request.param


def queued_jids(r, queue="default"):
    """jids waiting in ``queue``, the next to run first."""
    return [json.loads(raw)["jid"] for raw in reversed(r.lrange(K.queue(queue), 0, -1))]


def test_a_failed_filing_is_kept_in_memory_and_filed_later_by_the_heartbeat(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")  # after the key guard's boot round: FILE_FAILURE now fails

    pushed = running.push(Boom, token)

    pending = wait_until(running.manager.pending_settlements, message="a pending settlement")
    ((raw, how),) = pending.items()
    assert isinstance(how, Filing) and how.target == "retry" and how.payload["jid"] == pushed["jid"]
    if fetch_mode == "reliable":
        assert r.lrange(running.in_progress, 0, -1) == [raw.decode()]  # not filed, so not acked
    time.sleep(0.5)  # a few beats that still fail
    assert running.manager.pending_settlements()

    r.delete(K.retry)

    wait_until(lambda: not running.manager.pending_settlements(), message="filed by a later beat")
    (filed,) = r.zrange(K.retry, 0, -1)
    assert json.loads(filed)["jid"] == pushed["jid"]
    assert json.loads(filed)["error_message"] == "boom"
    assert r.llen(running.in_progress) == 0
    assert r.llen(K.queue("default")) == 0
    assert runs(token) == [pushed["jid"]]  # ran once: a failed settle never puts a job back to run


def test_an_ack_lost_to_a_redis_outage_is_made_once_redis_is_back(launcher_factory, tmp_path):
    token = new_token()
    with RedisServer(tmp_path / "redis", appendonly=True) as srv:
        client = srv.client(decode_responses=True)
        try:
            running = launcher_factory(url=srv.url, REDIS_OPTIONS=NO_RETRY, CONCURRENCY=1)
            pushed = running.push(Hold, token)
            wait_until(lambda: runs(token) == [("start", pushed["jid"])])
            assert client.llen(running.in_progress) == 1

            srv.stop()  # graceful: the AOF keeps the in-progress list
            GATES[token].set()
            pending = wait_until(running.manager.pending_settlements, message="the ack is pending")
            assert list(pending.values()) == ["ack"]

            srv.start()
            wait_until(lambda: not running.manager.pending_settlements(), timeout=15, message="ack retried")
            assert client.llen(running.in_progress) == 0
            wait_until(lambda: client.get(K.stat_processed) == "1", timeout=15, message="stats flushed")
            assert client.llen(K.queue("default")) == 0
            assert runs(token) == [("start", pushed["jid"]), ("end", pushed["jid"])]  # never run again
            assert running.stop() == 0
        finally:
            client.close()


def _fail_ack_of(running, monkeypatch, jid):
    """Make acknowledging ``jid`` fail as if Redis were away, for the rest of the test."""
    fail_acks(running.launcher.fetch, lambda raw: payloads.decode(raw)["jid"] == jid, monkeypatch)


def test_stop_requeues_a_running_job_to_the_head_of_its_queue_and_drops_pending_acks(launcher_factory, fetch_mode,
                                                                                     r, monkeypatch):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1, SHUTDOWN_TIMEOUT=0.3)
    _fail_ack_of(running, monkeypatch, "finished")
    running.client.push({"jid": "finished", "class": Note.name, "args": [token, "done"], "kwargs": {},
                         "queue": "default"})
    wait_until(lambda: list(running.manager.pending_settlements().values()) == ["ack"])
    running.client.push({"jid": "long", "class": Hold.name, "args": [token], "kwargs": {}, "queue": "default"})
    wait_until(lambda: ("start", "long") in runs(token))
    for jid in ("waiting-1", "waiting-2"):
        running.client.push({"jid": jid, "class": Note.name, "args": [token], "kwargs": {}, "queue": "default"})

    assert running.stop() == 0

    assert queued_jids(r) == ["long", "waiting-1", "waiting-2"]  # the interrupted job runs next
    assert running.manager.pending_settlements() == {}
    assert r.llen(running.in_progress) == 0  # the pending ack was dropped, not requeued
    assert r.sismember(K.in_progress_identities, running.launcher.identity) == 0
    assert r.sismember(K.processes, running.launcher.identity) == 0
    assert runs(token) == [("finished", ["done"]), ("start", "long")]


def test_at_shutdown_an_unfileable_failure_is_handed_over_to_unsettled_never_requeued(launcher_factory, fetch_mode,
                                                                                     r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")
    pushed = running.push(Boom, token)
    wait_until(running.manager.pending_settlements)

    assert running.stop() == 0

    (record,) = r.lrange(K.unsettled, 0, -1)
    assert json.loads(json.loads(record)["payload"])["jid"] == pushed["jid"]
    assert json.loads(record)["target"] == "retry"
    assert r.llen(K.queue("default")) == 0  # it ran: never requeued
    assert r.llen(running.in_progress) == 0
    assert running.manager.pending_settlements() == {}

    # Any live process files it once it can.
    r.delete(K.retry)
    launcher_factory(FETCH=fetch_mode)
    wait_until(lambda: r.llen(K.unsettled) == 0)
    (filed,) = r.zrange(K.retry, 0, -1)
    assert json.loads(filed)["jid"] == pushed["jid"]
    assert runs(token) == [pushed["jid"]]


def test_a_failure_that_cannot_even_be_handed_over_stays_for_orphan_recovery(launcher_factory, r):
    token = new_token()
    running = launcher_factory(KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")
    r.set(K.unsettled, "not a list either")
    pushed = running.push(Boom, token)
    wait_until(running.manager.pending_settlements)

    assert running.stop() == 0

    (left,) = r.lrange(running.in_progress, 0, -1)
    assert json.loads(left)["jid"] == pushed["jid"]  # kept, not requeued to run again now
    assert r.llen(K.queue("default")) == 0
    assert r.sismember(K.in_progress_identities, running.launcher.identity) == 1  # so recovery finds it


def test_quiet_stops_fetching_and_lets_the_running_job_finish(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    held = running.push(Hold, token)
    wait_until(lambda: runs(token) == [("start", held["jid"])])

    running.launcher._signals_put("quiet")
    wait_until(lambda: running.manager.quiet)
    later = running.push(Note, token, "later")
    GATES[token].set()

    wait_until(lambda: ("end", held["jid"]) in runs(token))
    time.sleep(0.5)  # twice the longest fetch wait
    assert queued_jids(r) == [later["jid"]]
    assert len(runs(token)) == 2


@pytest.mark.parametrize("broken", ["retry_pending_settlements", "pending_settlements", "_park_unsettled",
                                    "fetch.requeue", "run_hook"])
@pytest.mark.parametrize("error", [RuntimeError("bug"), redis.ConnectionError("Redis went away"),
                                   UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")],
                         ids=["bug", "outage", "encoding"])
def test_requeue_unfinished_never_raises_whatever_fails_inside_it(launcher_factory, r, caplog, monkeypatch,
                                                                   broken, error):
    # It runs at shutdown, between the wait and the exit: raising there skipped the rest of the
    # shutdown (the heartbeat's goodbye, the registry), and the jobs' fate was nobody's.
    running = launcher_factory(CONCURRENCY=1)
    manager = running.manager
    raw = payloads.encode({"jid": "cut-short", "class": Note.name, "args": ["x"], "kwargs": {},
                           "queue": "default"}).encode()
    r.lpush(running.in_progress, raw)  # taken by this process, interrupted by the shutdown
    owner, name = (manager.fetch, "requeue") if broken == "fetch.requeue" else (manager, broken)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(owner, name, fail)
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        moved = manager.requeue_unfinished([Unit(raw, "default")])
    assert isinstance(moved, int)
    jids = [json.loads(x)["jid"] for x in r.lrange(running.in_progress, 0, -1) + r.lrange(K.queue("default"), 0, -1)]
    assert jids == ["cut-short"]  # requeued, or left for orphan recovery: never lost, never twice
    assert caplog.records  # and what failed is said


def test_a_filing_that_can_never_be_sent_is_filed_as_fetched_with_its_error_never_kept_pending(launcher_factory, r):
    # Waiting changes nothing for such a filing: taken for an outage, it was retried every beat,
    # forever, its job held on the in-progress list.
    running = launcher_factory(CONCURRENCY=1)
    raw = payloads.encode({"jid": "unsendable", "class": Boom.name, "args": ["t"], "kwargs": {},
                           "queue": "default", "retry": 3}).encode()
    r.lpush(running.in_progress, raw)
    payload = payloads.decode(raw)
    payload.update(retry_count=0, failed_at=time.time(), error_class="RuntimeError", error_message="boom",
                   spoiled=float("inf"))  # (a value JSON can't hold, put there by a middleware, say)

    running.manager.settle(raw, Filing("retry", time.time() + 60, payload))

    assert not running.manager.pending_settlements()
    (filed,) = r.zrange(K.retry, 0, -1)
    assert filed.startswith(raw.decode()[:-1])  # as fetched, the failure's fields appended
    assert (json.loads(filed)["error_message"], json.loads(filed)["retry_count"]) == ("boom", 0)
    assert "spoiled" not in json.loads(filed)
    assert r.llen(running.in_progress) == 0
