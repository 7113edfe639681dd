"""The periodic ticker, in process: each slot claimed once, rolled back when its push fails, backed off per entry.

Each test builds Ticker(...) on a real Redis and calls tick(now=...) itself, with an injected
monotonic clock for the backoff. Outage tests use a redis-server of their own, made to refuse
writes as a failover (READONLY) or a full memory (OOM) does. Jobs go through a real Client.push unless a test injects a
failing push. The fleet versions (three runcogworker processes) are in test_periodic_fleet.py.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import zoneinfo

import pytest
import redis
from helpers import RedisServer, refuse, serve_again, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.api.periodic import PeriodicEntry
from django_cogworker.broker import scripts
from django_cogworker.broker.keys import Keys
from django_cogworker.broker.locks import QUEUED_TTL, active_ttl, touch_running
from django_cogworker.conf import build_config
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.engine.schedule.periodic_ticker import Ticker
from django_cogworker.push import payload as payloads
from django_cogworker.push.client import Client
from django_cogworker.push.periodic import Entry

K = Keys()
RECORD = "testproject.demo.jobs.RecordJob"
# 2024-06-01 12:00:30 UTC: half a minute past an every-minute slot.
T0 = int(dt.datetime(2024, 6, 1, 12, 0, 30, tzinfo=dt.UTC).timestamp())
SLOT0 = T0 - 30


def minute(n: int) -> int:
    """The every-minute slot n minutes after SLOT0."""
    return SLOT0 + 60 * n


class Monotonic:
    """An injectable monotonic clock: advance it by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(name: str = "e", cron: str = "* * * * *", **options) -> Entry:
    return Entry(name=name, cron=cron, job=options.pop("job", RECORD), args=tuple(options.pop("args", ("k",))),
                 **options)


@pytest.fixture
def config(redis_url):
    return build_config({}, {"COGWORKER_REDIS_URL": redis_url})


@pytest.fixture
def mono():
    return Monotonic()


@pytest.fixture
def make(rb, config, mono):
    """make(entries, push=None, client=rb, **ticker options) -> Ticker."""

    def build(entries, push=None, client=None, **options):
        client = client if client is not None else rb
        settings = {"ready": lambda: True, "catch_up": False, "catch_up_max": 100, "tick_interval": 5.0,
                    "clock": lambda: T0, "monotonic": mono, **options}
        return Ticker(client, K, entries, push or Client(config, client).push, **settings)

    return build


def jobs(rb, queue: str = "default") -> list[dict]:
    """Payloads waiting in `queue`, oldest first."""
    return [json.loads(raw) for raw in reversed(rb.lrange(K.queue(queue), 0, -1))]


def slots(rb, queue: str = "default") -> list[int]:
    return [p["periodic_slot"] for p in jobs(rb, queue)]


def failures(caplog, name: str) -> int:
    return sum(f"periodic tick failed for {name} " in rec.getMessage() for rec in caplog.records)


def outage_lines(caplog) -> list[tuple[int, str]]:
    """The ticker's lines about Redis being unavailable or back: (level, message)."""
    return [(rec.levelno, rec.getMessage()) for rec in caplog.records
            if rec.name == "django_cogworker.engine.schedule.periodic_ticker"
            and "periodic ticker: Redis" in rec.getMessage()]


@pytest.fixture
def private(tmp_path):
    """(server, bytes client) on a redis-server of this test's own: a fault here never reaches the suite's."""
    server = RedisServer(tmp_path).start()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    yield server, client
    client.close()
    server.cleanup()


# -- claiming --------------------------------------------------------------------------------------


def test_first_sight_primes_last_slot_without_running(make, rb):
    ticker = make([entry("nightly", "0 3 * * *")])
    ticker.tick(now=T0)  # 12:00:30, nine hours after today's 03:00 slot
    assert jobs(rb) == []  # a new entry doesn't run for the slot already due
    today_3am = int(dt.datetime(2024, 6, 1, 3, 0, tzinfo=dt.UTC).timestamp())
    assert rb.get(K.periodic_last_slot("nightly")) == str(today_3am).encode()
    ticker.tick(now=T0 + 3600)
    assert jobs(rb) == []
    tomorrow_3am = today_3am + 86400
    ticker.tick(now=tomorrow_3am + 1)
    assert slots(rb) == [tomorrow_3am]


def test_a_due_slot_is_enqueued_once_with_the_entry_options(make, rb):
    ticker = make([entry("tidy", args=["k", 1], kwargs={"value": "v"}, queue="mail", retry=2)])
    ticker.tick(now=T0)
    for now in (T0 + 30, T0 + 31, T0 + 59):  # one slot, seen by several ticks
        ticker.tick(now=now)
    [job] = jobs(rb, "mail")
    assert job["class"] == RECORD and job["args"] == ["k", 1] and job["kwargs"] == {"value": "v"}
    assert job["queue"] == "mail" and job["retry"] == 2
    assert job["periodic_pjid"] == "tidy" and job["periodic_slot"] == minute(1)
    assert rb.get(K.periodic_last_slot("tidy")) == str(minute(1)).encode()
    assert rb.get(K.periodic_lock("tidy", minute(1))) == job["jid"].encode()
    assert 0 < rb.ttl(K.periodic_lock("tidy", minute(1))) <= 3600
    # A second Ticker (another process) looking at the same slot enqueues nothing.
    make([entry("tidy", args=["k", 1], kwargs={"value": "v"}, queue="mail")]).tick(now=T0 + 40)
    assert len(jobs(rb, "mail")) == 1


def test_the_log_line_shows_the_slot_as_a_time_in_the_entry_zone(make, rb, caplog):
    # It printed "slot 1717243260": epoch seconds nobody reads.
    ticker = make([entry("tidy", args=["k"], tz="Europe/Paris")])
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        ticker.tick(now=T0)
        ticker.tick(now=T0 + 30)
    [job] = jobs(rb)
    assert (f"periodic tidy: slot 2024-06-01 14:01:00+02:00 (Europe/Paris) enqueued as jid={job['jid']}"
            in caplog.messages)


def test_three_tickers_ticking_the_same_moment_claim_each_slot_once(make, redis_url):
    clients = [redis.Redis.from_url(redis_url) for _ in range(3)]
    tickers = [make([entry("a"), entry("b", cron="*/2 * * * *")], client=c) for c in clients]
    barrier = threading.Barrier(3)
    moments = [T0 + 60 * i for i in range(31)]
    errors: list[BaseException] = []

    def run(ticker):
        try:
            for now in moments:
                barrier.wait(10)
                ticker.tick(now=now)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in tickers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert not errors
    by_entry: dict[str, list[int]] = {"a": [], "b": []}
    for job in jobs(clients[0]):
        by_entry[job["periodic_pjid"]].append(job["periodic_slot"])
    assert sorted(by_entry["a"]) == [minute(i) for i in range(1, 31)]
    assert sorted(by_entry["b"]) == [minute(i) for i in range(2, 31, 2)]


# -- catch-up --------------------------------------------------------------------------------------


@pytest.mark.parametrize("catch_up_max, expected", [(100, list(range(1, 11))), (3, [8, 9, 10])])
def test_catch_up_enqueues_the_missed_slots_bounded_by_max(make, rb, catch_up_max, expected):
    ticker = make([entry()], catch_up=True, catch_up_max=catch_up_max)
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 600)  # ten slots passed without a tick (downtime)
    assert slots(rb) == [minute(i) for i in expected]  # oldest first; the newest when bounded
    assert rb.get(K.periodic_last_slot("e")) == str(minute(10)).encode()
    ticker.tick(now=T0 + 601)
    assert len(jobs(rb)) == len(expected)


def test_without_catch_up_missed_slots_are_skipped(make, rb):
    ticker = make([entry()], catch_up=False)
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 600)
    assert slots(rb) == [minute(10)]  # only the latest


@pytest.mark.parametrize("setting, per_entry, expected", [(False, True, 10), (True, False, 1)])
def test_an_entry_catch_up_overrides_the_setting(make, rb, setting, per_entry, expected):
    ticker = make([entry(catch_up=per_entry)], catch_up=setting)
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 600)
    assert len(jobs(rb)) == expected


# -- until_executed --------------------------------------------------------------------------------


def test_until_executed_skips_slots_while_its_run_holds_the_lock(make, rb, config):
    ticker = make([entry(until_executed=True)], catch_up=True)
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 60)
    [run] = jobs(rb)
    lock = K.periodic_running("e")
    assert rb.get(lock) == run["jid"].encode()
    assert QUEUED_TTL - 10 < rb.ttl(lock) <= QUEUED_TTL  # long: the run may wait in a deep queue
    for n in (2, 3, 4):
        ticker.tick(now=T0 + 60 * n)
    assert len(jobs(rb)) == 1  # skipped, not postponed: no catch-up burst later either
    assert rb.get(K.periodic_last_slot("e")) == str(minute(4)).encode()

    # The worker's hook: nothing at start, released when the run ends.
    hook = _run_locks(Launcher(config, rb))
    hook(run, "start")
    assert rb.get(lock) == run["jid"].encode()
    hook(run, "success")
    assert rb.get(lock) is None
    ticker.tick(now=T0 + 300)
    assert slots(rb) == [minute(1), minute(5)]


def _run_locks(launcher):
    """The worker's run locks: the locks feature's (features/locks/hook.py)."""
    from django_cogworker.features.locks.hook import RunLockRelease

    return next(f for f in launcher.features if isinstance(f, RunLockRelease)).run_locks


@pytest.mark.parametrize("moment", ["retry", "dead"])
def test_until_executed_lock_is_released_when_the_run_fails(make, rb, config, moment):
    ticker = make([entry(until_executed=True)])
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 60)
    [run] = jobs(rb)
    _run_locks(Launcher(config, rb))(run, moment)
    assert rb.get(K.periodic_running("e")) is None


def test_a_push_stopped_by_a_middleware_releases_the_running_lock(make, rb):
    stopped = []
    ticker = make([entry(until_executed=True)], push=lambda payload: stopped.append(payload))  # returns None
    ticker.tick(now=T0)
    ticker.tick(now=T0 + 60)
    assert len(stopped) == 1
    assert rb.get(K.periodic_running("e")) is None  # no run will ever release it: don't hold it
    ticker.tick(now=T0 + 120)
    assert [p["periodic_slot"] for p in stopped] == [minute(1), minute(2)]


def test_a_running_lock_outlives_orphan_detection(rb, config):
    """The lock of a run whose process died must still be held when orphan recovery requeues it."""
    for threshold in (3, 300, 1000):
        assert active_ttl(threshold) > threshold + 30
    launcher = Launcher(config.replace(orphan_threshold=300.0), rb)
    payload = {"jid": "j1", "class": RECORD, "args": ["k"], "kwargs": {}, "queue": "default",
               "periodic_pjid": "e", "periodic_slot": minute(1)}
    raw = payloads.encode(payload).encode()
    rb.set(K.periodic_running("e"), "j1", ex=QUEUED_TTL)
    launcher.manager.ledger.job_started(Unit(raw, "default"), payload)
    launcher.heartbeat.run_chores()  # renews the running locks of this process's runs
    assert 300 + 30 < rb.ttl(K.periodic_running("e")) <= active_ttl(300)
    rb.set(K.periodic_running("other"), "someone-else", ex=50)
    touch_running(rb, K, [payloads.encode({**payload, "periodic_pjid": "other"})], 500)
    assert rb.ttl(K.periodic_running("other")) <= 50  # only the jid holding it renews it


# -- a push that fails -----------------------------------------------------------------------------


class FailOnce:
    """A push that raises `error` the first time, then pushes for real."""

    def __init__(self, push, error: BaseException):
        self.push, self.error, self.calls = push, error, 0

    def __call__(self, payload):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return self.push(payload)


@pytest.mark.parametrize("error, backoff", [(RuntimeError("middleware exploded"), 5.0),
                                            (redis.ConnectionError("lost"), 0.0)])
def test_a_failed_push_rolls_back_the_whole_claim_and_the_slot_fires_later(make, rb, config, mono, caplog,
                                                                            error, backoff):
    push = FailOnce(Client(config, rb).push, error)
    ticker = make([entry(until_executed=True)], push=push)
    ticker.tick(now=T0)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0 + 60)
    assert push.calls == 1 and jobs(rb) == []
    # Rolled back in one script: last_slot, the slot's lock and the running lock.
    assert rb.get(K.periodic_last_slot("e")) == str(minute(0)).encode()
    assert rb.get(K.periodic_lock("e", minute(1))) is None
    assert rb.get(K.periodic_running("e")) is None
    assert failures(caplog, "e") == (1 if backoff else 0)  # a lost connection is logged once for all entries
    if backoff:  # the entry failed: it waits; a lost connection is retried at the next tick
        ticker.tick(now=T0 + 65)
        mono.now += backoff - 0.1
        ticker.tick(now=T0 + 70)
        assert push.calls == 1
        mono.now += 0.1
    ticker.tick(now=T0 + 75)
    [run] = jobs(rb)
    assert run["periodic_slot"] == minute(1)
    assert rb.get(K.periodic_running("e")) == run["jid"].encode()


def test_the_rollback_script_keeps_a_later_claim_and_another_runs_lock(rb):
    last, lock, running = K.periodic_last_slot("e"), K.periodic_lock("e", minute(1)), K.periodic_running("e")
    rb.set(last, minute(2))  # another process claimed a later slot since
    rb.set(lock, "j1")
    rb.set(running, "j2")
    scripts.PERIODIC_ROLLBACK(rb, [last, lock, running], [minute(1), minute(0), "j1"])
    assert rb.get(last) == str(minute(2)).encode() and rb.get(lock) is None and rb.get(running) == b"j2"
    # No previous last_slot: slot - 1, which still lets the slot fire (a missing key would be re-primed).
    rb.set(last, minute(1))
    scripts.PERIODIC_ROLLBACK(rb, [last, lock, running], [minute(1), "", "j1"])
    assert rb.get(last) == str(minute(1) - 1).encode()


def test_a_failing_rollback_is_kept_and_retried_before_the_slot_is_looked_at_again(make, rb, config, mono,
                                                                                  caplog):
    real = Client(config, rb).push
    calls = []

    def push(payload):
        if payload["periodic_pjid"] == "other":
            return real(payload)
        calls.append(payload["periodic_slot"])
        if len(calls) == 1:
            # The claim went through; break last_slot so the rollback script errors.
            rb.delete(K.periodic_last_slot("e"))
            rb.hset(K.periodic_last_slot("e"), "broken", "1")
            raise RuntimeError("push failed")
        return real(payload)

    ticker = make([entry(until_executed=True), entry("other")], push=push)
    ticker.tick(now=T0)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0 + 60)
        assert "couldn't roll back slot" in caplog.text
        assert rb.get(K.periodic_lock("e", minute(1))) is not None  # nothing undone yet
        # Still failing: retried (and backed off), and the entry's slot isn't looked at meanwhile.
        ticker.tick(now=T0 + 61)
        assert caplog.text.count("couldn't roll back slot") == 2
    # Repaired (as the rollback left it: this slot claimed); the rollback is still backing off, so
    # the entry waits for it rather than look at the slot with the claim in place.
    rb.delete(K.periodic_last_slot("e"))
    rb.set(K.periodic_last_slot("e"), minute(1))
    ticker.tick(now=T0 + 62)
    assert calls == [minute(1)]
    assert [j["periodic_pjid"] for j in jobs(rb)] == ["other"]  # the other entry was never held up
    mono.now += 5
    ticker.tick(now=T0 + 63)  # rollback first, then the slot is looked at again: it fires
    assert calls == [minute(1), minute(1)]
    assert [(j["periodic_pjid"], j["periodic_slot"]) for j in jobs(rb)] == [("other", minute(1)),
                                                                            ("e", minute(1))]
    assert rb.get(K.periodic_running("e")) == jobs(rb)[-1]["jid"].encode()


def test_a_rollback_failing_while_redis_is_down_is_retried_when_it_is_back(make, tmp_path, config):
    server = RedisServer(tmp_path, appendonly=True).start()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        push_client = Client(config, client)
        calls = []

        def push(payload):
            calls.append(payload["periodic_slot"])
            if len(calls) == 1:
                server.stop()  # the usual reason a push fails: Redis is gone, so the rollback fails too
                raise redis.ConnectionError("Redis went away")
            return push_client.push(payload)

        ticker = make([entry(until_executed=True)], push=push, client=client)
        ticker.tick(now=T0)
        ticker.tick(now=T0 + 60)
        ticker.tick(now=T0 + 61)  # still down: kept, not backed off
        server.start()
        assert client.get(K.periodic_last_slot("e")) == str(minute(1)).encode()  # the claim survived
        ticker.tick(now=T0 + 62)  # rolled back, then claimed again and pushed, in this very tick
        assert calls == [minute(1), minute(1)]
        assert slots(client) == [minute(1)]
        assert client.get(K.periodic_running("e")) == jobs(client)[0]["jid"].encode()
    finally:
        client.close()
        server.cleanup()


def test_a_rollback_lost_to_a_restart_skips_its_slot_and_locks_the_entry_for_the_claim_ttl_only(
        make, tmp_path, config):
    # The push fails with Redis gone, so does the rollback; the process restarts before it could
    # retry it. The lock named a run that never existed: it used to hold for 24 h (a day of slots).
    server = RedisServer(tmp_path, appendonly=True).start()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        def push(payload):
            server.stop()
            raise redis.ConnectionError("Redis went away")

        first = make([entry(until_executed=True)], push=push, client=client, claim_ttl=2)
        first.tick(now=T0)
        first.tick(now=T0 + 60)  # claimed minute 1, the push and its rollback failed: pending
        server.start()  # ... and the process restarted: the pending rollback is gone with it
        assert client.get(K.periodic_last_slot("e")) == str(minute(1)).encode()
        assert 0 < client.ttl(K.periodic_running("e")) <= 2  # the claim's, not QUEUED_TTL
        restarted = make([entry(until_executed=True)], push=Client(config, client).push, client=client,
                         claim_ttl=2)
        restarted.tick(now=T0 + 65)
        assert slots(client) == []  # documented: that slot is skipped
        restarted.tick(now=T0 + 120)
        assert slots(client) == []  # and the entry stays locked, for no more than the claim's TTL
        wait_until(lambda: not client.exists(K.periodic_running("e")), timeout=5)
        restarted.tick(now=T0 + 180)
        assert slots(client) == [minute(3)]
        assert QUEUED_TTL - 10 < client.ttl(K.periodic_running("e"))  # pushed: held for the queue wait
    finally:
        client.close()
        server.cleanup()


def test_a_lock_extension_that_fails_is_retried_at_the_next_tick(make, tmp_path, config):
    server = RedisServer(tmp_path, appendonly=True).start()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        real = Client(config, client).push

        def push(payload):
            jid = real(payload)
            server.stop()  # gone right after the push: the extension fails
            return jid

        ticker = make([entry(until_executed=True)], push=push, client=client)
        ticker.tick(now=T0)
        ticker.tick(now=T0 + 60)
        server.start()
        assert client.ttl(K.periodic_running("e")) <= 300
        ticker.tick(now=T0 + 61)
        assert QUEUED_TTL - 10 < client.ttl(K.periodic_running("e"))
        assert client.get(K.periodic_running("e")) == jobs(client)[0]["jid"].encode()
    finally:
        client.close()
        server.cleanup()


# -- one failing entry -----------------------------------------------------------------------------


def test_a_failing_entry_backs_off_without_holding_up_the_others(make, rb, mono, caplog):
    rb.hset(K.periodic_last_slot("broken"), "wrong", "type")
    ticker = make([entry("broken"), entry("fine")])
    ticker.tick(now=T0)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0)
        delays = []
        now = T0
        for _ in range(10):  # attempts at 0, 5, 15, 35, ... s: waits of 5, 10, 20, ... up to 300 s
            attempts = failures(caplog, "broken")
            waited = 0.0
            while failures(caplog, "broken") == attempts:
                mono.now += 1
                waited += 1
                now += 60
                ticker.tick(now=now)
            delays.append(waited)
        assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]
        assert "next try in 300s" in caplog.text and "WRONGTYPE" in caplog.text
    # Meanwhile "fine" ran every slot.
    fine = [j["periodic_slot"] for j in jobs(rb) if j["periodic_pjid"] == "fine"]
    assert fine == [SLOT0 + 60 * i for i in range(1, (now - T0) // 60 + 1)]
    # Repaired: the next attempt succeeds and resets the backoff.
    rb.delete(K.periodic_last_slot("broken"))
    mono.now += 300
    ticker.tick(now=now)  # first sight again: primed
    ticker.tick(now=now + 60)
    assert jobs(rb)[-1]["periodic_pjid"] in ("broken", "fine")
    assert any(j["periodic_pjid"] == "broken" for j in jobs(rb))
    rb.delete(K.periodic_last_slot("broken"))
    rb.hset(K.periodic_last_slot("broken"), "wrong", "again")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=now + 120)
        assert "failed for broken (next try in 5s)" in caplog.text


def test_a_lost_connection_backs_nothing_off_and_is_logged_once_lost_once_back(make, mono, tmp_path, caplog):
    server = RedisServer(tmp_path, appendonly=True).start()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        ticker = make([entry("a"), entry("b")], client=client)
        ticker.tick(now=T0)
        server.stop()
        with caplog.at_level(logging.INFO, logger="django_cogworker"):
            for i in range(3):
                ticker.tick(now=T0 + 60 + i)
            server.start()
            mono.now += 12
            ticker.tick(now=T0 + 63)  # same monotonic time as the failures: nothing is waiting out a backoff
        assert sorted((j["periodic_pjid"], j["periodic_slot"]) for j in jobs(client)) == [("a", minute(1)),
                                                                                        ("b", minute(1))]
        # Once when lost, once when back: not a line per entry per tick.
        [(lost_level, lost), (back_level, back)] = outage_lines(caplog)
        assert lost_level == back_level == logging.WARNING
        assert "Redis is unavailable (ConnectionError" in lost
        assert back == "periodic ticker: Redis is back after 12.0s"
        assert failures(caplog, "a") == failures(caplog, "b") == 0
    finally:
        client.close()
        server.cleanup()


@pytest.mark.parametrize("how", ["readonly", "oom", "masterdown"])
def test_redis_refusing_writes_backs_nothing_off_and_the_next_slot_runs_once_it_serves(make, private, mono, caplog,
                                                                                     how):
    """A failover (READONLY), a full memory (OOM): the first slot used to run up to 300 s late after it."""
    _, client = private
    ticker = make([entry("a"), entry("b")], client=client)
    ticker.tick(now=T0)
    refuse(client, how)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        now = T0 + 55
        for _ in range(14):  # 70 s refused, a tick every 5 s
            mono.now += 5
            now += 5
            ticker.tick(now=now)
        if how != "masterdown":  # (which refuses reads too)
            assert jobs(client) == []
        serve_again(client)
        mono.now += 5
        ticker.tick(now=now + 5)  # the very next tick, not a backoff later
    assert sorted((j["periodic_pjid"], j["periodic_slot"]) for j in jobs(client)) == [("a", minute(2)),
                                                                                    ("b", minute(2))]
    [(_, lost), (_, back)] = outage_lines(caplog)
    assert {"readonly": "ReadOnlyError", "oom": "OutOfMemoryError", "masterdown": "MasterDownError"}[how] in lost
    assert back == "periodic ticker: Redis is back after 70.0s"
    assert failures(caplog, "a") == failures(caplog, "b") == 0
    assert "treating a as enabled" not in caplog.text  # an unreadable disabled set is the set's fault, not this


@pytest.mark.parametrize("how", ["readonly", "oom"])
def test_a_push_refused_by_redis_is_rolled_back_once_it_serves_again_without_backoff(make, private, config, mono,
                                                                                    caplog, how):
    _, client = private
    real = Client(config, client).push
    calls = []

    def push(payload):
        calls.append(payload["periodic_slot"])
        if len(calls) == 1:
            refuse(client, how)  # the claim went through; from the push on, Redis refuses (and so the rollback)
        return real(payload)

    ticker = make([entry(until_executed=True)], push=push, client=client)
    ticker.tick(now=T0)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        ticker.tick(now=T0 + 60)
        assert client.get(K.periodic_last_slot("e")) == str(minute(1)).encode()  # the claim stands: rollback pending
        for i in range(1, 4):
            mono.now += 5
            ticker.tick(now=T0 + 60 + i)  # retried every tick, the slot not looked at meanwhile
        assert calls == [minute(1)]
        serve_again(client)
        ticker.tick(now=T0 + 64)  # rolled back, claimed again and pushed, in this very tick
    assert calls == [minute(1), minute(1)]
    [run] = jobs(client)
    assert run["periodic_slot"] == minute(1) and client.get(K.periodic_running("e")) == run["jid"].encode()
    assert [line for _, line in outage_lines(caplog)][1:] == ["periodic ticker: Redis is back after 15.0s"]
    assert "couldn't roll back" not in caplog.text and failures(caplog, "e") == 0


def test_a_key_of_the_wrong_type_still_backs_its_entry_off_while_redis_refuses_writes(make, private, mono, caplog):
    _, client = private
    client.hset(K.periodic_last_slot("broken"), "wrong", "type")
    ticker = make([entry("broken"), entry("fine")], client=client)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        ticker.tick(now=T0)  # WRONGTYPE at 0 s: backed off 5 s
        refuse(client, "readonly")
        for i in range(1, 8):  # 1 s apart: WRONGTYPE again at 5 s, backed off 10 s
            mono.now += 1
            ticker.tick(now=T0 + 60 + i)
        serve_again(client)
        mono.now += 1
        ticker.tick(now=T0 + 68)
        assert failures(caplog, "broken") == 2 and "WRONGTYPE" in caplog.text
        assert "failed for broken (next try in 10s)" in caplog.text
        assert [j["periodic_pjid"] for j in jobs(client)] == ["fine"]  # the refused one ran at once
        mono.now += 6
        ticker.tick(now=T0 + 69)
        assert failures(caplog, "broken") == 2  # still waiting out its backoff, until 15 s
    assert [line for _, line in outage_lines(caplog)][1:] == ["periodic ticker: Redis is back after 7.0s"]


# -- disabled entries ------------------------------------------------------------------------------


@pytest.mark.parametrize("catch_up", [False, True])
def test_a_disabled_entry_is_skipped_without_advancing_and_re_enabling_does_not_burst(make, rb, catch_up):
    ticker = make([entry("off"), entry("on")], catch_up=catch_up)
    ticker.tick(now=T0)
    rb.sadd(K.periodic_disabled, "off")
    for n in range(1, 6):
        ticker.tick(now=T0 + 60 * n)
    assert {j["periodic_pjid"] for j in jobs(rb)} == {"on"}
    assert rb.get(K.periodic_last_slot("off")) == str(minute(0)).encode()  # last run stays the last run
    assert not rb.keys(K.periodic_lock("off", "*"))
    rb.srem(K.periodic_disabled, "off")
    ticker.tick(now=T0 + 360)
    assert [j["periodic_slot"] for j in jobs(rb) if j["periodic_pjid"] == "off"] == [minute(6)]


@pytest.mark.parametrize("catch_up", [False, True])
def test_re_enabling_does_not_burst_on_a_process_that_never_saw_it_disabled(make, rb, catch_up):
    make([entry("off")]).tick(now=T0)  # it ran at minute 0 (last_slot primed)
    rb.sadd(K.periodic_disabled, "off")
    # Half an hour later it is enabled again from the admin; this process starts after that (or
    # its ticker never ticked while it was disabled): it caught up all 30 skipped slots at once.
    PeriodicEntry("off", {}, enabled=False, last_slot=None, redis=rb, keys=K).enable(now=T0 + 1800)
    assert not rb.sismember(K.periodic_disabled, "off")
    fresh = make([entry("off")], catch_up=catch_up)
    fresh.tick(now=T0 + 1805)
    assert slots(rb) == []  # minute 30 fell due while it was disabled
    fresh.tick(now=T0 + 1860)
    assert slots(rb) == [minute(31)]


def test_enabling_an_entry_that_was_not_disabled_records_nothing(rb):
    PeriodicEntry("on", {}, enabled=True, last_slot=None, redis=rb, keys=K).enable(now=T0)
    assert not rb.exists(K.periodic_enabled_at)


def test_an_unreadable_enabled_at_record_is_logged_and_the_entry_still_runs(make, rb, caplog):
    ticker = make([entry("a"), entry("b")], catch_up=True)
    ticker.tick(now=T0)
    rb.hset(K.periodic_enabled_at, "a", "yesterday")
    rb.hset(K.periodic_enabled_at, "b", "1e999")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0 + 60)
    assert sorted(slots(rb)) == [minute(1), minute(1)]
    assert "not a time" in caplog.text
    rb.delete(K.periodic_enabled_at)
    rb.set(K.periodic_enabled_at, "wrong type")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0 + 120)
    assert sorted(slots(rb)) == [minute(1), minute(1), minute(2), minute(2)]
    assert f"can't read {K.periodic_enabled_at}" in caplog.text


def test_an_unreadable_disabled_set_counts_as_enabled(make, rb, caplog):
    rb.set(K.periodic_disabled, "not a set")
    ticker = make([entry()])
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.tick(now=T0)
        ticker.tick(now=T0 + 60)
    assert slots(rb) == [minute(1)]
    assert "treating e as enabled" in caplog.text


def test_a_running_lock_of_the_wrong_type_fails_the_claim_before_it_takes_the_slot(make, rb, mono):
    ticker = make([entry("guarded", until_executed=True)])
    ticker.tick(now=T0)  # primes last_slot
    rb.rpush(K.periodic_running("guarded"), "not a lock")
    ticker.tick(now=T0 + 60)
    assert jobs(rb) == []
    assert not rb.exists(K.periodic_lock("guarded", minute(1)))  # the slot wasn't taken: it isn't lost
    rb.delete(K.periodic_running("guarded"))  # (as the key guard does)
    mono.now += 300  # past the entry's backoff
    ticker.tick(now=T0 + 60)
    assert slots(rb) == [minute(1)]


def test_a_last_slot_that_is_not_a_number_is_written_anew(make, rb):
    rb.set(K.periodic_last_slot("e"), "garbage")
    ticker = make([entry()])
    ticker.tick(now=T0 + 60)
    assert slots(rb) == [minute(1)]  # it failed every claim for good before
    assert rb.get(K.periodic_last_slot("e")) == str(minute(1)).encode()


# -- start: the schedule, the ready gate -----------------------------------------------------------


def test_start_publishes_the_schedule_and_waits_for_ready(make, rb):
    ready = threading.Event()
    ticker = make([entry("nightly", "0 3 * * *", args=["k"], queue="mail", tz="Europe/Paris",
                         until_executed=True)], ready=ready.is_set, tick_interval=0.05)
    ticker.start()
    try:
        published = json.loads(rb.hget(K.periodic_schedule, "nightly"))
        assert time.time() - 5 < published.pop("published_at") <= time.time()
        assert published == {"cron": "0 3 * * *", "job": RECORD, "queue": "mail", "tz": "Europe/Paris",
                             "args": ["k"], "kwargs": {}, "until_executed": True}
        time.sleep(0.3)
        assert rb.get(K.periodic_last_slot("nightly")) is None  # not ticking before the orphan check
        ready.set()
        wait_until(lambda: rb.get(K.periodic_last_slot("nightly")) is not None, timeout=5)
    finally:
        ticker.stop()


def test_a_schedule_that_cannot_be_published_does_not_stop_start(make, rb, caplog):
    rb.set(K.periodic_schedule, "wrong type")
    ticker = make([entry()], tick_interval=0.05)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.start()
    try:
        assert "periodic schedule not published" in caplog.text
        wait_until(lambda: rb.get(K.periodic_last_slot("e")) == str(minute(0)).encode(), timeout=5)  # ticking
    finally:
        ticker.stop()


def test_the_schedule_is_published_again_every_interval_and_after_a_failure(make, rb, mono):
    rb.set(K.periodic_schedule, "wrong type")
    ticker = make([entry()], publish_interval=60)
    ticker.tick(now=T0)  # the first publication fails (logged): ticking goes on
    assert rb.get(K.periodic_last_slot("e")) is not None
    rb.delete(K.periodic_schedule)  # (as the key guard does)
    mono.now += 59
    ticker.tick(now=T0)
    assert not rb.exists(K.periodic_schedule)  # not before the interval
    mono.now += 1
    ticker.tick(now=T0)
    first = json.loads(rb.hget(K.periodic_schedule, "e"))["published_at"]
    mono.now += 60
    time.sleep(0.01)
    ticker.tick(now=T0)
    assert json.loads(rb.hget(K.periodic_schedule, "e"))["published_at"] > first  # kept fresh


# -- daylight saving time --------------------------------------------------------------------------

DST = [("Europe/Paris", dt.date(2024, 3, 31), dt.date(2024, 10, 27), 2),
       ("America/New_York", dt.date(2024, 3, 10), dt.date(2024, 11, 3), 1)]


def local_runs(rb, tz: str) -> dict[str, list[dt.datetime]]:
    zone = zoneinfo.ZoneInfo(tz)
    runs: dict[str, list[dt.datetime]] = {"daily": [], "hourly": []}
    for job in jobs(rb):
        runs[job["periodic_pjid"]].append(dt.datetime.fromtimestamp(job["periodic_slot"], zone))
    return runs


@pytest.mark.parametrize("catch_up", [False, True])
@pytest.mark.parametrize("tz, spring, fall, repeated_hour", DST, ids=[d[0] for d in DST])
def test_dst_days_run_each_named_wall_clock_time_once(make, rb, catch_up, tz, spring, fall, repeated_hour):
    """Ticked every 4 minutes across both DST days.

    Spring forward: "30 2" names a time that doesn't exist that day; croniter moves it to 03:00 (the
    first instant after the gap), so it runs once, at 03:00. The hourly entry has no 02:00 run.
    Fall back: an hour happens twice; the entries run once per wall-clock time named.
    """
    zone = zoneinfo.ZoneInfo(tz)
    ticker = make([entry("daily", "30 2 * * *", tz=tz), entry("hourly", "0 * * * *", tz=tz)], catch_up=catch_up)
    for day in (spring, fall):
        start = dt.datetime.combine(day - dt.timedelta(days=1), dt.time(22, 30), zone).timestamp()
        end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0, 30), zone).timestamp()
        now = start
        while now <= end:
            ticker.tick(now=now)
            now += 240
    runs = local_runs(rb, tz)

    def on(day, which):
        return [t for t in runs[which] if t.date() == day]

    [daily] = on(spring, "daily")
    assert (daily.hour, daily.minute) == (3, 0)
    assert [t.hour for t in on(spring, "hourly")] == [h for h in range(24) if h != 2]
    [daily] = on(fall, "daily")
    assert (daily.hour, daily.minute) == (2, 30)
    assert [t.hour for t in on(fall, "hourly")] == list(range(24))  # 25 hours, 24 runs
    assert len([t for t in on(fall, "hourly") if t.hour == repeated_hour]) == 1
    assert len({(t.date(), t.hour, t.minute) for t in runs["hourly"]}) == len(runs["hourly"])


@pytest.mark.parametrize("tz, spring, fall, repeated_hour", DST, ids=[d[0] for d in DST])
def test_catch_up_across_a_dst_change_runs_each_wall_clock_time_once(make, rb, tz, spring, fall, repeated_hour):
    zone = zoneinfo.ZoneInfo(tz)
    for day, hours in ((spring, [1, 3, 4, 5]), (fall, [1, 2, 3, 4, 5])):
        rb.flushdb()
        ticker = make([entry("daily", "30 2 * * *", tz=tz), entry("hourly", "0 * * * *", tz=tz)], catch_up=True)
        ticker.tick(now=dt.datetime.combine(day, dt.time(0, 30), zone).timestamp())
        ticker.tick(now=dt.datetime.combine(day, dt.time(5, 30), zone).timestamp())  # down through the change
        runs = local_runs(rb, tz)
        assert [t.hour for t in runs["hourly"]] == hours, runs
        assert len(runs["daily"]) == 1


def test_a_tick_that_raises_is_logged_backed_off_and_the_thread_ticks_on(make, caplog, monkeypatch):
    # The ticker's thread runs its ticks under the same Watchdog as the other loops.
    ticker = make([entry()], tick_interval=0.05)
    ticks = []

    def tick():
        ticks.append(time.monotonic())
        if len(ticks) == 1:
            raise RuntimeError("a bug outside the per-entry handling")

    monkeypatch.setattr(ticker, "tick", tick)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        ticker.start()
        try:
            wait_until(lambda: len(ticks) >= 3, timeout=5, message="the ticker ticked on")
        finally:
            ticker.stop()
    assert [rec.getMessage() for rec in caplog.records if rec.exc_info] == [
        "periodic ticker failed (attempt 1); backing off"]
