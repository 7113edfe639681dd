"""features/limits/upkeep.py: what a heartbeat does for limiters (lease renewal, the ``limits`` index), and
what ``manage.py check`` says of them (``problems``)."""

from __future__ import annotations

import json
import logging
import time

import pytest
from helpers import refuse, serve_again
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture
from peek import redis_now

from django_cogworker import Limiter
from django_cogworker.broker.keys import Keys
from django_cogworker.errors import OverLimit
from django_cogworker.features.limits.limiter import SEEN
from django_cogworker.features.limits.upkeep import beat, problems

K = Keys()


@pytest.fixture(autouse=True)
def nothing_seen():
    """What other tests used is not this test's to index."""
    SEEN.take()
    yield
    SEEN.take()


def test_a_beat_renews_the_lease_of_a_place_held_here(rb, r):
    limiter = Limiter.concurrent(unique("renew"), 1, lease=2)
    holders = K.limit(limiter.name).holders
    with limiter.within(redis=rb, keys=K):
        ((token, first),) = r.zrange(holders, 0, -1, withscores=True)
        time.sleep(0.2)
        before = redis_now(rb)
        beat(rb, K)
        after = redis_now(rb)
        ((renewed_token, renewed),) = r.zrange(holders, 0, -1, withscores=True)
    assert renewed_token == token
    assert renewed >= first + 0.15  # the lease moved on ...
    assert before + 2 <= renewed <= after + 2  # ... to ``lease`` seconds after the beat


def test_a_place_held_past_its_lease_thanks_to_beats_is_not_taken_by_another(rb):
    limiter = Limiter.concurrent(unique("kept"), 1, lease=0.4)
    with limiter.within(redis=rb, keys=K):
        for _ in range(4):  # 0.6 s: longer than the lease, renewed every 0.15 s
            time.sleep(0.15)
            beat(rb, K)
        with pytest.raises(OverLimit):
            with limiter.within(wait=0, redis=rb, keys=K):
                pass


def test_a_lease_that_lapsed_before_the_beat_is_not_brought_back_and_is_logged(rb, r, caplog):
    limiter = Limiter.concurrent(unique("lapsed"), 1, lease=0.3)
    holders = K.limit(limiter.name).holders
    with limiter.within(redis=rb, keys=K):
        time.sleep(0.35)  # (a beat that came too late)
        with limiter.within(wait=0, redis=rb, keys=K):  # another took the lapsed place
            (theirs,) = r.zrange(holders, 0, -1)
            with caplog.at_level(logging.WARNING, logger="django_cogworker.features.limits.upkeep"):
                beat(rb, K)
            assert r.zrange(holders, 0, -1) == [theirs]  # (XX: ours not added back beside theirs)
    assert f"limiter {limiter.name!r}: 1 lease(s) of this process lapsed" in caplog.text


def test_a_beat_indexes_the_keys_used_since_the_last_with_their_specs(rb, r):
    bucket = Limiter.bucket(unique("index"), 5, per=1)
    family = unique("family")
    per_customer = Limiter.concurrent(lambda c: f"{family}:{c}", 1, lease=30, family=family)
    with bucket.within(redis=rb, keys=K):
        pass
    with per_customer.bind(7).within(redis=rb, keys=K):
        before = time.time()
        beat(rb, K)
    used = r.zrange(K.limits, 0, -1, withscores=True)
    assert sorted(key for key, _ in used) == sorted([bucket.name, f"{family}:7"])
    assert all(before - 1 <= when <= time.time() + 1 for _, when in used)
    assert json.loads(r.hget(K.limit_specs, bucket.name)) == {"kind": "bucket", "size": 5, "per": 1.0,
                                                              "lease": None, "family": bucket.name}
    assert json.loads(r.hget(K.limit_specs, f"{family}:7"))["family"] == family
    r.delete(K.limits, K.limit_specs)
    beat(rb, K)  # nothing used since: nothing written
    assert r.exists(K.limits, K.limit_specs) == 0


def test_a_beat_with_nothing_held_or_used_writes_nothing(rb, r):
    beat(rb, K)
    assert r.dbsize() == 0


def test_keys_a_failed_beat_could_not_index_are_indexed_by_a_later_one(rb, r):
    limiter = Limiter.window(unique("retry-index"), 5, per=1)
    with limiter.within(redis=rb, keys=K):
        pass
    refuse(rb, "noreplicas")
    try:
        with pytest.raises(Exception, match="NOREPLICAS"):
            beat(rb, K)
    finally:
        serve_again(rb)
    beat(rb, K)
    assert r.zrange(K.limits, 0, -1) == [limiter.name]


@pytest.mark.parametrize("key", ["holders", "limits", "limit_specs"])
def test_a_key_of_the_wrong_type_is_moved_aside_by_the_beat_that_meets_it_and_the_beat_goes_through(
        rb, r, caplog, key):
    # (A holders of the wrong type failed every beat of the process holding a place there, for
    # ever, an ERROR each time: no key guard round knows the keys of each limiter.)
    limiter = Limiter.concurrent(unique("poisoned"), 2, lease=5)
    lk = K.limit(limiter.name)
    poisoned = {"holders": lk.holders, "limits": K.limits, "limit_specs": K.limit_specs}[key]
    with limiter.within(redis=rb, keys=K):
        r.set(poisoned, "not mine")
        with caplog.at_level(logging.WARNING):
            beat(rb, K)
        assert [rec.name for rec in caplog.records] == ["django_cogworker.broker.quarantine"]
        assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{poisoned}:*"))) == 1
        assert r.zrange(K.limits, 0, -1) == [limiter.name] and r.hexists(K.limit_specs, limiter.name)
        assert r.zcard(lk.holders) == 1  # (the place held here, held again: it runs)
    if key == "holders":
        assert r.hget(lk.stats, "lost:holders") is not None


def test_problems_names_a_lease_shorter_than_twice_the_heartbeat():
    short = Limiter.concurrent(unique("short"), 1, lease=9)
    enough = Limiter.concurrent(unique("enough"), 1, lease=10)
    found = problems(5.0)
    (message,) = [m for m in found if short.name in m]
    assert message.startswith(f"{short!r}: its lease (9s) must be at least twice "
                              f'COGWORKER["HEARTBEAT_INTERVAL"] (5s)')
    assert not [m for m in found if enough.name in m]
    assert not [m for m in problems(4.5) if short.name in m]


def test_problems_leave_rate_limiters_alone():
    rate = Limiter.bucket(unique("rate"), 1, per=0.1)
    assert not [m for m in problems(3600.0) if rate.name in m]
