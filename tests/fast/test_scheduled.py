"""The poller (engine/schedule/poller.py): its rounds, its interval, and waking for due entries."""

from __future__ import annotations

import random
import time

import pytest
from engine_fixtures import (
    Note,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import wait_until
from peek import queued_payloads
from poller_fixtures import (
    LONG,
    NOW,
    Extremes,
    Failing,
    FailsOnceRetriesInASecond,
    K,
    Stamp,
    bclient_fixture,  # noqa: F401 - the bclient fixture
    calls,
    entry,
    live_poller_fixture,  # noqa: F401 - the live_poller fixture
    make_poller,
    poller_fixture,  # noqa: F401 - the poller fixture
    stamp_entry,
    subscribed_and_settled,
    woken_for,
)

from django_cogworker.engine.recovery.orphans import OrphanRecovery, steady_grace
from django_cogworker.engine.schedule.due import DUE_FLOOR
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.push import payload as payloads
from django_cogworker.push.client import Client


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

    assert [q["jid"] for q in queued_payloads(r)] == ["due"]
    assert r.zcard(K.dead) == 1
    assert (guard.calls, orphans.calls) == (1, 1)
    # The ticker waits for an orphan check that really completed.
    assert not p.first_orphan_check_done.is_set()


def test_an_unreadable_last_beat_does_not_stall_the_schedule(poller, r):
    r.sadd(K.in_progress_identities, "ghost:1:abc")
    r.hset(K.last_beat, "ghost:1:abc", "not a time")
    r.zadd(K.schedule, {entry("due"): NOW - 1})

    poller.round()

    assert [q["jid"] for q in queued_payloads(r)] == ["due"]


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
    # (Within 10 s: a poll interval later would be 15 s or more, LONG.)
    wait_until(lambda: r.llen(K.queue("default")) == 1, timeout=10, message="recovered once the grace ended")
    assert time.time() >= steady_from + steady_grace(config)
    # (Set once the check that moved it returned: a moment after the entry is back in its queue.)
    wait_until(poller.first_orphan_check_done.is_set, timeout=10, message="the first orphan check done")


def test_a_job_scheduled_during_a_long_interval_starts_at_its_due_time(launcher_factory):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(running.launcher.poller)
    token = new_token()
    due = time.time() + 1
    running.client.push(Stamp.set().build([token], {}), at=due)

    woken_for(token, due)


def test_an_entry_nobody_announced_is_found_by_the_sweeps_peek(launcher_factory, r):
    # Written as another client would (no message): the boot round's sweep sees it coming.
    token = new_token()
    due = time.time() + 2
    r.zadd(K.schedule, {stamp_entry(token): due})
    launcher_factory(POLL_INTERVAL_AVERAGE=LONG)

    woken_for(token, due)


def test_a_retry_filed_by_this_process_wakes_its_poller(launcher_factory):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    subscribed_and_settled(running.launcher.poller)
    token = new_token()
    running.push(FailsOnceRetriesInASecond, token)

    first, second = wait_until(lambda: len(runs(token)) == 2 and runs(token), timeout=10, message="retried")
    assert first + 1.0 <= second <= first + 2.0


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
    # per set, a round reads its due entries and the peek (the batch closings' sweep, every 15 s,
    # ran at the boot round, before these 4 s)
    assert stats.get("zrangebyscore") == 4 * rounds
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

