"""locks: take, touch and release a lock only as its holder; the periodic running locks.

The locks in use are covered where they are used too: unique jobs (test_unique.py), orphan
recovery's lock (test_orphans.py), the running locks under a ticker (test_periodic_ticker.py).
"""

from __future__ import annotations

import logging

from django_cogworker.broker import locks
from django_cogworker.broker.keys import Keys
from django_cogworker.broker.locks import QUEUED_TTL, retake_running

K = Keys()


def test_take_is_set_nx_with_a_ttl_and_tells_the_holder(rb):
    assert locks.take(rb, K, "cogworker:unique:d", "j1", 60) == (True, None)
    assert 0 < rb.ttl("cogworker:unique:d") <= 60
    assert locks.take(rb, K, "cogworker:unique:d", "j2", 60) == (False, b"j1")
    assert rb.get("cogworker:unique:d") == b"j1"


def test_a_lock_key_of_the_wrong_type_is_quarantined_and_the_lock_taken(rb, r, caplog):
    r.rpush("cogworker:unique:d", "garbage")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert locks.take(rb, K, "cogworker:unique:d", "j1", 60) == (True, None)
    assert r.get("cogworker:unique:d") == "j1"
    assert [k for k in r.keys(K.quarantine_prefix + "*") if "cogworker:unique:d" in k]
    assert "is no lock (the wrong type)" in caplog.text


def test_a_lock_without_an_expiry_is_given_one_but_still_holds(rb, r, caplog):
    r.set("cogworker:orphan_lock:x", "written-by-hand")
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert locks.take(rb, K, "cogworker:orphan_lock:x", "me", 60) == (False, b"written-by-hand")
    assert 0 < r.ttl("cogworker:orphan_lock:x") <= 60
    assert "held no expiry" in caplog.text


def test_only_the_holder_touches_or_releases_a_lock(rb, r):
    r.set("lock", "j1", ex=50)
    assert not locks.touch(rb, "lock", "j2", 500)
    assert not locks.release(rb, "lock", "j2")
    assert r.get("lock") == "j1" and r.ttl("lock") <= 50
    assert locks.touch(rb, "lock", "j1", 500)
    assert 450 < r.ttl("lock") <= 500
    assert locks.release(rb, "lock", "j1")
    assert r.get("lock") is None
    assert not locks.release(rb, "lock", "j1")  # (gone: nothing to release)


def test_hold_queued_and_release_running_act_only_for_the_runs_jid(rb, r):
    r.set(K.periodic_running("e"), "j1", ex=5)
    assert not locks.hold_queued(rb, K, "e", "j2")
    assert locks.hold_queued(rb, K, "e", "j1")
    assert QUEUED_TTL - 10 < r.ttl(K.periodic_running("e"))
    locks.release_running(rb, K, {"jid": "j2", "periodic_pjid": "e"})
    assert r.get(K.periodic_running("e")) == "j1"
    locks.release_running(rb, K, {"jid": "j1"})  # no periodic run: nothing to release
    assert r.get(K.periodic_running("e")) == "j1"
    locks.release_running(rb, K, {"jid": "j1", "periodic_pjid": "e"})
    assert r.get(K.periodic_running("e")) is None


def test_orphan_recovery_retakes_the_running_lock_for_the_whole_queue_wait(rb):
    payload = {"jid": "j1", "periodic_pjid": "e"}
    retake_running(rb, K, payload)  # lapsed: taken again
    assert rb.get(K.periodic_running("e")) == b"j1" and rb.ttl(K.periodic_running("e")) > QUEUED_TTL - 10
    rb.set(K.periodic_running("e"), "j1", ex=100)  # still held by this run: renewed
    retake_running(rb, K, payload)
    assert rb.ttl(K.periodic_running("e")) > QUEUED_TTL - 10
    rb.set(K.periodic_running("e"), "j2", ex=100)  # another run's: left alone
    retake_running(rb, K, payload)
    assert rb.get(K.periodic_running("e")) == b"j2" and rb.ttl(K.periodic_running("e")) <= 100

