"""The retry policy (engine/settle/retry.py): backoff, failure fields, retry limits, dead, death handlers."""

from __future__ import annotations

import logging
import random

import pytest
from engine_fixtures import make_config

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.settle.retry import RetryPolicy, default_delay
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import Job

NOW = 1_700_000_000.0
K = Keys()


class Flaky(Job):
    pass


class ChoosesItsDelay(Job):
    def retry_in(self, count, exc):
        return None if isinstance(exc, KeyError) else 100 * (count + 1)


class BrokenRetryIn(Job):
    def retry_in(self, count, exc):
        raise ZeroDivisionError("retry_in is broken")


class WeirdError(Exception):
    pass


class BadStr(Exception):
    def __str__(self):
        raise ValueError("no str for you")


@pytest.fixture
def config(redis_url):
    return make_config(redis_url, MAX_RETRIES=4, DEAD_MAX_JOBS=3, DEAD_TIMEOUT=1000)


def policy(config, seed=5, handlers=()):
    return RetryPolicy(config, handlers, rng=random.Random(seed), clock=lambda: NOW)


def new_payload(**extra):
    return {"jid": "j1", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default", "retry": True, **extra}


def raised(exc):
    """``exc`` with a traceback, as a job's exception has one."""
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize("count", [0, 1, 2, 5, 10, 24])
def test_backoff_is_count_to_the_fourth_plus_15_plus_a_random_spread(count):
    delays = [default_delay(count, random.Random(seed)) for seed in range(200)]

    assert delays == [count ** 4 + 15 + random.Random(seed).randrange(10 * (count + 1)) for seed in range(200)]
    assert min(delays) >= count ** 4 + 15
    assert max(delays) < count ** 4 + 15 + 10 * (count + 1)
    assert len(set(delays)) > 5  # spread, so jobs failing together don't come back together


def test_first_failure_records_the_error_and_schedules_a_retry(config):
    payload = new_payload()
    exc = raised(RuntimeError("disk full"))

    filing = policy(config, seed=9).filing(payload, exc)

    assert filing.target == "retry"
    assert filing.score == NOW + default_delay(0, random.Random(9))
    assert filing.payload is payload
    assert payload["retry_count"] == 0
    assert payload["failed_at"] == NOW
    assert "retried_at" not in payload
    assert payload["error_class"] == "RuntimeError"
    assert payload["error_message"] == "disk full"
    assert payloads.decode(filing.raw()) == payload


def test_the_poller_is_told_each_retry_s_due_time_and_a_hint_that_raises_is_logged_without_failing_the_filing(
        config, caplog):
    told: list[float] = []
    retry = policy(config, seed=9)
    retry.on_retry = told.append  # (the Launcher's: its poller's ``expect``)

    filing = retry.filing(new_payload(), raised(RuntimeError("disk full")))

    assert told == [filing.score]

    def gone(due):
        raise RuntimeError("the poller is gone")

    retry.on_retry = gone
    with caplog.at_level(logging.ERROR):
        filing = retry.filing(new_payload(jid="j2"), raised(RuntimeError("disk full")))
    assert filing.target == "retry" and filing.payload["retry_count"] == 0
    assert "on_retry hook failed for jid=j2" in caplog.text


def test_a_later_failure_counts_up_and_stamps_retried_at(config):
    payload = new_payload(retry_count=1, failed_at=NOW - 500, error_class="RuntimeError")

    filing = policy(config, seed=2).filing(payload, raised(WeirdError("again")))

    assert payload["retry_count"] == 2
    assert payload["failed_at"] == NOW - 500  # the first failure's time is kept
    assert payload["retried_at"] == NOW
    assert payload["error_class"] == "test_retry.WeirdError"
    assert filing.score == NOW + default_delay(2, random.Random(2))


def test_an_exception_whose_str_raises_is_still_recorded(config):
    payload = new_payload()

    filing = policy(config).filing(payload, raised(BadStr()))

    assert filing.target == "retry"
    assert payload["error_class"] == "test_retry.BadStr"
    assert payload["error_message"] == "#<BadStr>"


def test_a_long_error_message_is_truncated(config):
    payload = new_payload()
    policy(config).filing(payload, raised(RuntimeError("x" * 50_000)))
    assert payload["error_message"] == "x" * payloads.ERROR_MESSAGE_LIMIT


def retries_before_dead(config, payload):
    """Fail ``payload`` until it is not retried; return how many retries it got and the last filing."""
    p = policy(config)
    for attempt in range(100):
        filing = p.filing(payload, raised(RuntimeError("again")))
        if filing is None or filing.target != "retry":
            return attempt, filing
    raise AssertionError("retried forever")


@pytest.mark.parametrize(("value", "expected"), [
    (True, 4),        # MAX_RETRIES
    (None, 4),        # given as null
    (False, 0),
    (0, 0),
    (2, 2),
    (-3, 0),
    ("3", 3),         # a numeric string, from another language's client
    (" 3 ", 3),
    ("many", 0),      # anything unreadable: no retries, the cautious reading for side effects
    (2.7, 2),         # a float is truncated
    (float("nan"), 0),
    ({}, 0),
    ([], 0),
])
def test_the_retry_option_is_read_cautiously(config, value, expected):
    retried, filing = retries_before_dead(config, new_payload(retry=value))

    assert retried == expected
    assert filing.target == "dead"


def test_a_payload_without_retry_uses_max_retries(config):
    payload = new_payload()
    del payload["retry"]
    assert retries_before_dead(config, payload)[0] == 4


def test_retries_exhausted_goes_to_dead_with_the_reason(config):
    payload = new_payload(retry=1, retry_count=0, failed_at=NOW - 60)

    filing = policy(config).filing(payload, raised(RuntimeError("still broken")))

    assert filing.target == "dead"
    assert filing.score == NOW
    assert payload["dead_reason"] == "retries exhausted"
    assert payload["error_message"] == "still broken"
    assert payload["failed_at"] == NOW - 60


def test_dead_false_discards_the_job_but_still_tells_the_death_handlers(config):
    seen = []
    payload = new_payload(retry=0, dead=False)

    filing = policy(config, handlers=[lambda p, e: seen.append((p["jid"], e))]).filing(payload, raised(KeyError(1)))

    assert filing is None
    assert [(jid, type(e)) for jid, e in seen] == [("j1", KeyError)]


def test_death_handlers_are_called_and_a_raising_one_does_not_stop_the_filing(config):
    calls = []

    def broken(payload, exc):
        calls.append("broken")
        raise RuntimeError("handler bug")

    def recording(payload, exc):
        calls.append(("recording", payload["jid"], payload["dead_reason"], str(exc)))

    filing = policy(config, handlers=[broken, recording]).filing(new_payload(retry=False), raised(OSError("gone")))

    assert filing.target == "dead"
    assert calls == ["broken", ("recording", "j1", "retries exhausted", "gone")]


def test_death_handlers_are_not_called_for_a_retry(config):
    calls = []
    policy(config, handlers=[lambda p, e: calls.append(p)]).filing(new_payload(), raised(RuntimeError()))
    assert calls == []


def test_retry_in_chooses_the_delay_and_none_means_the_default(config):
    p = policy(config, seed=4)
    job = ChoosesItsDelay(new_payload())

    chosen = p.filing(new_payload(retry_count=1), raised(RuntimeError()), job)
    default = p.filing(new_payload(), raised(KeyError("k")), job)

    assert chosen.score == NOW + 300  # retry_in(2, ...)
    assert default.score == NOW + default_delay(0, random.Random(4))


def test_a_raising_retry_in_falls_back_to_the_default_backoff(config):
    payload = new_payload()

    filing = policy(config, seed=8).filing(payload, raised(RuntimeError("job failed")), BrokenRetryIn(payload))

    assert filing.target == "retry"
    assert filing.score == NOW + default_delay(0, random.Random(8))
    assert payload["error_message"] == "job failed"  # the job's error, not retry_in's


@pytest.mark.parametrize(("option", "at_most"), [(True, payloads.BACKTRACE_DEFAULT_LINES), (3, 3)])
def test_the_backtrace_option_stores_the_last_frames(config, option, at_most):
    def deep(n):
        if n == 0:
            raise RuntimeError("deep down")
        deep(n - 1)

    exc = None
    try:
        deep(30)
    except RuntimeError as caught:
        exc = caught
    payload = new_payload(backtrace=option)

    policy(config).filing(payload, exc)

    lines = payload["error_backtrace"]
    assert 0 < sum(line.startswith("  File ") for line in lines) <= at_most  # (frames)
    assert all(isinstance(line, str) for line in lines)
    assert lines[-1] == "RuntimeError: deep down"
    if option is True:
        assert any("in deep" in line for line in lines)


def test_backtrace_counts_frames_and_leaves_out_the_column_markers(config):
    # backtrace = 5 kept five lines: two frames and a half, two of the lines "^^^^^^" markers.
    def call(depth):  # (each frame its own function: Python folds repeated identical frames)
        if depth == 8:
            raise RuntimeError("deep down")
        return [STEPS[depth](depth + 1)][0]  # (an expression Python 3.11+ underlines with markers)

    STEPS = [lambda d, f=call: f(d) for _ in range(8)]
    try:
        call(0)
    except RuntimeError as caught:
        exc = caught
    payload = new_payload(backtrace=5)

    policy(config).filing(payload, exc)

    lines = payload["error_backtrace"]
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: deep down"
    frames = [line for line in lines if line.startswith("  File ")]
    assert len(frames) == 5 and frames[-1].endswith(", in call")
    assert not any(set(line.strip()) <= set("^~") for line in lines)
    assert len(lines) == 1 + 5 * 2 + 1  # the header, each frame's location and source, the error


def test_no_backtrace_unless_asked(config):
    payload = new_payload()
    policy(config).filing(payload, raised(RuntimeError()))
    assert "error_backtrace" not in payload


def test_dead_entries_are_trimmed_by_count_and_age(redis_url, config, r):
    client = make_redis(config)
    try:
        fetch = ReliableFetch(config, client, K, "host:1:x")
        p = policy(config)
        r.zadd(K.dead, {"older than DEAD_TIMEOUT": NOW - 1001, "recent": NOW - 10})
        jids = []
        for i in range(4):
            raw = payloads.encode(new_payload(jid=f"dead-{i}", retry=0))
            r.lpush(fetch.in_progress, raw)
            filing = p.filing(payloads.decode(raw), raised(RuntimeError()))
            fetch.file(raw.encode(), filing, p.dead_trim())
            jids.append(f"dead-{i}")
    finally:
        client.close()

    kept = [payloads.decode(raw)["jid"] if raw.startswith("{") else raw for raw in r.zrange(K.dead, 0, -1)]
    assert "older than DEAD_TIMEOUT" not in kept
    assert len(kept) == 3  # DEAD_MAX_JOBS: the oldest ("recent" included) make room
    assert set(kept) < set(jids)
    assert r.llen(fetch.in_progress) == 0


def test_dead_trim_is_now_minus_dead_timeout_and_the_cap(config):
    assert policy(config).dead_trim() == (NOW - 1000, 3)
