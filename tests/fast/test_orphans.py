"""Orphan recovery, in process: the in-progress lists of dead processes come back, once each.

A process is dead to the others when its last beat (Redis's clock) is older than
ORPHAN_THRESHOLD, or when it has had neither a last beat nor a process hash for ORPHAN_THRESHOLD
(counted from when the judging process first saw it so). Its jobs go back to the end their queue
is popped from with orphan_count + 1, at most MAX_ORPHANINGS times; at the orphaning after that
they go to dead instead, recorded in repeat_orphans. The end-to-end versions (real processes killed with -9) are in
test_faults.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import redis
from peek import queued_payloads, redis_now

from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.engine.recovery.orphans import OrphanRecovery, steady_grace
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.push import payload as payloads

K = Keys()
THRESHOLD = 3.0
DEAD = "deadhost:111:aaaaaa"
LIVE = "livehost:222:bbbbbb"


@pytest.fixture
def config(redis_url):
    return build_config({"ORPHAN_THRESHOLD": THRESHOLD, "HEARTBEAT_INTERVAL": 0.5, "MAX_ORPHANINGS": 3},
                        {"COGWORKER_REDIS_URL": redis_url})


def recoverer(config, client, identity=LIVE) -> OrphanRecovery:
    return OrphanRecovery(config, client, K, identity, RetryPolicy(config))


def payload(n: int, queue: str = "default", **extra) -> str:
    return payloads.encode({"jid": f"jid{n:05d}", "class": "testproject.demo.jobs.RecordJob", "args": ["k"],
                            "kwargs": {}, "queue": queue, "retry": True, "created_at": 1.0, **extra})


def in_flight(r, identity: str, raws: list[str], beat_age: float | None) -> None:
    """Make ``identity`` look like a process with ``raws`` taken, last beat ``beat_age`` s ago."""
    r.sadd(K.in_progress_identities, identity)
    for raw in raws:
        r.lpush(K.in_progress(identity), raw)  # as LMOVE ... LEFT puts them
    if beat_age is not None:
        r.hset(K.last_beat, identity, repr(redis_now(r) - beat_age))


def forgotten(r, identity: str) -> bool:
    return (not r.sismember(K.in_progress_identities, identity) and not r.hexists(K.last_beat, identity)
            and not r.exists(K.in_progress(identity)) and not r.exists(K.orphan_lock(identity)))


def test_stale_beat_list_requeued_with_orphan_count_and_identity_forgotten(config, rb, r):
    r.lpush(K.queue("default"), payload(999))  # waiting before the crash
    in_flight(r, DEAD, [payload(1), payload(2, orphan_count=1), payload(3, queue="mail")], beat_age=THRESHOLD + 2)
    assert recoverer(config, rb).check() == 3
    default = queued_payloads(r)
    # Back at the end the fetch pops (runs next), ahead of the job that was waiting: it now runs last.
    assert default[-1]["jid"] == "jid00999"
    assert {p["jid"]: p["orphan_count"] for p in default[:-1]} == {"jid00001": 1, "jid00002": 2}
    assert all(p["orphaned_from"] == DEAD for p in default[:-1])
    [mail] = queued_payloads(r, "mail")
    assert (mail["jid"], mail["orphan_count"]) == ("jid00003", 1)
    assert r.sismember(K.queues, "mail")
    assert forgotten(r, DEAD)
    assert r.zcard(K.dead) == 0 and r.llen(K.repeat_orphans) == 0


def test_fresh_beat_is_left_alone(config, rb, r):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD - 1.5)
    assert recoverer(config, rb).check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1
    assert r.sismember(K.in_progress_identities, DEAD)
    assert not r.exists(K.queue("default"))


def test_no_beat_but_a_live_process_hash_is_left_alone(config, rb, r):
    # Started, its last-beat stamp not written (yet, or that write failing): alive all the same.
    in_flight(r, DEAD, [payload(1)], beat_age=None)
    r.hset(K.process(DEAD), "info", "{}")
    assert recoverer(config, rb).check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1


@pytest.fixture
def quick(redis_url):
    """A config whose threshold a test can wait out."""
    return build_config({"ORPHAN_THRESHOLD": 1.2, "HEARTBEAT_INTERVAL": 0.5, "MAX_ORPHANINGS": 3},
                        {"COGWORKER_REDIS_URL": redis_url})


def test_no_beat_and_no_process_hash_is_dead_once_the_threshold_has_passed_unseen(quick, rb, r):
    in_flight(r, DEAD, [payload(1)], beat_age=None)
    orphans = recoverer(quick, rb)
    # The stamp may just have been lost (quarantined, a failover) while the process lives: no
    # verdict until ORPHAN_THRESHOLD has passed with no beat, counted from this first sight.
    assert orphans.check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1 and orphans.settled
    time.sleep(0.6)
    assert orphans.check() == 0
    time.sleep(0.7)
    assert orphans.check() == 1
    assert [p["jid"] for p in queued_payloads(r)] == ["jid00001"]
    assert forgotten(r, DEAD)


def test_a_beat_or_process_hash_seen_again_restarts_the_count(quick, rb, r):
    in_flight(r, DEAD, [payload(1)], beat_age=None)
    orphans = recoverer(quick, rb)
    assert orphans.check() == 0
    time.sleep(0.8)
    r.hset(K.process(DEAD), "info", "{}")  # it beats again: alive
    assert orphans.check() == 0
    r.delete(K.process(DEAD))  # silent again: counted afresh from the next sight
    assert orphans.check() == 0
    time.sleep(0.5)
    assert orphans.check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1
    time.sleep(0.8)
    assert orphans.check() == 1


def test_a_stamp_lost_while_the_process_lives_is_no_verdict(quick, rb, r):
    # The process's hash expired during a stall shorter than the threshold, its last_beat lost
    # to a failover: it comes back, beats again, and keeps its running jobs.
    in_flight(r, DEAD, [payload(1)], beat_age=None)
    orphans = recoverer(quick, rb)
    assert orphans.check() == 0
    time.sleep(0.8)
    r.hset(K.last_beat, DEAD, repr(redis_now(r)))
    time.sleep(0.6)
    assert orphans.check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1


def test_a_process_never_recovers_its_own_list(config, rb, r):
    in_flight(r, LIVE, [payload(1)], beat_age=THRESHOLD + 10)
    assert recoverer(config, rb, identity=LIVE).check() == 0
    assert r.llen(K.in_progress(LIVE)) == 1


def test_empty_list_of_a_dead_process_is_just_forgotten(config, rb, r):
    in_flight(r, DEAD, [], beat_age=THRESHOLD + 1)
    assert recoverer(config, rb).check() == 0
    assert forgotten(r, DEAD)


def test_a_list_being_recovered_by_another_process_is_skipped(config, rb, r):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 1)
    r.set(K.orphan_lock(DEAD), "someone-else", ex=60)
    orphans = recoverer(config, rb)
    assert orphans.check() == 0
    assert r.llen(K.in_progress(DEAD)) == 1
    # Not settled while the other process recovers: the periodic ticker keeps waiting.
    assert not orphans.settled
    r.delete(K.orphan_lock(DEAD))
    assert orphans.check() == 1
    assert orphans.settled


def test_a_check_that_finds_nothing_to_recover_is_settled(config, rb, r):
    orphans = recoverer(config, rb)
    assert not orphans.settled  # (no check yet)
    in_flight(r, "fresh:1:abc", [payload(1)], beat_age=1)
    assert orphans.check() == 0
    assert orphans.settled


def test_a_recovery_lock_without_an_expiry_is_given_one_not_obeyed_for_ever(config, rb, r, caplog):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 1)
    r.set(K.orphan_lock(DEAD), "someone-long-gone")
    orphans = recoverer(config, rb)
    assert orphans.check() == 0 and not orphans.settled  # held: not now
    assert 0 < r.ttl(K.orphan_lock(DEAD)) <= max(THRESHOLD, 60)  # but it lapses
    assert "held no expiry" in caplog.text
    r.delete(K.orphan_lock(DEAD))  # (as its expiry will)
    assert orphans.check() == 1


def test_a_recovery_lock_of_the_wrong_type_is_moved_aside_and_the_list_recovered(config, rb, r, caplog):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 1)
    r.rpush(K.orphan_lock(DEAD), "x")
    assert recoverer(config, rb).check() == 1
    assert "is no lock (the wrong type)" in caplog.text
    assert [k for k in r.keys(K.quarantine_prefix + "*") if K.orphan_lock(DEAD) in k]


def test_a_process_that_beats_again_before_its_list_is_recovered_keeps_it(config, rb, r, caplog):
    # Judged on a beat read before the lock: a process that woke from a stall meanwhile stamps its
    # beat before it starts a job it took ahead (fetch/stall.py); recovered after that, the job
    # ran both there and here.
    in_flight(r, DEAD, [payload(1)], beat_age=0.5)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        assert recoverer(config, rb).recover(DEAD, THRESHOLD + 1) == 0
    assert r.lrange(K.in_progress(DEAD), 0, -1) == [payload(1)] and not r.exists(K.queue("default"))
    assert not r.exists(K.orphan_lock(DEAD)) and f"{DEAD} beat again" in caplog.text
    r.hset(K.last_beat, DEAD, repr(redis_now(r) - THRESHOLD - 1))  # silent again, for good
    assert recoverer(config, rb).recover(DEAD, THRESHOLD + 1) == 1 and forgotten(r, DEAD)


def test_a_lock_taken_over_by_another_recoverer_is_not_released_by_this_one(config, rb, r, monkeypatch):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 1)
    orphans = recoverer(config, rb)
    real = orphans._recover_batch

    def lock_expires_mid_recovery(*args):
        r.set(K.orphan_lock(DEAD), "another:2:ccc")  # ours lapsed; another process took it
        r.rpush(K.in_progress(DEAD), payload(2))  # (so the list isn't forgotten, lock and all)
        return real(*args)

    monkeypatch.setattr(orphans, "_recover_batch", lock_expires_mid_recovery)
    orphans.recover(DEAD, 10.0)
    assert r.get(K.orphan_lock(DEAD)) == "another:2:ccc"


def test_a_list_missing_from_the_registry_is_found_and_recovered(config, rb, r, caplog):
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 1)
    r.srem(K.in_progress_identities, DEAD)  # the registry lost it (quarantined, a failover...)
    r.rpush(K.in_progress(LIVE), payload(2))  # our own list: never touched
    orphans = recoverer(config, rb)
    assert orphans.check() == 1
    assert [p["jid"] for p in queued_payloads(r)] == ["jid00001"]
    assert "missing from" in caplog.text and DEAD in caplog.text
    assert r.llen(K.in_progress(LIVE)) == 1 and not r.sismember(K.in_progress_identities, LIVE)


def test_no_verdict_until_this_process_has_beaten_steadily_for_the_grace(config, rb, r):
    # After Redis refused writes (or was away) everyone's beats are stale: the others must get
    # the time to beat again before their silence counts.
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 60)
    steady = {"since": None}  # our own beats are failing
    orphans = OrphanRecovery(config, rb, K, LIVE, RetryPolicy(config), steady_since=lambda now: steady["since"])
    assert orphans.check() == 0 and not orphans.settled and orphans.deferred_for is None
    steady["since"] = redis_now(r) - steady_grace(config) + 1  # beating again, not for long enough
    assert orphans.check() == 0 and not orphans.settled
    assert 0.5 < orphans.deferred_for <= 1.0  # the poller comes back when the grace ends
    assert r.llen(K.in_progress(DEAD)) == 1
    steady["since"] = redis_now(r) - steady_grace(config) - 0.1
    assert orphans.check() == 1 and orphans.settled
    assert [p["jid"] for p in queued_payloads(r)] == ["jid00001"]


def test_the_grace_outlasts_a_beat_and_its_backoff(config):
    # Once writes come back, a live process beats within an interval plus a backoff capped at one.
    assert steady_grace(config) > 2 * config.heartbeat_interval


def _race(config, redis_url, recoverers: int) -> list[int]:
    """Run ``recoverers`` OrphanRecovery.check loops at once (each its own identity and connection)."""
    clients = [redis.Redis.from_url(redis_url) for _ in range(recoverers)]
    barrier = threading.Barrier(recoverers)
    handled = [0] * recoverers
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(3):
                handled[i] += recoverer(config, clients[i], identity=f"live-{i}:1:dd").check()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(recoverers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert not errors, errors
    return handled


def test_concurrent_recoverers_requeue_each_job_exactly_once(config, redis_url, r):
    rounds, total_jobs = 6, 0
    for round_no in range(rounds):
        r.flushdb()
        dead = [f"dead{round_no}-{i}:1:cc" for i in range(3)]
        jobs = {d: [payload(1000 * i + n) for n in range(250)] for i, d in enumerate(dead)}
        for d in dead:
            in_flight(r, d, jobs[d], beat_age=THRESHOLD + 5)
        handled = _race(config, redis_url, recoverers=4)
        requeued = queued_payloads(r)
        jids = [p["jid"] for p in requeued]
        assert len(jids) == len(set(jids)) == sum(len(v) for v in jobs.values()) == sum(handled)
        assert {p["orphan_count"] for p in requeued} == {1}
        assert all(forgotten(r, d) for d in dead)
        total_jobs += len(jids)
    print(f"\nFIGURES concurrent orphan recovery: {rounds} rounds x 4 recoverers, {total_jobs} jobs, "
          f"0 requeued twice, 0 lost")


def test_past_max_orphanings_the_job_goes_to_dead_and_is_recorded(config, rb, r, caplog):
    # MAX_ORPHANINGS 3: requeued at its 1st, 2nd and 3rd orphaning; dead at the 4th.
    in_flight(r, DEAD, [payload(1, orphan_count=3), payload(2, orphan_count=2)], beat_age=THRESHOLD + 1)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert recoverer(config, rb).check() == 2
    [(raw, _score)] = r.zrange(K.dead, 0, -1, withscores=True)
    dead = json.loads(raw)
    assert dead["jid"] == "jid00001" and dead["orphan_count"] == 4
    assert "orphaned 4 times" in dead["error_message"] and "MAX_ORPHANINGS is 3" in dead["error_message"]
    assert "orphaned" in dead["dead_reason"]
    assert dead["error_class"] == "Orphaned"
    [record] = [json.loads(x) for x in r.lrange(K.repeat_orphans, 0, -1)]
    assert (record["jid"], record["orphan_count"], record["from"]) == ("jid00001", 4, DEAD)
    assert [(p["jid"], p["orphan_count"]) for p in queued_payloads(r)] == [("jid00002", 3)]
    assert forgotten(r, DEAD)
    assert any("jid00001" in rec.getMessage() and "dead" in rec.getMessage() for rec in caplog.records)


def test_past_max_orphanings_the_jobs_unique_and_periodic_locks_are_freed(config, rb, r):
    held = {K.unique("d1"): "jid00001", K.periodic_running("nightly"): "jid00001", K.unique("d3"): "jid00003"}
    for key, jid in held.items():
        r.set(key, jid, ex=600)
    in_flight(r, DEAD, [payload(1, orphan_count=3, unique_digest="d1", unique_for=600, periodic_pjid="nightly"),
                        payload(3, orphan_count=3, unique_digest="d3", unique_for=600, dead=False),
                        payload(2, orphan_count=0, unique_digest="d2", unique_for=600)],
              beat_age=THRESHOLD + 1)
    r.set(K.unique("d2"), "jid00002", ex=600)

    recoverer(config, rb).check()

    assert forgotten(r, DEAD)
    # Dead and discarded: they won't run again, so a new push of the same job may go now.
    assert not any(r.exists(key) for key in held)
    # Requeued: still waiting to run, its lock stays.
    assert r.get(K.unique("d2")) == "jid00002"


def test_past_max_orphanings_a_job_with_dead_false_is_discarded(config, rb, r):
    in_flight(r, DEAD, [payload(1, orphan_count=3, dead=False)], beat_age=THRESHOLD + 1)
    recoverer(config, rb).check()
    assert r.zcard(K.dead) == 0 and not r.exists(K.queue("default"))
    assert forgotten(r, DEAD)


@pytest.mark.parametrize("max_orphanings", [1, 3])
def test_a_job_is_requeued_max_orphanings_times_then_goes_to_dead(redis_url, rb, r, max_orphanings):
    config = build_config({"ORPHAN_THRESHOLD": THRESHOLD, "HEARTBEAT_INTERVAL": 0.5,
                           "MAX_ORPHANINGS": max_orphanings}, {"COGWORKER_REDIS_URL": redis_url})
    raw = payload(1)
    requeues = 0
    for crash in range(1, max_orphanings + 2):
        identity = f"crashed{crash}:1:aa"
        in_flight(r, identity, [raw], beat_age=THRESHOLD + 1)  # taken by a process that then died
        recoverer(config, rb).check()
        back = r.rpop(K.queue("default"))
        if back is None:
            break
        requeues += 1
        raw = back
    assert requeues == max_orphanings  # with MAX_ORPHANINGS 1, a crashed worker's jobs still come back once
    [dead] = [json.loads(x) for x in r.zrange(K.dead, 0, -1)]
    assert dead["orphan_count"] == max_orphanings + 1 and dead["error_class"] == "Orphaned"


def test_unparseable_entry_goes_to_dead_and_the_rest_is_requeued(config, rb, r):
    in_flight(r, DEAD, [payload(1), "{not json", payload(2)], beat_age=THRESHOLD + 1)
    assert recoverer(config, rb).check() == 3
    assert sorted(p["jid"] for p in queued_payloads(r)) == ["jid00001", "jid00002"]
    [dead] = [json.loads(x) for x in r.zrange(K.dead, 0, -1)]
    assert dead["class"] == payloads.UNPARSEABLE_CLASS
    assert dead["raw"] == "{not json"
    assert "orphaned" in dead["error_message"]
    assert forgotten(r, DEAD)


@pytest.mark.timeout(60)
def test_a_broken_queue_key_does_not_stop_the_other_recoveries_nor_lose_its_jobs(config, rb, r, caplog):
    # More stuck entries than one batch, with good ones behind them: recovery must read past them
    # (it used to re-read the same batch forever), requeue the rest, and keep the stuck ones.
    first, second = "a-dead:1:aa", "b-dead:1:bb"  # recovered in this order
    good = [payload(n) for n in range(1, 4)]
    stuck = [payload(n, queue="broken") for n in range(100, 250)]
    in_flight(r, first, good + stuck, beat_age=THRESHOLD + 1)  # LPUSHed: the stuck ones come first
    in_flight(r, second, [payload(99)], beat_age=THRESHOLD + 1)
    r.set(K.queue("broken"), "wrong type")
    rec = recoverer(config, rb)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert rec.check() == 4
    assert sorted(p["jid"] for p in queued_payloads(r)) == ["jid00001", "jid00002", "jid00003", "jid00099"]
    assert r.llen(K.in_progress(first)) == len(stuck)
    assert r.sismember(K.in_progress_identities, first)  # not forgotten while jobs remain
    assert any("150 job(s) left" in m.getMessage() for m in caplog.records), caplog.text
    r.delete(K.queue("broken"))  # what the key guard does (moves it aside)
    assert rec.check() == len(stuck)
    assert len(queued_payloads(r, "broken")) == len(stuck)
    assert {p["orphan_count"] for p in queued_payloads(r, "broken") + queued_payloads(r)} == {1}
    assert forgotten(r, first) and forgotten(r, second)


def test_a_registry_of_the_wrong_type_skips_the_round(config, rb, r, caplog):
    r.set(K.last_beat, "wrong type")
    in_flight(r, DEAD, [payload(1)], beat_age=None)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert recoverer(config, rb).check() == 0  # no information, no verdicts
    assert r.llen(K.in_progress(DEAD)) == 1
    assert any("orphan check skipped" in m.getMessage() for m in caplog.records)


@pytest.mark.parametrize("poison", ['"args":[1e309],"queue":"default"', '"args":[],"queue":"tenant-\\udc00"'],
                         ids=["infinity", "queue-name-not-utf8"])
def test_an_entry_that_cant_be_written_back_goes_to_dead_and_the_rest_is_requeued(config, rb, r, caplog, poison):
    # It reads (json takes 1e309 as inf, and "\udc00"), but can't be written again: requeued with
    # the others, it failed the batch's script every round and none of the list ever came back.
    bad = '{"jid":"jidpoison","class":"testproject.demo.jobs.RecordJob",' + poison + ',"kwargs":{},"retry":true}'
    in_flight(r, DEAD, [payload(1), bad, payload(2)], beat_age=THRESHOLD + 1)
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert recoverer(config, rb).check() == 3
    assert sorted(p["jid"] for p in queued_payloads(r)) == ["jid00001", "jid00002"]
    [stored] = r.zrange(K.dead, 0, -1)
    assert stored.startswith(bad[:-1])  # kept byte for byte, what dead entries say appended
    dead = json.loads(stored)
    assert dead["jid"] == "jidpoison" and dead["class"] == "testproject.demo.jobs.RecordJob"
    assert "can't be written back" in dead["dead_reason"] and dead["orphan_count"] == 1
    assert forgotten(r, DEAD)
    assert "jidpoison" in caplog.text


def test_a_lone_surrogate_in_args_is_no_poison_and_reads_back_the_same(config, rb, r):
    odd = '{"jid":"odd","class":"testproject.demo.jobs.RecordJob","args":["caf\\udce9"],"kwargs":{},"queue":"default"}'
    in_flight(r, DEAD, [odd], beat_age=THRESHOLD + 1)
    assert recoverer(config, rb).check() == 1
    [back] = queued_payloads(r)
    assert back["args"] == ["caf\udce9"] and back["orphan_count"] == 1


def test_an_entry_that_cant_be_written_back_past_max_orphanings_still_goes_to_dead(config, rb, r):
    bad = ('{"jid":"jidpoison","class":"testproject.demo.jobs.RecordJob","args":[1e309],"kwargs":{},'
           '"queue":"default","orphan_count":3}')
    in_flight(r, DEAD, [bad, payload(1)], beat_age=THRESHOLD + 1)
    assert recoverer(config, rb).check() == 2
    [stored] = r.zrange(K.dead, 0, -1)
    dead = json.loads(stored)
    assert stored.startswith(bad[:-1]) and dead["jid"] == "jidpoison"
    assert "orphaned 4 times" in dead["dead_reason"] and dead["error_class"] == "Orphaned"
    assert [p["jid"] for p in queued_payloads(r)] == ["jid00001"]
    assert forgotten(r, DEAD)


def test_an_identity_that_is_not_utf8_is_skipped_and_the_dead_processes_jobs_still_recovered(config, rb, r, caplog):
    # One unreadable member of the registry failed every check: no dead process's jobs came back.
    rb.sadd(K.in_progress_identities, b"\xff\xfe")
    in_flight(r, DEAD, [payload(1)], beat_age=THRESHOLD + 2)
    with caplog.at_level(logging.ERROR, logger="django_cogworker.engine.recovery.registry"):
        assert recoverer(config, rb).check() == 1
    assert [p["jid"] for p in queued_payloads(r)] == ["jid00001"]
    assert forgotten(r, DEAD)
    assert any("not UTF-8" in rec.getMessage() for rec in caplog.records)
