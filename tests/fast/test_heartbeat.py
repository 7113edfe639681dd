"""The heartbeat, in process: a Heartbeat with the Manager of a Launcher, beating against the suite's Redis.

What others read of a process (the admin, orphan recovery, `wait_ready`) is what a beat writes:
the process hash (info JSON, busy, quiet) with its TTL, the registries, and the last-beat stamp
taken from Redis's clock. One secondary key of the wrong type must not fail the beat.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import types

import pytest
import redis
from engine_fixtures import make_config
from peek import redis_now
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.api import ProcessSet
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.stall import clock as stall_clock
from django_cogworker.engine.process import heartbeat as heartbeat_module
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.push import payload as payloads

K = Keys()
ID = "hbhost:4242:abcdef"


# What these tests beat with, over the fast config: weighted queues, a concurrency and a tag to report.
BEATING = {"QUEUES": [("alpha", 3), "beta"], "CONCURRENCY": 7, "TAG": "blue", "ORPHAN_THRESHOLD": 3,
           "HEARTBEAT_INTERVAL": 0.5}


@pytest.fixture
def launcher(redis_url, rb):
    return Launcher(make_config(redis_url, BEATING), rb, identity=ID, version="9.9.9")


def test_beat_writes_the_process_hash_with_its_info(launcher, r):
    before = time.time()
    launcher.heartbeat.beat()
    h = r.hgetall(K.process(ID))
    info = json.loads(h["info"])
    assert info["hostname"] == socket.gethostname()
    assert info["pid"] == os.getpid()
    assert info["tag"] == "blue"
    assert before - 5 <= info["started_at"] <= time.time()
    assert info["queues"] == ["alpha", "beta"]
    assert info["weights"] == {"alpha": 3, "beta": 1}
    assert info["concurrency"] == 7
    assert info["version"] == "9.9.9"
    assert info["identity"] == ID
    assert info["fetch"] == "reliable"
    assert isinstance(info["rss_kb"], int) and info["rss_kb"] > 1000
    assert (h["busy"], h["quiet"]) == ("0", "false")
    assert 55 <= r.ttl(K.process(ID)) <= 60
    assert r.sismember(K.processes, ID)
    assert r.sismember(K.in_progress_identities, ID)


def test_busy_and_the_workers_hash_follow_the_running_jobs(launcher, r):
    manager = launcher.manager
    raw = payloads.encode({"jid": "j1", "class": "X", "args": [], "queue": "alpha"}).encode()
    manager.ledger.job_started(Unit(raw, "alpha"), json.loads(raw))
    launcher.heartbeat.beat()
    assert r.hget(K.process(ID), "busy") == "1"
    [entry] = r.hvals(K.workers(ID))
    assert json.loads(entry)["queue"] == "alpha" and json.loads(json.loads(entry)["payload"])["jid"] == "j1"
    assert 55 <= r.ttl(K.workers(ID)) <= 60
    manager.ledger.job_finished(Unit(raw, "alpha"))
    launcher.heartbeat.beat()
    assert r.hget(K.process(ID), "busy") == "0"
    assert not r.exists(K.workers(ID))


def test_quiet_is_published(launcher, r):
    launcher.manager.make_quiet()
    launcher.heartbeat.beat()
    assert r.hget(K.process(ID), "quiet") == "true"


def test_last_beat_uses_redis_time_not_the_hosts_clock(launcher, r, monkeypatch):
    # The host's clock says 1970: the stamp must still be Redis's time.
    monkeypatch.setattr(heartbeat_module, "time", types.SimpleNamespace(time=lambda: 1.0, monotonic=time.monotonic))
    low = redis_now(r)
    launcher.heartbeat.beat()
    high = redis_now(r)
    stamp = float(r.hget(K.last_beat, ID))
    assert low <= stamp <= high
    assert float(r.hget(K.process(ID), "beat")) == stamp


def test_last_beat_falls_back_to_the_hosts_clock_where_time_is_refused(redis_url, r):
    class NoTime(redis.Redis):
        def time(self):
            raise redis.ResponseError("ERR unknown command 'TIME'")

    client = NoTime.from_url(redis_url)
    try:
        launcher = Launcher(make_config(redis_url, BEATING), client, identity=ID)
        launcher.heartbeat.beat()
    finally:
        client.close()
    assert abs(float(r.hget(K.last_beat, ID)) - time.time()) < 5


def test_basic_fetch_writes_no_orphan_registry(redis_url, rb, r):
    launcher = Launcher(make_config(redis_url, BEATING, FETCH="basic"), rb, identity=ID)
    launcher.heartbeat.beat()
    assert r.exists(K.process(ID))
    assert json.loads(r.hget(K.process(ID), "info"))["fetch"] == "basic"
    assert not r.sismember(K.in_progress_identities, ID)
    assert not r.hexists(K.last_beat, ID)


SECONDARY = {
    "processes": (K.processes, "process registry"),
    "in_progress_identities": (K.in_progress_identities, "in-progress registry"),
    "last_beat": (K.last_beat, "last-beat stamp"),
    "paused_queues": (K.paused_queues, "paused queues"),
    "signals": (K.signals(ID), "remote signals"),
}


@pytest.mark.parametrize("name", sorted(SECONDARY))
def test_a_secondary_key_of_the_wrong_type_does_not_fail_the_beat(launcher, r, caplog, name):
    key, what = SECONDARY[name]
    r.set(key, "wrong type")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        launcher.heartbeat.beat()  # does not raise
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert any(what in m and "WRONGTYPE" in m for m in errors), errors
    assert r.get(key) == "wrong type"  # the beat leaves it to the key guard
    # Everything else is written.
    assert json.loads(r.hget(K.process(ID), "info"))["identity"] == ID
    assert r.ttl(K.process(ID)) > 0
    for other, (other_key, _) in SECONDARY.items():
        if other == name:
            continue
        if other == "processes":
            assert r.sismember(other_key, ID)
        elif other == "in_progress_identities":
            assert r.sismember(other_key, ID)
        elif other == "last_beat":
            assert abs(float(r.hget(other_key, ID)) - redis_now(r)) < 5


@pytest.mark.parametrize("poisoned", [None, "last_beat", "in_progress_identities"])
def test_only_a_beat_that_orphan_recovery_can_read_vouches_for_the_jobs_held(launcher, r, poisoned):
    # A job taken before this process may have been taken for dead is asked about before it starts
    # (fetch/stall.py); a beat whose stamp didn't go through keeps nobody from taking it for dead.
    if poisoned:
        r.set(SECONDARY[poisoned][0], "wrong type")
    launcher.heartbeat.beat()
    assert launcher.fetch.stall.covers(stall_clock()) is (poisoned is None)


def test_a_workers_hash_of_the_wrong_type_is_rewritten(launcher, r):
    r.set(K.workers(ID), "wrong type")
    launcher.heartbeat.beat()
    assert not r.exists(K.workers(ID))  # nothing running: no hash


def test_a_process_hash_of_the_wrong_type_fails_the_beat(launcher, r):
    # The one essential write: without it the process isn't alive to anyone.
    r.set(K.process(ID), "wrong type")
    with pytest.raises(redis.ResponseError):
        launcher.heartbeat.beat()


def test_steady_since_marks_the_run_of_good_beats_and_a_failed_beat_ends_it(launcher, r):
    # Orphan recovery gives no verdict until this process's own beats have gone through for a while.
    heartbeat = launcher.heartbeat
    assert heartbeat.steady_since is None
    assert heartbeat.beat_until_ok(threading.Event())
    first = heartbeat.steady_since
    assert abs(first - redis_now(r)) < 2
    heartbeat.beat()
    assert heartbeat.steady_since == first  # still the same run
    r.set(K.process(ID), "wrong type")  # the essential write now fails
    assert not heartbeat._beat_once(heartbeat._watchdog(threading.Event()))
    assert heartbeat.steady_since is None
    r.delete(K.process(ID))
    heartbeat._beat_once(heartbeat._watchdog(threading.Event()))
    assert heartbeat.steady_since > first


def test_a_process_silent_longer_than_the_threshold_says_so_when_it_beats_again(launcher, r, caplog, monkeypatch):
    # A frozen process (SIGSTOP, a long pause) may have been taken for dead meanwhile: its running
    # jobs requeued elsewhere run twice (guarantees, window 1). It can't know for sure; it says so.
    heartbeat = launcher.heartbeat
    clock = {"now": redis_now(r)}
    monkeypatch.setattr(heartbeat, "_redis_now", lambda: clock["now"])
    heartbeat.beat()
    clock["now"] += launcher.config.orphan_threshold - 0.5
    heartbeat.beat()
    assert "without a beat" not in caplog.text
    clock["now"] += launcher.config.orphan_threshold + 1
    heartbeat.beat()
    assert f"went {launcher.config.orphan_threshold + 1:.0f}s without a beat" in caplog.text


def test_a_beat_that_hung_and_went_through_starts_the_grace_again(launcher, r, monkeypatch):
    # Redis stalled for less than the socket timeout: no beat failed, but every process's beats
    # hung alike. Counted as steady, the poller took the others for dead the moment Redis woke.
    heartbeat = launcher.heartbeat
    clock = {"now": redis_now(r)}
    monkeypatch.setattr(heartbeat, "_redis_now", lambda: clock["now"])
    heartbeat.beat()
    first = heartbeat.steady_since
    clock["now"] += launcher.config.heartbeat_interval
    heartbeat.beat()
    assert heartbeat.steady_since == first and heartbeat.steady_at(clock["now"]) == first
    # Overdue: while its own beat is late, the process gives no verdict (its poller may get
    # through before its heartbeat does).
    assert heartbeat.steady_at(clock["now"] + heartbeat.overdue_after() + 0.1) is None
    clock["now"] += heartbeat.overdue_after() + 0.1  # then the hung beat goes through
    heartbeat.beat()
    assert heartbeat.steady_since == clock["now"]  # the grace starts again


def test_the_heartbeat_backs_off_no_longer_than_its_interval(launcher):
    watchdog = launcher.heartbeat._watchdog(threading.Event())
    watchdog.failures = 50
    assert watchdog.pause() == launcher.config.heartbeat_interval


def test_lost_connection_fails_the_beat(redis_url):
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    launcher = Launcher(make_config(redis_url, BEATING), client, identity=ID)
    with pytest.raises(redis.ConnectionError):
        launcher.heartbeat.beat()


def test_remote_signals_are_read_in_the_order_sent(redis_url, rb, r, caplog):
    received = []
    launcher = Launcher(make_config(redis_url, BEATING), rb, identity=ID)
    launcher.heartbeat.on_signal = received.append
    for sig in ("dump", "bogus", "quiet", "stop"):
        r.lpush(K.signals(ID), sig)  # as the admin sends them
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        launcher.heartbeat.beat()
    assert received == ["dump", "quiet", "stop"]
    assert any("bogus" in rec.getMessage() for rec in caplog.records)
    assert not r.exists(K.signals(ID))
    launcher.heartbeat.beat()
    assert received == ["dump", "quiet", "stop"]  # each read once


def test_paused_queues_reach_the_manager(launcher, r):
    r.sadd(K.paused_queues, "beta")
    launcher.heartbeat.beat()
    assert launcher.manager.paused == frozenset({"beta"})
    r.delete(K.paused_queues)
    launcher.heartbeat.beat()
    assert launcher.manager.paused == frozenset()


def _cancellation(launcher):
    from django_cogworker.features.cancellation.hook import Cancellation

    return next(f for f in launcher.features if isinstance(f, Cancellation))


def test_the_chores_after_a_beat_tell_the_cancels_and_delete_stale_requests(launcher, r):
    # (The cancellation feature's chore, which the heartbeat asked it for: the beat names no feature.)
    from django_cogworker.engine.run.cancels import REQUEST_TTL
    from django_cogworker.push.scope import Running

    cancels = _cancellation(launcher).cancels
    asked, other = Running({"jid": "j1"}), Running({"jid": "j2"})
    cancels.started("j1", asked)
    cancels.started("j2", other)
    launcher.heartbeat.beat()
    launcher.heartbeat.run_chores()
    assert not asked.cancelled and not cancels.requested("j1")  # (nobody cancels: nothing told)
    r.hset(K.cancels, mapping={"j1": json.dumps({"at": time.time(), "interrupt": False}),
                               "old": json.dumps({"at": time.time() - REQUEST_TTL - 1, "interrupt": False})})

    launcher.heartbeat.beat()
    launcher.heartbeat.run_chores()

    assert asked.cancelled and not other.cancelled
    assert cancels.requested("j1") and not cancels.requested("old")
    assert r.hkeys(K.cancels) == ["j1"]  # (the stale one deleted by the first process that read it)
    cancels.finished("j1")
    cancels.finished("j2")


def test_cancel_requests_of_the_wrong_type_are_moved_aside_by_the_chore_that_reads_them(launcher, r, caplog):
    # (Each beat logged an ERROR until the key guard's next round, KEY_GUARD_INTERVAL later: the
    # requests are a feature's key, moved aside by whoever meets it.)
    r.set(K.cancels, "wrong type")
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        for _ in range(2):
            launcher.heartbeat.beat()
            launcher.heartbeat.run_chores()
    assert [rec.name for rec in caplog.records] == ["django_cogworker.broker.quarantine"]
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.cancels}:*"))) == 1
    r.hset(K.cancels, "j1", json.dumps({"at": time.time(), "interrupt": False}))
    launcher.heartbeat.beat()
    launcher.heartbeat.run_chores()
    assert _cancellation(launcher).cancels.requested("j1")


def test_stats_are_flushed_by_the_chores_after_a_beat(launcher, r):
    for failed in (False, False, True):
        launcher.stats.job_done(failed=failed)
    launcher.heartbeat.beat()
    launcher.heartbeat.run_chores()
    assert (r.get(K.stat_processed), r.get(K.stat_failed)) == ("3", "1")


def test_process_count_and_stale_registry_entries(launcher, r):
    # A process killed with -9 leaves its identity in `processes`; its hash expires. The
    # registry must not keep it: the admin would list it, and the poll interval (average x
    # process count) would grow with every crash.
    r.sadd(K.processes, "ghost:1:000000", "other:2:111111")
    r.hset(K.process("other:2:111111"), "info", "{}")
    launcher.heartbeat.beat()
    launcher.heartbeat.run_chores()
    assert r.smembers(K.processes) == {ID, "other:2:111111"}
    launcher.heartbeat.beat()
    assert launcher.heartbeat.process_count == 2


def test_clear_leaves_the_registry(launcher, r):
    launcher.heartbeat.beat()
    r.lpush(K.signals(ID), "dump")
    launcher.heartbeat.clear()
    assert not r.sismember(K.processes, ID)
    assert not r.exists(K.process(ID)) and not r.exists(K.workers(ID)) and not r.exists(K.signals(ID))


@pytest.mark.parametrize("interval, ttl", [(0.5, 60), (5, 60), (90, 540), (3600, 21600)])
def test_the_process_and_workers_hashes_and_signals_outlive_the_time_between_beats(redis_url, rb, r, interval, ttl):
    # A fixed 60 s TTL let the hashes of a process beating every 90 s expire between beats: it
    # dropped out of `processes` and the admin (and, its stamp lost too, could be taken for dead),
    # and a remote signal sent to it expired unread.
    config = make_config(redis_url, BEATING, HEARTBEAT_INTERVAL=interval, ORPHAN_THRESHOLD=3 * interval)
    launcher = Launcher(config, rb, identity=ID, version="9.9.9")
    raw = payloads.encode({"jid": "j1", "class": "x", "args": [], "kwargs": {}, "queue": "alpha"}).encode()
    launcher.manager.ledger.job_started(Unit(raw, "alpha"), json.loads(raw))
    launcher.heartbeat.beat()
    for key in (K.process(ID), K.workers(ID)):
        assert ttl - 2 <= r.ttl(key) <= ttl and r.ttl(key) > 2 * interval
    ProcessSet(redis=rb, keys=K).get(ID).quiet()
    assert ttl - 2 <= r.ttl(K.signals(ID)) <= ttl
