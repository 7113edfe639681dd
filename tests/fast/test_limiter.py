"""features/limits/limiter.py: limiter definitions, their keys, and ``within`` against the real scripts on a real Redis.

The rate kinds are measured with Redis's own clock (what the scripts use): a take's time is read
from the sorted set or hash the script wrote, so the expected ``retry_after`` is computed, not
guessed, and a slow machine can't flake it. Periods are short (0.2 to 1 s).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time

import pytest
from helpers import refuse, serve_again
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture
from peek import redis_now

from django_cogworker import CogworkerError, Limiter
from django_cogworker.broker.keys import Keys
from django_cogworker.errors import LimitKeyError, OverLimit
from django_cogworker.features.limits import scripts as limit_scripts
from django_cogworker.features.limits.limiter import HELD, KEY_MAX, SEEN, defined, holder_token

K = Keys()


def stats(r, key: str) -> dict[str, int]:
    """The counters of a limiter key (the ring of recent minutes and the hold average left out)."""
    return {k: int(v) for k, v in r.hgetall(K.limit(key).stats).items()
            if k != "hold" and not re.fullmatch(r"[orm]\d+", k)}


def take(limiter: Limiter, rb, token: str | None = None) -> tuple[bool, float | None]:
    """One LIMIT_TAKE of ``limiter`` (as within() makes it): (granted, retry_after)."""
    reply = limit_scripts.LIMIT_TAKE(rb, list(K.limit(limiter.name)), [token or holder_token(None), "", "",
                                                                    *limiter.argv()])
    if int(reply[0]) == 1:
        return True, None
    return False, float(reply[2]) if reply[2] else None


# -- definitions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -1, True, 2.0, "3", None])
def test_a_size_that_is_not_a_whole_number_above_0_is_refused(size):
    with pytest.raises(CogworkerError, match=r"size must be a whole number above 0, got " + repr(size)):
        Limiter.concurrent(unique("size"), size)


@pytest.mark.parametrize("per", [0, -1, True, float("nan"), float("inf"), "1"])
def test_a_period_that_is_not_a_positive_number_of_seconds_is_refused(per):
    for make in (Limiter.bucket, Limiter.window, Limiter.leaky):
        with pytest.raises(CogworkerError, match=r": per must be a positive number of seconds, got "):
            make(unique("per"), 5, per)


@pytest.mark.parametrize("lease", [0, -5, False, float("inf")])
def test_a_lease_that_is_not_a_positive_number_of_seconds_is_refused(lease):
    name = unique("lease")
    with pytest.raises(CogworkerError, match=rf"concurrent limiter '{name}': lease must be a positive number of "
                                             rf"seconds, got {lease!r}"):
        Limiter.concurrent(name, 1, lease=lease)


def test_an_unknown_kind_is_refused_naming_the_kinds():
    with pytest.raises(CogworkerError, match=r"kind is one of concurrent, bucket, window, leaky, got 'burst'"):
        Limiter("burst", unique("kind"), 1)


def test_a_concurrency_limit_has_no_period_and_a_rate_limit_no_lease():
    with pytest.raises(CogworkerError, match=r"a concurrency limit has no period \(per\); did you mean bucket\?"):
        Limiter("concurrent", unique("per"), 1, per=1.0)
    with pytest.raises(CogworkerError, match=r"only a concurrency limit has a lease"):
        Limiter("bucket", unique("lease"), 1, per=1.0, lease=10.0)


@pytest.mark.parametrize("name", ["", "a{b}", "has}brace", "x" * (KEY_MAX + 1), "line\nbreak", 5, None])
def test_a_name_that_can_not_name_redis_keys_is_refused(name):
    with pytest.raises(CogworkerError, match=r"a limiter's name must be"):
        Limiter.concurrent(name, 1)


def test_a_name_of_key_max_characters_is_fine():
    name = unique("long")
    name += "x" * (KEY_MAX - len(name))
    assert Limiter.bucket(name, 1).name == name


def test_one_name_defined_twice_differently_is_refused_naming_both():
    name = unique("twice")
    Limiter.concurrent(name, 2, lease=30)
    with pytest.raises(CogworkerError) as info:
        Limiter.concurrent(name, 3, lease=30)
    message = str(info.value)
    assert f"Limiter.concurrent('{name}', 2, lease=30)" in message
    assert f"Limiter.concurrent('{name}', 3, lease=30)" in message
    with pytest.raises(CogworkerError, match="defined twice"):
        Limiter.bucket(name, 2, per=1)  # (same size, another kind)


def test_the_same_spec_twice_is_one_limiter_and_fine():
    name = unique("same")
    first = Limiter.window(name, 4, per=2)
    second = Limiter.window(name, 4, per=2.0)  # (an int or a float period: the same)
    assert first.spec() == second.spec()
    assert [limiter for limiter in defined() if limiter.family == name] == [first]


def test_a_refused_definition_leaves_nothing_registered():
    name = unique("refused")
    with pytest.raises(CogworkerError):
        Limiter.concurrent(name, 0)
    assert Limiter.concurrent(name, 5).size == 5  # (not "defined twice")


def test_the_family_of_a_key_function_is_where_it_is_defined_unless_named():
    def by_customer(customer, *_):
        return f"cust:{customer}"

    assert Limiter.concurrent(by_customer, 1).family == f"{__name__}.{by_customer.__qualname__}"
    named = unique("family")
    assert Limiter.concurrent(lambda c: f"x:{c}", 1, family=named).family == named
    with pytest.raises(CogworkerError, match=r"family must be a non-empty string"):
        Limiter.concurrent(by_customer, 1, family="")


def test_repr_and_describe_say_kind_size_and_period_or_lease():
    name = unique("repr")
    assert repr(Limiter.leaky(name, 10, per=0.5)) == f"Limiter.leaky('{name}', 10, per=0.5)"
    described = json.loads(Limiter.concurrent(name + "c", 3, lease=12).describe())
    assert described == {"kind": "concurrent", "size": 3, "per": None, "lease": 12.0, "family": name + "c"}


# -- keys ----------------------------------------------------------------------------------------


def test_a_static_name_is_the_key_whatever_the_arguments():
    name = unique("static")
    limiter = Limiter.bucket(name, 5)
    assert limiter.key_for() == name
    assert limiter.key_for([1, 2], {"x": 3}) == name


def test_a_key_function_gets_the_job_s_args_and_kwargs():
    limiter = Limiter.concurrent(lambda customer, *rest, region="eu": f"cust:{customer}:{region}", 1,
                                 family=unique("fn"))
    assert limiter.key_for([7, "x"], {}) == "cust:7:eu"
    assert limiter.key_for([7], {"region": "us"}) == "cust:7:us"
    assert limiter.key_for((8,), None) == "cust:8:eu"


def test_a_key_function_that_raises_gives_limit_key_error_naming_the_family_and_the_error():
    family = unique("raises")
    limiter = Limiter.concurrent(lambda customer: f"cust:{customer['id']}", 1, family=family)
    with pytest.raises(LimitKeyError, match=rf"the key function of limiter '{family}' raised TypeError: ") as info:
        limiter.key_for([5], {})
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(LimitKeyError, match=r"raised TypeError"):
        limiter.key_for([], {})  # (arguments the function can't take)


@pytest.mark.parametrize("returned", [5, None, "", b"bytes", "a{b}", "x" * (KEY_MAX + 1)])
def test_a_key_function_returning_what_can_not_name_keys_gives_limit_key_error(returned):
    family = unique("returns")
    limiter = Limiter.concurrent(lambda *_: returned, 1, family=family)
    with pytest.raises(LimitKeyError, match=rf"the key function of limiter '{family}' must be"):
        limiter.key_for([1], {})


def test_bind_gives_the_limiter_at_one_key_without_defining_another(rb):
    family = unique("bind")
    limiter = Limiter.concurrent(lambda customer: f"{family}:{customer}", 1, lease=5, family=family)
    before = defined()
    bound = limiter.bind(7)
    assert (bound.name, bound.key_fn, bound.family, bound.spec()) == (f"{family}:7", None, family, limiter.spec())
    assert limiter.key_fn is not None and limiter.name is None  # (the definition is left as it was)
    assert defined() == before
    with bound.within(redis=rb, keys=K):
        assert rb.zcard(K.limit(f"{family}:7").holders) == 1
    with pytest.raises(LimitKeyError):
        limiter.bind()  # (the key function needs its argument)


def test_within_a_limiter_keyed_by_a_function_says_to_bind_it(rb):
    limiter = Limiter.concurrent(lambda c: f"c:{c}", 1, family=unique("unbound"))
    with pytest.raises(TypeError, match=r"keyed by a function: use .*\.bind\(\*args\)\.within"):
        with limiter.within(redis=rb, keys=K):
            pass


@pytest.mark.parametrize("wait", [-1, True, float("nan"), float("inf"), "1", None])
def test_within_refuses_a_wait_that_is_not_seconds(rb, wait):
    limiter = Limiter.concurrent(unique("wait"), 1)
    with pytest.raises(TypeError, match=r"within\(wait=...\) takes seconds, 0 or more, got"):
        with limiter.within(wait, redis=rb, keys=K):
            pass
    assert rb.exists(*K.limit(limiter.name)) == 0  # (nothing taken)


@pytest.mark.parametrize("per", [1e300, 10**400, 1e9 + 1])
def test_a_period_past_the_bound_is_refused_at_the_definition(rb, per):
    # (1e300 was taken: every take then failed in its script and left the limiter's state without an
    # expiry; 10**400 raised OverflowError.)
    for make in (Limiter.bucket, Limiter.window, Limiter.leaky):
        with pytest.raises(CogworkerError, match=r": per must be at most 1e9 seconds \(about 31 years\), got "):
            make(unique("far"), 5, per)
    assert rb.dbsize() == 0
    limiter = Limiter.bucket(unique("bound"), 1, per=1e9)  # (the bound itself: taken, and its state expires)
    with limiter.within(redis=rb, keys=K):
        pass
    assert 0 < rb.pttl(K.limit(limiter.name).state) <= 2e12 + 1000


def test_a_lease_size_or_wait_past_the_bound_is_refused(rb):
    with pytest.raises(CogworkerError, match=r": lease must be at most 1e9 seconds \(about 31 years\), got 1e\+300"):
        Limiter.concurrent(unique("lease"), 1, lease=1e300)
    with pytest.raises(CogworkerError, match=r": size must be at most 1,000,000,000, got 10000000000"):
        Limiter.concurrent(unique("size"), 10**10)
    limiter = Limiter.concurrent(unique("wait"), 1)
    with pytest.raises(CogworkerError, match=r"within\(wait=...\) takes at most 1e9 seconds"):  # (OverflowError)
        with limiter.within(10**400, redis=rb, keys=K):
            pass
    assert rb.dbsize() == 0


@pytest.mark.parametrize("family", ["a{b}", "open{", "line\nbreak", "x" * (KEY_MAX + 1), "\ud800"])
def test_a_family_that_can_not_name_keys_is_refused(rb, family):
    # (Taken before: a brace moves a key's cluster slot, a newline breaks a log line and the metrics.)
    with pytest.raises(CogworkerError, match=r"family must be at most 200 printable characters without braces"):
        Limiter.concurrent(lambda c: f"c:{c}", 1, family=family)
    with pytest.raises(CogworkerError, match=r"family must be"):
        Limiter.bucket(unique("fam"), 1, family=family)
    assert rb.dbsize() == 0


# -- within(): concurrency -------------------------------------------------------------------------


def test_a_concurrency_limit_of_2_refuses_a_third_until_a_block_ends(rb, r):
    limiter = Limiter.concurrent(unique("conc"), 2, lease=30)
    holders = K.limit(limiter.name).holders
    with limiter.within(redis=rb, keys=K):
        with limiter.within(redis=rb, keys=K):
            assert r.zcard(holders) == 2
            with pytest.raises(OverLimit) as info:
                with limiter.within(wait=0, redis=rb, keys=K):
                    pytest.fail("a third holder ran")
            assert (info.value.key, info.value.kind, info.value.retry_after) == (limiter.name, "concurrent", None)
            assert f"over the limit of concurrent limiter '{limiter.name}'" in str(info.value)
        assert r.zcard(holders) == 1  # the inner block gave its place back
        with limiter.within(wait=0, redis=rb, keys=K):
            assert r.zcard(holders) == 2
    assert r.zcard(holders) == 0
    assert stats(r, limiter.name) == {"granted": 3, "over": 1}


def test_a_place_is_given_back_when_the_block_raises(rb, r):
    limiter = Limiter.concurrent(unique("raises"), 1, lease=30)
    with pytest.raises(RuntimeError):
        with limiter.within(redis=rb, keys=K):
            raise RuntimeError("the block failed")
    assert r.zcard(K.limit(limiter.name).holders) == 0
    with limiter.within(redis=rb, keys=K):
        pass


def test_a_place_that_can_t_be_given_back_fails_nothing_and_is_logged(rb, r, caplog):
    limiter = Limiter.concurrent(unique("unreturned"), 1, lease=30)
    done = []
    try:
        with limiter.within(redis=rb, keys=K):
            refuse(rb, "noreplicas")  # (Redis refuses the release's writes)
            done.append("work")
    finally:
        serve_again(rb)
    assert done == ["work"]  # (the block's work stands: raised, a job would run it again)
    assert "its place was not given back" in caplog.text and limiter.name not in HELD.by_key()


@pytest.mark.parametrize("when", ["take", "release"])
def test_within_moves_a_limiter_key_of_the_wrong_type_aside_and_holds_its_place(rb, r, caplog, when):
    limiter = Limiter.concurrent(unique("poisoned"), 1, lease=30)
    holders = K.limit(limiter.name).holders
    if when == "take":
        r.set(holders, "not a sorted set")
    with caplog.at_level(logging.WARNING):
        with limiter.within(redis=rb, keys=K):
            assert r.zcard(holders) == 1
            if when == "release":
                r.set(holders, "not a sorted set")
    assert r.type(holders) == "none"  # (moved aside, and the place given back)
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{holders}:*"))) == 1
    assert [rec.name for rec in caplog.records] == ["django_cogworker.broker.quarantine"]


def test_a_holder_s_token_names_its_process_and_lease_ends_lease_seconds_on(rb, r):
    limiter = Limiter.concurrent(unique("token"), 1, lease=30)
    with limiter.within(redis=rb, keys=K):
        before = redis_now(rb)
        ((token, until),) = r.zrange(K.limit(limiter.name).holders, 0, -1, withscores=True)
        held = HELD.by_key()[limiter.name]
    holder = json.loads(token)
    assert set(holder) == {"jid", "process", "since", "run"} and holder["jid"] is None
    assert before + 30 - 1 < until <= before + 30
    assert held == (30.0, [token])  # (what the heartbeat renews)
    assert limiter.name not in HELD.by_key()  # (and no more, once the block ended)


def test_within_waits_for_a_place_another_thread_frees(rb):
    limiter = Limiter.concurrent(unique("waits"), 1, lease=30)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with limiter.within(redis=rb, keys=K):
            holding.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert holding.wait(5)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        with limiter.within(wait=5, redis=rb, keys=K):
            waited = time.monotonic() - started
    finally:
        release.set()
        other.join(10)
    assert 0.25 < waited < 2.5  # (it waited for the place, and took it soon after it freed)


def test_within_waits_at_most_wait_then_raises_over_limit(rb):
    limiter = Limiter.concurrent(unique("gives-up"), 1, lease=30)
    with limiter.within(redis=rb, keys=K):
        started = time.monotonic()
        with pytest.raises(OverLimit):
            with limiter.within(wait=0.3, redis=rb, keys=K):
                pytest.fail("ran over the limit")
        waited = time.monotonic() - started
    assert 0.29 < waited < 1.5


def test_within_polls_a_concurrency_limit_however_long_places_were_held_lately(rb, r):
    """The hold average (``hold`` in stats) is a rescheduled job's backoff, not a waiter's pause:
    a place freed 0.2 s into a wait is taken then, not after ``hold`` seconds (or at the deadline)."""
    limiter = Limiter.concurrent(unique("hold"), 1, lease=30)
    keys, argv = list(K.limit(limiter.name)), limiter.argv()
    # A holder that held its place 20 s, as the scripts see it (its token's ``since``).
    old = json.dumps({"jid": "j1", "process": "h:1", "since": time.time() - 20, "run": "r1"})
    assert int(limit_scripts.LIMIT_TAKE(rb, keys, [old, "", "", *argv])[0]) == 1
    assert limit_scripts.LIMIT_RELEASE(rb, keys, [old, "release", *argv])[0] == 1
    assert 19 < float(r.hget(K.limit(limiter.name).stats, "hold")) < 21
    holding = threading.Event()

    def hold_briefly():
        with limiter.within(redis=rb, keys=K):
            holding.set()
            time.sleep(0.2)

    other = threading.Thread(target=hold_briefly)
    other.start()
    try:
        assert holding.wait(5)
        started = time.monotonic()
        with limiter.within(wait=5, redis=rb, keys=K):
            waited = time.monotonic() - started
    finally:
        other.join(10)
    assert waited < 2.0


def test_a_lapsed_lease_frees_its_place_and_is_counted_expired(rb, r):
    limiter = Limiter.concurrent(unique("lapse"), 1, lease=0.3)
    gone = holder_token("dead-jid")  # a holder whose process died: it never renews nor gives back
    assert take(limiter, rb, gone) == (True, None)
    with pytest.raises(OverLimit):
        with limiter.within(wait=0, redis=rb, keys=K):
            pass
    time.sleep(0.35)
    with limiter.within(wait=0, redis=rb, keys=K):
        (token,) = r.zrange(K.limit(limiter.name).holders, 0, -1)
        assert json.loads(token)["jid"] is None  # (the new holder, not the dead one)
    assert stats(r, limiter.name) == {"granted": 2, "over": 1, "expired": 1}


def test_the_stats_hash_counts_granted_and_over_and_the_minute_s_refusals(rb, r):
    limiter = Limiter.concurrent(unique("stats"), 1, lease=30)
    with limiter.within(redis=rb, keys=K):
        for _ in range(3):
            with pytest.raises(OverLimit):
                with limiter.within(wait=0, redis=rb, keys=K):
                    pass
    with limiter.within(redis=rb, keys=K):
        pass
    counts = r.hgetall(K.limit(limiter.name).stats)
    assert (counts["granted"], counts["over"]) == ("2", "3")
    assert "rescheduled" not in counts and "failed" not in counts  # (a within() that waits: neither)
    minute = math.floor(redis_now(rb) / 60)
    slot = minute % 60
    if counts[f"m{slot}"] == str(minute):  # (not if the minute turned since the refusals)
        assert counts[f"o{slot}"] == "3" and counts[f"r{slot}"] == "0"


def test_within_marks_the_key_seen_for_the_heartbeat_s_index(rb):
    limiter = Limiter.bucket(unique("seen"), 5, per=1)
    SEEN.take()
    with limiter.within(redis=rb, keys=K):
        pass
    assert SEEN.take() == {limiter.name: limiter.describe()}


# -- within(): rates ---------------------------------------------------------------------------------


def _after_a_period_starts(rb, per: float) -> None:
    """Sleep until just after the next clock-aligned period of ``per`` seconds starts (Redis's clock)."""
    now = redis_now(rb)
    time.sleep((math.floor(now / per) + 1) * per - now + 0.01)


def test_a_bucket_gives_size_starts_per_clock_aligned_period(rb, r):
    per = 1.0
    limiter = Limiter.bucket(unique("bucket"), 3, per=per)
    for _period in range(2):
        _after_a_period_starts(rb, per)
        started = redis_now(rb)
        assert [take(limiter, rb)[0] for _ in range(3)] == [True] * 3
        before = redis_now(rb)
        granted, after = take(limiter, rb)
        later = redis_now(rb)
        # (The test's premise, not skipped when it fails: four round trips well inside one period.)
        assert later - started < per / 2, f"four takes took {later - started:.3f}s of a {per}s period"
        assert not granted
        # Refused until the next period starts: a multiple of per on Redis's clock.
        end = (math.floor(started / per) + 1) * per
        assert end - later - 1e-3 <= after <= end - before + 1e-3
        with pytest.raises(OverLimit) as info:
            with limiter.within(wait=0, redis=rb, keys=K):
                pass
        assert info.value.kind == "bucket" and 0 < info.value.retry_after <= per
    # Each period's 3 starts and 2 refusals.
    assert stats(r, limiter.name) == {"granted": 6, "over": 4}


def test_a_bucket_waiter_gets_in_when_the_next_period_starts(rb):
    per = 1.0
    limiter = Limiter.bucket(unique("bucket-wait"), 2, per=per)
    _after_a_period_starts(rb, per)
    start = redis_now(rb)
    assert take(limiter, rb)[0] and take(limiter, rb)[0]
    full = redis_now(rb)
    assert math.floor(start / per) == math.floor(full / per)  # (the premise: both places taken in one period)
    with limiter.within(wait=2 * per, redis=rb, keys=K):
        entered = redis_now(rb)
    # In the next period, not this one (the limit) and not the one after (the waiter woke when a
    # place came): a period-long window, where 0.15 s once failed a loaded vCPU's wake-up.
    assert math.floor(entered / per) == math.floor(full / per) + 1


def test_a_window_slides_one_start_at_a_time(rb, r):
    per = 2.0
    limiter = Limiter.window(unique("window"), 2, per=per)
    starts = K.limit(limiter.name).starts
    assert take(limiter, rb)[0]
    time.sleep(0.8)  # (the second start 0.8 s after the first: each check below has that long to run)
    assert take(limiter, rb)[0]
    (first, second) = [score for _m, score in r.zrange(starts, 0, -1, withscores=True)]
    before = redis_now(rb)
    granted, after = take(limiter, rb)
    later = redis_now(rb)
    assert later < first + per, f"the third take came {later - first:.3f}s after the first, past the window"
    assert not granted
    assert first + per - later - 1e-3 <= after <= first + per - before + 1e-3  # when the first start slides out
    time.sleep(after + 0.02)
    # The first start slid out, the second is still in the window: one place, not two.
    granted, _ = take(limiter, rb)
    before = redis_now(rb)
    refused, after = take(limiter, rb)
    later = redis_now(rb)
    assert later < second + per, f"the last take came {later - second:.3f}s after the second, past the window"
    assert granted and not refused
    assert second + per - later - 1e-3 <= after <= second + per - before + 1e-3
    assert stats(r, limiter.name) == {"granted": 3, "over": 2}


def test_a_leaky_bucket_allows_a_burst_of_size_then_one_each_per_over_size(rb, r):
    per, size = 1.5, 3
    spacing = per / size
    limiter = Limiter.leaky(unique("leaky"), size, per=per)
    state = K.limit(limiter.name).state
    started = redis_now(rb)
    assert [take(limiter, rb)[0] for _ in range(size)] == [True] * size
    before = redis_now(rb)
    granted, after = take(limiter, rb)
    later = redis_now(rb)
    assert later - started < spacing / 2, f"four takes took {later - started:.3f}s of a {spacing}s spacing"
    assert not granted
    tat = float(r.hget(state, "tat"))  # the theoretical arrival time: size spacings after the burst
    assert started + per - 1e-3 <= tat <= before + per + 1e-3
    # Refused until the next one drips out: one spacing past a full bucket.
    assert tat + spacing - per - later - 1e-3 <= after <= tat + spacing - per - before + 1e-3
    assert 0 < after <= spacing + 1e-3
    # Then one each spacing: a waiter gets in when the next drips out, and the one after is refused.
    entered_at = []
    for _ in range(3):
        with limiter.within(wait=2, redis=rb, keys=K):
            entered_at.append(time.monotonic())
    gaps = [b - a for a, b in zip(entered_at, entered_at[1:], strict=False)]
    # Never sooner than a spacing (the limit), and at the next drip, not the one after (a waiter
    # woke when a place came): within a spacing of it, however slow the machine's wake-ups.
    assert all(spacing - 0.05 < gap < 2 * spacing for gap in gaps), gaps
    granted, after = take(limiter, rb)
    assert not granted and 0 < after <= spacing + 1e-3


def test_a_window_limit_checks_no_holder_and_keeps_no_lease(rb, r):
    limiter = Limiter.window(unique("no-hold"), 1, per=0.5)
    with limiter.within(redis=rb, keys=K):
        assert limiter.name not in HELD.by_key()
    assert r.exists(K.limit(limiter.name).holders) == 0
    assert 0 < r.pttl(K.limit(limiter.name).starts) <= 1500  # (gone a second after its window)


# (Python 3.12+ warns at a fork of a process with threads, as pytest-xdist's workers are: the child
# here only writes to a pipe and exits, with no lock another thread might hold.)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_holder_tokens_are_unique_per_run_in_a_process_and_its_forked_children_and_read_as_json():
    # (Written as a fixed format, not json.dumps: the admin's holders list and LIMIT_RELEASE's
    # ``hold`` average read them as JSON. A forked child counted on from its parent's count, with its
    # parent's prefix, would have made its parent's next tokens: two holders, one place.)
    import os

    tokens = [holder_token(jid) for jid in ("a", 'quote"and\\slash', None, "a")]
    read = [json.loads(token) for token in tokens]
    assert [holder["jid"] for holder in read] == ["a", 'quote"and\\slash', None, "a"]
    assert all(set(holder) == {"jid", "process", "since", "run"} for holder in read)
    assert all(abs(holder["since"] - time.time()) < 60 for holder in read)
    assert len({holder["run"] for holder in read}) == 4
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - (the child's side, reported through the pipe)
        os.write(writer, "\n".join(holder_token("a") for _ in range(3)).encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as pipe:
        theirs = [json.loads(line)["run"] for line in pipe.read().splitlines()]
    ours = [json.loads(holder_token("a"))["run"] for _ in range(3)]
    assert len(theirs) == 3 and not set(theirs) & ({holder["run"] for holder in read} | set(ours))
