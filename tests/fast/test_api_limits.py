"""api.LimitSet / LimitState (features/limits/api.py): what the admin, the CLI and the metrics show of the
limiters, read from a real Redis holding their data as the workers write it (admin_fixtures)."""

from __future__ import annotations

import json

import pytest
from admin_fixtures import KEYS, bucket_count, hold, limiter, recent, redis_time
from helpers import round_trips

from django_cogworker import api
from django_cogworker.features.limits import api as api_limits


@pytest.fixture
def limits(rb):
    return api.LimitSet(redis=rb, keys=KEYS)


def test_a_concurrency_limit_shows_its_live_holders_and_not_the_lapsed(rb, limits):
    limiter(rb, "stripe", "concurrent", 3, lease=60, totals={"granted": 40, "over": 7, "expired": 1})
    hold(rb, "stripe", "jid-a", "host:1:a", since_ago=12, expires_in=48)
    hold(rb, "stripe", "jid-b", "host:2:b", expires_in=30)
    hold(rb, "stripe", "jid-dead", "host:3:c", expires_in=-5)  # its process died: lapsed, not yet removed
    state = limits.get("stripe")
    assert (state.kind, state.size, state.per, state.lease, state.family) == ("concurrent", 3, None, 60, "stripe")
    assert state.in_use == 2 and not state.full and state.percent == pytest.approx(66.7)
    assert [h.jid for h in state.holders] == ["jid-b", "jid-a"]  # the first to lapse first
    a = state.holders[1]
    assert a.process == "host:1:a"
    assert a.since == pytest.approx(redis_time(rb) - 12, abs=2)
    assert a.expires_at == pytest.approx(redis_time(rb) + 48, abs=2)
    assert state.totals == {"granted": 40, "over": 7, "rescheduled": 0, "expired": 1, "failed": 0}


def test_recent_figures_sum_the_last_5_and_60_minutes(rb, limits):
    limiter(rb, "mail", "bucket", 25, 1)
    recent(rb, "mail", 0, over=3, rescheduled=1)
    recent(rb, "mail", 2, over=2)
    recent(rb, "mail", 30, over=10, rescheduled=4)
    recent(rb, "mail", 61, over=100, rescheduled=100)  # an hour ago, its slot not yet written over: not counted
    assert limits.get("mail").recent == api_limits.Recent(over_5m=5, over_60m=15, rescheduled_5m=1,
                                                          rescheduled_60m=5)


def test_in_use_follows_the_kind_in_redis_time(rb, limits):
    now = redis_time(rb)
    limiter(rb, "mail", "bucket", 25, 10)
    bucket_count(rb, "mail", 10, 7)
    limiter(rb, "stale", "bucket", 25, 10)
    bucket_count(rb, "stale", 10, 25, buckets_ago=1)  # the bucket before: full, but over
    limiter(rb, "partner", "window", 100, 60)
    rb.zadd(KEYS.limit("partner").starts, {"t1": now - 90, "t2": now - 30, "t3": now - 1})
    limiter(rb, "sms", "leaky", 10, 1)
    rb.hset(KEYS.limit("sms").state, "tat", repr(now + 0.45))  # 4.5 intervals of 0.1 s ahead: 5 places taken
    limiter(rb, "idle", "leaky", 10, 1)
    rb.hset(KEYS.limit("idle").state, "tat", repr(now - 3))
    got = {s.key: s.in_use for s in limits.page().items}
    assert got["mail"] == 7 and got["stale"] == 0 and got["partner"] == 2 and got["idle"] == 0
    assert got["sms"] in (4, 5)  # (a fraction of a second passes between the write and the read)


def test_a_full_limit_reads_full(rb, limits):
    limiter(rb, "one", "concurrent", 1, lease=30)
    hold(rb, "one", "j", "host:1:a")
    state = limits.get("one")
    assert state.full and state.level == "full" and state.percent == 100.0


def test_the_listing_is_newest_first_paged_with_a_few_holders_each(rb, limits):
    for n in range(30):
        limiter(rb, f"customer:{n}", "concurrent", 1, lease=60, family="customer", used_ago=100 - n)
    for n in range(8):
        hold(rb, "customer:29", f"jid-{n}", "host:1:a")
    first = limits.page(1, 25)
    assert first.total == 30 and [s.key for s in first.items][:2] == ["customer:29", "customer:28"]
    top = first.items[0]
    assert top.in_use == 8 and len(top.holders) == api_limits.LISTED_HOLDERS and top.more_holders == 3
    assert top.family == "customer" and top.last_used == pytest.approx(redis_time(rb) - 71, abs=2)
    assert [s.key for s in limits.page(2, 25).items] == [f"customer:{n}" for n in range(4, -1, -1)]


def test_an_unknown_key_is_none_and_one_without_its_spec_still_reads(rb, limits):
    assert limits.get("nope") is None
    rb.zadd(KEYS.limits, {"orphan": redis_time(rb)})
    rb.hset(KEYS.limit("orphan").stats, "granted", 3)
    hold(rb, "orphan", "j", "host:1:a")
    state = limits.get("orphan")
    assert state.kind == "unknown" and state.size is None and state.totals["granted"] == 3 and state.in_use == 1
    rb.hset(KEYS.limit_specs, "garbled", "{not json")
    assert limits.get("garbled").kind == "unknown"


def test_bad_data_reads_leniently(rb, limits):
    limiter(rb, "x", "concurrent", 2, lease=10)
    rb.zadd(KEYS.limit("x").holders, {"not json": redis_time(rb) + 30})
    rb.set(KEYS.limit("x").stats, "a string where a hash goes")
    state = limits.get("x")
    assert state.holders[0].process == "not json" and state.holders[0].jid is None
    assert state.totals["granted"] == 0


def test_a_page_is_three_round_trips_however_many_keys(rb, limits, monkeypatch):
    for n in range(100):
        limiter(rb, f"k{n}", "window", 5, 1)
    trips = round_trips(monkeypatch)
    assert len(limits.page(1, 100).items) == 100
    assert trips["n"] == 3


def test_families_sum_their_keys_and_size_only_a_static_name(rb, limits):
    limiter(rb, "stripe", "concurrent", 3, lease=60, totals={"granted": 10, "over": 2})
    hold(rb, "stripe", "j1", "host:1:a")
    for n in range(3):
        limiter(rb, f"customer:{n}", "concurrent", 1, lease=60, family="customer",
                totals={"granted": 5, "rescheduled": n, "expired": 1})
        hold(rb, f"customer:{n}", f"c{n}", "host:1:a")
    got = {f.family: f for f in limits.families()}
    assert set(got) == {"stripe", "customer"}
    assert (got["stripe"].keys, got["stripe"].in_use, got["stripe"].size) == (1, 1, 3)
    assert got["stripe"].totals == {"granted": 10, "over": 2, "rescheduled": 0, "expired": 0, "failed": 0}
    customer = got["customer"]
    assert (customer.keys, customer.in_use, customer.size) == (3, 3, None)
    assert customer.totals["granted"] == 15 and customer.totals["rescheduled"] == 3 and customer.totals["expired"] == 3


def test_a_spec_is_what_the_workers_store(rb, limits):
    # The spec's JSON as the core writes it (json.dumps of kind, size, per, lease, family).
    rb.zadd(KEYS.limits, {"m": redis_time(rb)})
    rb.hset(KEYS.limit_specs, "m", json.dumps({"kind": "bucket", "size": 25, "per": 1.0, "lease": None,
                                               "family": "m"}))
    state = limits.get("m")
    assert (state.kind, state.size, state.per, state.lease) == ("bucket", 25, 1.0, None)
