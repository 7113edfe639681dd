"""The poller (engine/scheduled.py): due schedule and retry entries to their queues, and its rounds."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time

import pytest
from engine_fixtures import (
    RUNS,
    Note,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import FAST_ENV, RedisServer, Worker, wait_until

from django_cogworker import Job
from django_cogworker import payload as payloads
from django_cogworker.client import Client
from django_cogworker.connection import make_redis
from django_cogworker.engine import scheduled
from django_cogworker.engine.key_guard import KeyGuard
from django_cogworker.engine.orphans import OrphanRecovery, steady_grace
from django_cogworker.engine.retry import RetryPolicy
from django_cogworker.engine.scheduled import BATCH, DUE_FLOOR, Poller
from django_cogworker.keys import Keys
from testproject.demo.jobs import RecordJob

K = Keys()
NOW = 1_700_000_000.0


@pytest.fixture
def bclient(redis_url):
    client = make_redis(make_config(redis_url))
    yield client
    client.close()


class Failing:
    """A key guard or orphan recovery with a bug: every call raises."""

    def __init__(self):
        self.calls = 0

    def check(self):
        self.calls += 1
        raise RuntimeError("a bug in this step")


def make_poller(redis_url, client, *, process_count=lambda: 1, rng=None, key_guard=None, orphans=None,
                clock=lambda: NOW, **settings):
    config = make_config(redis_url, **settings)
    retry = RetryPolicy(config, clock=clock)
    return Poller(config, client, K, retry, key_guard or KeyGuard(client, K, config.queue_names),
                  orphans or OrphanRecovery(config, client, K, "poller:1:me", retry),
                  process_count=process_count, rng=rng, clock=clock)


@pytest.fixture
def poller(redis_url, bclient):
    return make_poller(redis_url, bclient)


def entry(jid, queue="default", args=(), **extra):
    return payloads.encode({"jid": jid, "class": "x.Job", "args": list(args), "kwargs": {}, "queue": queue,
                            "retry": True, **extra})


def queued(r, queue="default"):
    """The payloads waiting in ``queue``, next to run first."""
    return [json.loads(raw) for raw in reversed(r.lrange(K.queue(queue), 0, -1))]


def test_due_entries_move_to_their_queues_and_the_rest_wait(poller, r):
    r.zadd(K.schedule, {entry("due-1", "mail", at=NOW - 5): NOW - 5, entry("due-2"): NOW,
                        entry("later"): NOW + 1})
    r.zadd(K.retry, {entry("retry-due", retry_count=0): NOW - 1, entry("retry-later"): NOW + 60})

    assert poller.enqueue_due() == 3

    assert [p["jid"] for p in queued(r, "mail")] == ["due-1"]
    assert [p["jid"] for p in queued(r)] == ["due-2", "retry-due"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.schedule, 0, -1)] == ["later"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.retry, 0, -1)] == ["retry-later"]
    moved = queued(r, "mail")[0]
    assert moved["enqueued_at"] == NOW and "at" not in moved
    assert queued(r)[1]["retry_count"] == 0  # the failure record travels with the job
    assert r.smembers(K.queues) == {"mail", "default"}


def test_large_integers_in_args_survive_exactly(poller, r):
    args = [2 ** 63 + 1, 12345678901234567890123, -(2 ** 70), 0.1, "9007199254740993"]
    r.zadd(K.schedule, {entry("big", args=args): NOW - 1})
    r.zadd(K.retry, {entry("big-retry", args=args): NOW - 1})

    poller.enqueue_due()

    for moved in queued(r):
        assert moved["args"] == args
    assert "12345678901234567890123" in r.lindex(K.queue("default"), 0)


def test_an_entry_whose_queue_key_holds_the_wrong_type_stays_in_the_set(poller, r):
    r.set(K.queue("broken"), "not a list")
    stuck = entry("stuck", "broken")
    r.zadd(K.schedule, {stuck: NOW - 2, entry("fine"): NOW - 1})
    r.zadd(K.retry, {entry("stuck-retry", "broken"): NOW - 1})

    assert poller.enqueue_due() == 1

    # Push first, then remove: the failed push removed nothing.
    assert r.zrange(K.schedule, 0, -1, withscores=True) == [(stuck, NOW - 2)]
    assert r.zcard(K.retry) == 1
    assert [p["jid"] for p in queued(r)] == ["fine"]
    assert r.get(K.queue("broken")) == "not a list"


def test_a_full_batch_of_entries_that_cannot_be_moved_does_not_hold_up_those_behind_it(poller, r):
    r.set(K.queue("broken"), "not a list")
    r.zadd(K.schedule, {entry(f"stuck{i}", "broken"): NOW - 1000 + i for i in range(BATCH + 50)})
    r.zadd(K.schedule, {entry("behind", "default"): NOW - 1, entry("later"): NOW + 60})

    assert poller.enqueue_due() == 1

    assert [p["jid"] for p in queued(r)] == ["behind"]
    assert r.zcard(K.schedule) == BATCH + 51
    assert poller.next_due() == NOW + 60  # the peek: the first entry not yet due, not a stuck one


def test_a_schedule_set_of_the_wrong_type_does_not_hold_up_the_retries(poller, r):
    r.set(K.schedule, "not a zset")
    r.zadd(K.retry, {entry("retry-due"): NOW - 1})

    assert poller.enqueue_due() == 1

    assert [p["jid"] for p in queued(r)] == ["retry-due"]


@pytest.mark.parametrize(("raw", "reason"), [
    ("{this is not json", "unparseable payload"),
    ('["a", "list"]', "not an object"),
    ('{"jid": "x", "args": []}', "no job class"),
    ('{"jid": "x", "class": "x.Job", "args": []}', "names no queue"),
    # Python's json reads NaN, but can't write it back: the move used to raise on every round,
    # before any due entry after it.
    ('{"jid": "x", "class": "x.Job", "args": [NaN], "kwargs": {}, "queue": "default"}', "NaN"),
])
def test_an_unreadable_due_entry_goes_to_dead_with_its_text(poller, r, raw, reason):
    r.zadd(K.schedule, {raw: NOW - 1, entry("fine"): NOW - 1})

    poller.enqueue_due()

    assert r.zcard(K.schedule) == 0
    assert [p["jid"] for p in queued(r)] == ["fine"]
    (dead,) = [json.loads(d) for d in r.zrange(K.dead, 0, -1)]
    assert dead["class"] == "(unparseable)"
    assert dead["raw"] == raw
    assert reason in dead["error_message"]


def poison(jid, *, args="[1e309]", queue='"default"'):
    """A due entry that reads, but can't be written back as it is: 1e309 reads as inf, which JSON can't
    hold; a queue name that is a lone surrogate can't be sent to Redis."""
    return f'{{"jid":"{jid}","class":"x.Job","args":{args},"kwargs":{{}},"queue":{queue},"retry":true}}'


def test_poison_goes_to_dead_with_its_reason_and_the_entries_around_it_move_in_the_same_sweep(poller, r):
    # Once one such entry made the sweep raise, at every round: schedule is swept before retry, so
    # neither the entries after it nor any retry moved again, on any process.
    poisons = {}
    for key in (K.schedule, K.retry):
        poisons[poison(f"inf-{key}")] = "Out of range float values are not JSON compliant"
        poisons[poison(f"queue-{key}", args="[]", queue='"\\udce9"')] = "surrogates not allowed"
        r.zadd(key, {entry(f"before-{key}"): NOW - 3, **{raw: NOW - 2 for raw in poisons if key in raw},
                     entry(f"surrogate-{key}", args=["caf\udce9.bad"]): NOW - 2, entry(f"after-{key}"): NOW - 1})

    poller.enqueue_due()

    assert r.zcard(K.schedule) == r.zcard(K.retry) == 0
    moved = {p["jid"]: p for p in queued(r)}
    assert set(moved) == {f"{what}-{key}" for what in ("before", "surrogate", "after") for key in (K.schedule, K.retry)}
    # Not poison: a lone surrogate in the args is written escaped, and reads back the same.
    assert moved[f"surrogate-{K.retry}"]["args"] == ["caf\udce9.bad"]
    dead = {json.loads(d)["jid"]: d for d in r.zrange(K.dead, 0, -1)}
    assert len(dead) == 4
    for raw, reason in poisons.items():
        kept = dead[json.loads(raw)["jid"]]
        assert kept.startswith(raw[:-1])  # as it was, byte for byte, with the reason appended
        assert reason in json.loads(kept)["dead_reason"]
        assert json.loads(kept)["failed_at"] == NOW


def test_entries_stuck_on_a_key_are_logged_once_a_minute_not_once_per_entry_and_sweep(poller, r, caplog,
                                                                                    monkeypatch):
    caplog.set_level(logging.DEBUG, logger="django_cogworker")
    r.set(K.queue("broken"), "not a list")
    r.zadd(K.schedule, {entry(f"stuck{i}", "broken"): NOW - 100 + i for i in range(50)})
    r.set(K.retry, "not a zset")

    for _ in range(20):
        poller.enqueue_due()

    # One line per stuck entry per sweep was 7,165 lines in 57 s.
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert any("could not move jid=stuck0 to queue 'broken'" in m and K.queue("broken") in m for m in errors)
    assert any(f"due entries of {K.retry} not moved" in m for m in errors)

    caplog.clear()
    monkeypatch.setattr(scheduled, "STUCK_LOG_EVERY", 0.2)
    time.sleep(0.25)
    poller.enqueue_due()
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert any(f"{50 * 20 - 1} more like it since the last report" in m for m in errors)


def test_a_worker_sends_poison_to_dead_and_runs_the_scheduled_jobs_and_retries_around_it(tmp_path, r):
    now = time.time()

    def job(jid):
        return payloads.encode({"jid": jid, "class": RecordJob.name, "args": ["ran", jid], "kwargs": {},
                                "queue": "default", "retry": True})

    def poisoned(jid):
        return job(jid).replace(f'"args":["ran","{jid}"]', '"args":["ran",1e309]')

    r.zadd(K.schedule, {poisoned("poison-s"): now - 2, job("scheduled"): now - 1, job("scheduled-later"): now + 1})
    r.zadd(K.retry, {poisoned("poison-r"): now - 2, job("retry"): now - 1})

    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: sorted(r.lrange("ran", 0, -1)) == ["retry", "scheduled", "scheduled-later"], timeout=20,
                   message="the jobs around the poison ran")
        dead = {json.loads(d)["jid"]: json.loads(d) for d in r.zrange(K.dead, 0, -1)}
        w.term()
        assert w.wait(30) == 0
    assert set(dead) == {"poison-s", "poison-r"}
    assert all("Out of range float" in d["dead_reason"] and d["args"] == ["ran", float("inf")] for d in dead.values())
    assert r.zcard(K.schedule) == r.zcard(K.retry) == 0


def test_more_than_a_batch_of_due_entries_all_move(poller, r):
    r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1000 + i for i in range(BATCH * 2 + 17)})

    assert poller.enqueue_due() == BATCH * 2 + 17

    assert [p["jid"] for p in queued(r)] == [f"j{i}" for i in range(BATCH * 2 + 17)]


def test_two_pollers_racing_move_each_entry_once(redis_url, r):
    clients = [make_redis(make_config(redis_url)) for _ in range(2)]
    try:
        pollers = [make_poller(redis_url, c) for c in clients]
        r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1 for i in range(300)})
        start = threading.Barrier(2)

        def run(p):
            start.wait()
            p.enqueue_due()

        threads = [threading.Thread(target=run, args=(p,)) for p in pollers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()

    assert sorted(p["jid"] for p in queued(r)) == sorted(f"j{i}" for i in range(300))


def test_unsettled_records_are_filed(poller, r):
    failed = entry("ran-and-failed", retry_count=0, error_class="RuntimeError")
    dead = entry("ran-and-died", error_class="RuntimeError")
    r.lpush(K.unsettled,
            payloads.encode({"target": "retry", "score": NOW + 30, "payload": failed}),
            payloads.encode({"target": "dead", "score": NOW, "payload": dead}),
            "not a record")

    assert poller.file_unsettled() == 2

    assert r.zrange(K.retry, 0, -1, withscores=True) == [(failed, NOW + 30)]
    assert r.zrange(K.dead, 0, -1, withscores=True) == [(dead, NOW)]
    assert r.lrange(K.unsettled, 0, -1) == ["not a record"]  # unreadable: left for a human, not dropped
    assert r.llen(K.queue("default")) == 0  # they ran: never requeued


class Extremes(random.Random):
    """uniform() returns its low or high bound."""

    def __init__(self, high):
        super().__init__(0)
        self.high = high

    def uniform(self, a, b):
        return b if self.high else a


@pytest.mark.parametrize("processes", [1, 4, 25])
def test_the_poll_interval_scales_with_the_process_count(redis_url, bclient, processes):
    def interval(high):
        return make_poller(redis_url, bclient, process_count=lambda: processes, rng=Extremes(high),
                           POLL_INTERVAL_AVERAGE=2).poll_interval()

    assert interval(high=False) == pytest.approx(2 * processes * 0.5)
    assert interval(high=True) == pytest.approx(2 * processes * 1.5)
    seeded = make_poller(redis_url, bclient, process_count=lambda: processes, rng=random.Random(1),
                         POLL_INTERVAL_AVERAGE=2)
    samples = [seeded.poll_interval() for _ in range(200)]
    assert min(samples) >= processes and max(samples) <= 3 * processes
    assert len(set(samples)) > 100  # randomised, so processes started together don't poll together


def test_the_poll_interval_counts_at_least_this_process(redis_url, bclient):
    p = make_poller(redis_url, bclient, process_count=lambda: 0, rng=Extremes(False), POLL_INTERVAL_AVERAGE=2)
    assert p.poll_interval() == pytest.approx(1.0)


def test_a_failing_step_does_not_stop_the_due_entries(redis_url, bclient, r):
    guard, orphans = Failing(), Failing()
    p = make_poller(redis_url, bclient, key_guard=guard, orphans=orphans)
    r.zadd(K.schedule, {entry("due"): NOW - 1})
    r.lpush(K.unsettled, payloads.encode({"target": "dead", "score": NOW, "payload": entry("ran")}))

    p.round()

    assert [q["jid"] for q in queued(r)] == ["due"]
    assert r.zcard(K.dead) == 1
    assert (guard.calls, orphans.calls) == (1, 1)
    # The ticker waits for an orphan check that really completed.
    assert not p.first_orphan_check_done.is_set()


def test_the_ticker_is_not_released_while_another_process_recovers_a_dead_list(poller, r):
    r.sadd(K.in_progress_identities, "dead:1:abc")
    r.hset(K.last_beat, "dead:1:abc", "1000.0")  # its last beat long ago: dead
    r.lpush(K.in_progress("dead:1:abc"), entry("interrupted"))
    r.set(K.orphan_lock("dead:1:abc"), "another:2:def", ex=60)

    poller.round()
    assert not poller.first_orphan_check_done.is_set()

    r.delete(K.orphan_lock("dead:1:abc"))
    poller.round()
    assert poller.first_orphan_check_done.is_set()
    assert [q["jid"] for q in queued(r)] == ["interrupted"]


def test_an_unreadable_last_beat_does_not_stall_the_schedule(poller, r):
    r.sadd(K.in_progress_identities, "ghost:1:abc")
    r.hset(K.last_beat, "ghost:1:abc", "not a time")
    r.zadd(K.schedule, {entry("due"): NOW - 1})

    poller.round()

    assert [q["jid"] for q in queued(r)] == ["due"]


def test_a_round_runs_the_key_guard_only_when_due(poller, r):
    r.set(K.retry, "not a zset")
    poller.round()
    assert r.type(K.retry) == "none"  # moved to quarantine
    assert len(r.keys(K.quarantine_prefix + "*")) == 1
    r.set(K.retry, "again")
    poller.round()
    assert r.get(K.retry) == "again"  # not before KEY_GUARD_INTERVAL


def test_a_running_launcher_runs_scheduled_and_due_retry_jobs(launcher_factory, r):
    token = new_token()
    running = launcher_factory()
    now = time.time()
    scheduled = dict(jid="sched", **{"class": Note.name, "args": [token, "scheduled"], "kwargs": {},
                                     "queue": "default", "retry": True})
    retried = dict(scheduled, jid="retried", args=[token, "retried"], retry_count=0)
    not_yet = dict(scheduled, jid="not-yet", args=[token, "not yet"])
    r.zadd(K.schedule, {payloads.encode(scheduled): now - 1, payloads.encode(not_yet): now + 3600})
    r.zadd(K.retry, {payloads.encode(retried): now - 1})

    wait_until(lambda: len(runs(token)) == 2, message="both due jobs ran")

    assert sorted(jid for jid, _ in runs(token)) == ["retried", "sched"]
    assert r.zcard(K.schedule) == 1 and r.zcard(K.retry) == 0
    running.stop()
    assert len(runs(token)) == 2  # the entry not yet due never ran


# -- waking when an entry falls due -----------------------------------------------------------------
#
# The timed rounds are set far apart here (POLL_INTERVAL_AVERAGE 30: a round every 15-45 s), so a
# job that starts within a second of its due time was woken for, not polled for.

LONG = 30


class Stamp(Job):
    """Append the time it started to RUNS[token]."""

    def perform(self, token):
        RUNS[token].append(time.time())


class FailsOnceRetriesInASecond(Job):
    """Append the time it started to RUNS[token]; the first run raises, its retry is due 1 s later."""

    retry = 1

    def retry_in(self, count, exc):
        return 1.0

    def perform(self, token):
        RUNS[token].append(time.time())
        if len(RUNS[token]) == 1:
            raise RuntimeError("first run fails")


def stamp_entry(token):
    return payloads.encode(Stamp.set().build([token], {}))


def started(token, timeout=10):
    """When the first run of the job recording to ``token`` started (waits for it)."""
    return wait_until(lambda: runs(token), timeout=timeout, message="the job ran")[0]


def subscribed_and_settled(poller):
    wait_until(lambda: poller.subscribed, message="poller subscribed")
    time.sleep(0.5)  # past the sweep that follows the subscription: the next round is 15 s away or more


def calls(r):
    """Commands run so far (refused ones included), by name."""
    return {name.removeprefix("cmdstat_"): stat["calls"] + stat.get("rejected_calls", 0)
            for name, stat in r.info("commandstats").items()}


@pytest.fixture
def live_poller(redis_url):
    """``live_poller(**settings)``: a Poller on the real clock, started; stopped at teardown."""
    started_pollers, clients = [], []

    def start(url=None, **settings):
        client = make_redis(make_config(url or redis_url))
        clients.append(client)
        poller = make_poller(url or redis_url, client, clock=time.time, **settings)
        started_pollers.append(poller)
        poller.start()
        return poller

    yield start
    for poller in started_pollers:
        poller.stop()
    for client in clients:
        client.close()


def test_a_verdict_put_off_for_the_grace_comes_when_the_grace_ends_not_a_poll_interval_later(
        live_poller, redis_url, bclient, r):
    # A process that has just started (or whose beats just came back) judges nobody for its
    # grace; it used to come back only a poll interval later (up to 1.5 x 5 s x processes).
    r.sadd(K.in_progress_identities, "dead:1:abc")
    r.hset(K.last_beat, "dead:1:abc", "1000.0")  # its last beat long ago: dead
    r.lpush(K.in_progress("dead:1:abc"), entry("interrupted"))
    config = make_config(redis_url)
    steady_from = time.time() - steady_grace(config) + 1.0  # its grace ends in a second
    orphans = OrphanRecovery(config, bclient, K, "poller:1:me", RetryPolicy(config),
                             steady_since=lambda now: steady_from)
    poller = live_poller(POLL_INTERVAL_AVERAGE=LONG, orphans=orphans)
    wait_until(lambda: r.llen(K.queue("default")) == 1, timeout=5, message="recovered once the grace ended")
    assert time.time() >= steady_from + steady_grace(config)
    assert poller.first_orphan_check_done.is_set()


def test_a_job_scheduled_during_a_long_interval_starts_at_its_due_time(launcher_factory):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(running.launcher.poller)
    token = new_token()
    due = time.time() + 1
    running.client.push(Stamp.set().build([token], {}), at=due)

    assert due <= started(token) <= due + 1.0


def test_an_entry_nobody_announced_is_found_by_the_sweeps_peek(launcher_factory, r):
    # Written as another client would (no message): the boot round's sweep sees it coming.
    token = new_token()
    due = time.time() + 2
    r.zadd(K.schedule, {stamp_entry(token): due})
    launcher_factory(POLL_INTERVAL_AVERAGE=LONG)

    assert due <= started(token) <= due + 1.0


def test_a_retry_filed_by_this_process_wakes_its_poller(launcher_factory):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(running.launcher.poller)
    token = new_token()
    running.push(FailsOnceRetriesInASecond, token)

    first, second = wait_until(lambda: len(runs(token)) == 2 and runs(token), timeout=10, message="retried")
    assert first + 1.0 <= second <= first + 2.0


def test_after_its_subscription_is_cut_the_poller_sweeps_for_what_it_missed(launcher_factory, r, caplog):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    poller = running.launcher.poller
    subscribed_and_settled(poller)
    token = new_token()
    due = time.time() + 2
    r.zadd(K.schedule, {stamp_entry(token): due})  # as if its message had been lost with the connection

    with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.scheduled"):
        assert r.client_kill_filter(_type="pubsub") == 1
        assert due <= started(token) <= due + 1.0

    assert poller.subscribed
    assert [m for m in caplog.messages if "subscription" in m or "subscribed" in m] == [
        f"poller: lost its subscription to {K.schedule_wake} (ConnectionError: Connection closed by server.); "
        f"due jobs wait for the timed rounds (every {LONG}s or so) until it is back",
        f"poller: subscribed to {K.schedule_wake} again"]


def test_the_poller_rides_out_a_redis_restart(launcher_factory, tmp_path, caplog):
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    running = None
    try:
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.scheduled"):
            running = launcher_factory(url=srv.url, POLL_INTERVAL_AVERAGE=LONG)
            poller = running.launcher.poller
            subscribed_and_settled(poller)
            srv.kill()
            wait_until(lambda: not poller.subscribed, timeout=5, message="subscription lost")
            time.sleep(2)  # attempts to subscribe again fail meanwhile
            srv.start()
            wait_until(lambda: poller.subscribed, timeout=20, message="subscribed again")
            token = new_token()
            due = time.time() + 1
            running.client.push(Stamp.set().build([token], {}), at=due)
            assert due <= started(token) <= due + 1.0
        assert poller._thread.is_alive()
        down = [m for m in caplog.messages if "subscri" in m and "again" not in m]
        assert len(down) == 1, down  # logged once, however many attempts failed
        assert any("subscribed to" in m and "again" in m for m in caplog.messages)
    finally:
        if running is not None:
            running.stop()
        srv.cleanup()


def test_messages_that_are_not_due_times_are_ignored(launcher_factory, r, caplog):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    poller = running.launcher.poller
    subscribed_and_settled(poller)
    with caplog.at_level(logging.DEBUG, logger="django_cogworker.engine.scheduled"):
        for bad in ("soon", "", "nan", "-inf", "1e999", "[1700000000]"):
            r.publish(K.schedule_wake, bad)
        token = new_token()
        due = time.time() + 1
        running.client.push(Stamp.set().build([token], {}), at=due)
        assert due <= started(token) <= due + 1.0

    assert poller.subscribed
    assert len([m for m in caplog.messages if "not a due time" in m]) == 6


def test_while_idle_a_process_sweeps_no_more_often_than_its_timed_rounds(live_poller, r):
    # Rounds exactly every second (POLL_INTERVAL_AVERAGE 2, randomised to its low bound).
    poller = live_poller(POLL_INTERVAL_AVERAGE=2, rng=Extremes(high=False))
    subscribed_and_settled(poller)
    r.zadd(K.schedule, {entry("next-week"): time.time() + 7 * 86400})
    r.config_resetstat()
    time.sleep(4.2)
    stats = calls(r)

    rounds = stats.get("lrange", 0)  # (the unsettled step reads its list once a round)
    assert 3 <= rounds <= 5
    assert stats.get("zrangebyscore") == 4 * rounds  # per set, a round reads its due entries and the peek
    assert stats.get("ping", 0) <= rounds  # the subscription's check: one PING a round
    assert "subscribe" not in stats and "zrange" not in stats


def test_a_stream_of_due_entries_does_not_make_the_poller_spin(live_poller, redis_url, r):
    poller = live_poller(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(poller)
    client = Client(make_config(redis_url), poller.redis)
    first = time.time() + 0.5
    r.config_resetstat()
    for i in range(40):  # due every 25 ms for a second, each announced
        client.push({"jid": f"j{i}", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default", "retry": True},
                    at=first + i * 0.025, on_commit=False)
    wait_until(lambda: r.llen(K.queue("default")) == 40, timeout=5, message="all moved")
    elapsed = time.time() - first

    sweeps = calls(r)["zrangebyscore"] / 4
    assert sweeps <= elapsed / DUE_FLOOR + 2


def test_an_entry_that_cannot_be_moved_does_not_wake_the_poller_again_and_again(live_poller, r):
    r.set(K.queue("broken"), "not a list")  # (in no listing: the key guard won't move it aside)
    r.zadd(K.schedule, {entry("stuck", "broken"): time.time() - 1})
    token_due = time.time() + 2
    r.zadd(K.schedule, {entry("behind-it"): token_due})
    r.config_resetstat()
    poller = live_poller(POLL_INTERVAL_AVERAGE=LONG)
    wait_until(lambda: r.llen(K.queue("default")) == 1, timeout=5, message="the entry behind it moved")
    assert time.time() >= token_due
    time.sleep(1)

    # The boot round, the sweep after subscribing, the one at the second entry's due time.
    assert calls(r)["zrangebyscore"] / 4 <= 4
    assert r.zcard(K.schedule) == 1 and poller.subscribed


def test_stop_is_prompt_during_a_long_wait(live_poller):
    poller = live_poller(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(poller)
    begun = time.monotonic()
    poller.stop()
    assert not poller._thread.is_alive()
    assert time.monotonic() - begun < 2


def test_without_the_channel_the_poller_falls_back_to_its_timed_rounds(live_poller, redis_url, r, caplog):
    r.acl_setuser("nochannels", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"],
                  reset_channels=True)
    try:
        url = redis_url.replace("redis://", "redis://nochannels:pw@")
        r.zadd(K.schedule, {entry("due-soon"): time.time() + 1.5})
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.scheduled"):
            r.config_resetstat()
            poller = live_poller(url=url, POLL_INTERVAL_AVERAGE=2, rng=Extremes(high=False))
            time.sleep(3.2)
            stats = calls(r)
            assert not poller.subscribed
        assert [p["jid"] for p in queued(r)] == ["due-soon"]  # by its peek, as ever
        assert stats.get("subscribe", 0) <= stats["lrange"] + 1  # one attempt a round at most
        assert len([m for m in caplog.messages if "subscri" in m]) == 1
        assert "NOPERM" in caplog.messages[0] or "permission" in caplog.messages[0]
    finally:
        r.acl_deluser("nochannels")


class FreezingProxy:
    """A TCP proxy to Redis that can freeze the subscriptions passing through it: their bytes stop
    flowing both ways, the sockets stay open (a flow a firewall dropped, a partition: nothing says so).
    Connections opened after ``freeze()`` flow normally."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.subscribers = []
        self.frozen = []
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze(self):
        self.frozen.extend(self.subscribers)

    def close(self):
        for s in [self.listener, *self.sockets]:
            s.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, client), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, client), daemon=True).start()

    def _pump(self, src, dst, conn):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                dst.close()
                return
            if src is conn and b"SUBSCRIBE" in data and conn not in self.subscribers:
                self.subscribers.append(conn)
            if conn in self.frozen:
                continue  # dropped
            try:
                dst.sendall(data)
            except OSError:
                return


def test_a_subscription_that_stops_answering_is_replaced(live_poller, redis_url, r, caplog):
    proxy = FreezingProxy(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    try:
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.scheduled"):
            # Rounds every second: each checks the subscription with a PING.
            poller = live_poller(url=proxy.url(), POLL_INTERVAL_AVERAGE=2, rng=Extremes(high=False))
            subscribed_and_settled(poller)
            proxy.freeze()
            wait_until(lambda: any("no answer to a PING" in m for m in caplog.messages), timeout=15,
                       message="the silent subscription noticed")
            wait_until(lambda: poller.subscribed, message="subscribed again")
        client = Client(make_config(redis_url), r)
        due = time.time() + 1
        client.push({"jid": "after", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default", "retry": True},
                    at=due, on_commit=False)
        wait_until(lambda: r.llen(K.queue("default")), timeout=5, message="moved")
        assert time.time() <= due + 1.0
    finally:
        proxy.close()


def test_due_entries_move_even_while_the_queues_set_holds_the_wrong_type(poller, r):
    # Registering the queue name is best-effort (the key guard moves the key aside later): a
    # `queues` key of the wrong type must not keep a due job from its queue.
    r.set(K.queues, "not a set")
    r.zadd(K.schedule, {entry("sched", "mail"): NOW - 1})
    r.zadd(K.retry, {entry("retried", retry_count=0): NOW - 1})

    assert poller.enqueue_due() == 2

    assert [p["jid"] for p in queued(r, "mail")] == ["sched"]
    assert [p["jid"] for p in queued(r)] == ["retried"]
    assert r.zcard(K.schedule) == 0 and r.zcard(K.retry) == 0
    assert r.get(K.queues) == "not a set"  # left to the key guard
