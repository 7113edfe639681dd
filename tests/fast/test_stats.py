"""Processed and failed counters (engine/settle/stats.py): counted in memory, flushed in one pipeline."""

from __future__ import annotations

import calendar
import threading

import pytest
import redis
from helpers import free_port
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.settle.stats import DAY_TTL, Stats, day_of

K = Keys()
NOW = calendar.timegm((2026, 3, 14, 23, 59, 59))  # a UTC evening
DAY = "2026-03-14"


class Counting:
    """A real client that counts what is sent: round trips (pipelines) and single commands, and
    records each pipelined command's name in ``sent``, in order."""

    def __init__(self, client):
        self.client = client
        self.pipelines = 0
        self.commands = 0
        self.sent: list[str] = []

    def pipeline(self, *args, **kwargs):
        self.pipelines += 1
        return Recorded(self.client.pipeline(*args, **kwargs), self.sent)

    def __getattr__(self, name):
        self.commands += 1
        return getattr(self.client, name)


class Recorded:
    """A real pipeline that notes the name of each command queued on it."""

    def __init__(self, pipe, sent: list[str]):
        self.pipe, self.sent = pipe, sent

    def __getattr__(self, name):
        command = getattr(self.pipe, name)
        if name == "execute":
            return command

        def queue(*args, **kwargs):
            self.sent.append(name)
            return command(*args, **kwargs)
        return queue


@pytest.fixture
def bclient(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def down():
    """A client for a Redis that is not there (fails at once, no retries)."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    yield client
    client.close()


def test_counts_stay_in_memory_until_a_flush_writes_them_in_one_pipeline(bclient, r):
    stats = Stats(K)
    for failed in (False, True, False, True, True):
        stats.job_done(failed=failed)
    assert r.dbsize() == 0  # not a round trip per job

    counting = Counting(bclient)
    stats.flush(counting, now=NOW)

    assert (counting.pipelines, counting.commands) == (1, 0)
    assert r.get(K.stat_processed) == "5"
    assert r.get(K.stat_failed) == "3"
    assert r.get(K.stat("processed", DAY)) == "5"
    assert r.get(K.stat("failed", DAY)) == "3"
    assert 0 < r.ttl(K.stat("processed", DAY)) <= DAY_TTL
    assert r.ttl(K.stat_processed) == -1  # the totals never expire


def test_flushes_add_up_and_the_day_follows_utc(bclient, r):
    stats = Stats(K)
    stats.job_done(failed=False)
    stats.flush(bclient, now=NOW)
    stats.job_done(failed=False)
    stats.flush(bclient, now=NOW + 1)  # past midnight UTC

    assert r.get(K.stat_processed) == "2"
    assert r.get(K.stat("processed", DAY)) == "1"
    assert r.get(K.stat("processed", "2026-03-15")) == "1"
    assert day_of(NOW) == DAY


def test_nothing_counted_means_no_round_trip(bclient, r):
    counting = Counting(bclient)
    Stats(K).flush(counting, now=NOW)
    assert (counting.pipelines, counting.commands) == (0, 0)
    assert r.dbsize() == 0


def test_a_failed_flush_keeps_the_counts_for_the_next_one(bclient, down, r):
    stats = Stats(K)
    for failed in (False, True):
        stats.job_done(failed=failed)

    with pytest.raises(redis.ConnectionError):
        stats.flush(down, now=NOW)
    stats.job_done(failed=False)
    stats.flush(bclient, now=NOW)

    assert r.get(K.stat_processed) == "3"
    assert r.get(K.stat_failed) == "1"
    assert r.get(K.stat("processed", DAY)) == "3"


@pytest.mark.parametrize("planted", ["a list", "not a number", "at the limit"])
def test_a_counter_that_cannot_be_counted_on_is_moved_aside_and_nothing_is_lost_or_doubled(bclient, r, planted,
                                                                                           caplog):
    # One such key fails its own increment only: the others went through and must not be counted
    # again. It used to fail every beat for good (a day key isn't in the key guard's list, and a
    # string that isn't a number is of the right type).
    if planted == "a list":
        r.rpush(K.stat("processed", DAY), "not a counter")
    elif planted == "not a number":
        r.set(K.stat("processed", DAY), "abc")
    else:
        r.set(K.stat("processed", DAY), str(2**63 - 1))
    stats = Stats(K)
    for failed in (False, True):
        stats.job_done(failed=failed)

    stats.flush(bclient, now=NOW)  # logged, not raised: moved aside
    assert "can't be counted on" in caplog.text
    stats.flush(bclient, now=NOW)

    assert r.get(K.stat_processed) == "2"
    assert r.get(K.stat_failed) == "1"
    assert r.get(K.stat("processed", DAY)) == "2"
    assert r.get(K.stat("failed", DAY)) == "1"
    assert len(r.keys(K.quarantine_prefix + "*")) == 1


def test_counting_from_many_threads_loses_nothing(bclient, r):
    stats = Stats(K)

    def work():
        for i in range(1000):
            stats.job_done(failed=i % 4 == 0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats.flush(bclient, now=NOW)

    assert r.get(K.stat_processed) == "8000"
    assert r.get(K.stat_failed) == "2000"


def test_per_class_runs_failures_and_seconds_ride_on_the_same_pipeline(bclient, r):
    stats = Stats(K)
    stats.job_done(False, "shop.jobs.SendReceipt", 0.25)
    stats.job_done(True, "shop.jobs.SendReceipt", 1.5)
    stats.job_done(False, "shop.jobs.Report", 2.0)
    counting = Counting(bclient)
    stats.flush(counting, now=NOW)

    assert (counting.pipelines, counting.commands) == (1, 0)  # no round trip of its own
    assert r.hgetall(K.stat_class_processed) == {"shop.jobs.SendReceipt": "2", "shop.jobs.Report": "1"}
    assert r.hgetall(K.stat_class_failed) == {"shop.jobs.SendReceipt": "1"}
    seconds = r.hgetall(K.stat_class_seconds)
    assert float(seconds["shop.jobs.SendReceipt"]) == pytest.approx(1.75)
    assert float(seconds["shop.jobs.Report"]) == pytest.approx(2.0)
    assert r.ttl(K.stat_class_processed) == -1
    assert r.get(K.stat_processed) == "3"


def test_per_class_counts_survive_a_failed_flush_and_a_hash_of_the_wrong_type(bclient, down, r, caplog):
    stats = Stats(K)
    stats.job_done(True, "shop.jobs.SendReceipt", 0.5)
    with pytest.raises(redis.ConnectionError):
        stats.flush(down, now=NOW)
    r.set(K.stat_class_seconds, "not a hash")
    stats.job_done(False, "shop.jobs.SendReceipt", 0.5)
    stats.flush(bclient, now=NOW)  # the wrong-typed hash moved aside, logged, not raised
    assert "can't be counted on" in caplog.text
    stats.flush(bclient, now=NOW)

    assert r.hgetall(K.stat_class_processed) == {"shop.jobs.SendReceipt": "2"}
    assert r.hgetall(K.stat_class_failed) == {"shop.jobs.SendReceipt": "1"}
    assert float(r.hget(K.stat_class_seconds, "shop.jobs.SendReceipt")) == pytest.approx(1.0)
    assert len(r.keys(K.quarantine_prefix + "*")) == 1


def test_totals_are_written_before_the_per_class_fields_even_after_a_partly_failed_flush(bclient, r):
    # A scrape reads the per-class hashes, then the totals: written in this order, a flush landing
    # between the reads never shows a class's runs that the totals lack (tests/test_metrics.py).
    stats = Stats(K)
    r.set(K.stat_class_seconds, "not a hash")
    stats.job_done(False, "shop.jobs.SendReceipt", 0.5)
    stats.flush(bclient, now=NOW)  # the seconds not written (the hash moved aside): carried over, alone
    stats.job_done(False, "shop.jobs.SendReceipt", 0.5)
    counting = Counting(bclient)
    stats.flush(counting, now=NOW)
    names = [name for name in counting.sent if name in ("incrby", "hincrby", "hincrbyfloat")]
    assert names[:2] == ["incrby", "incrby"] and sorted(names[2:]) == ["hincrby", "hincrbyfloat"], names
    assert r.get(K.stat_processed) == "2" and r.hget(K.stat_class_processed, "shop.jobs.SendReceipt") == "2"
    assert float(r.hget(K.stat_class_seconds, "shop.jobs.SendReceipt")) == pytest.approx(1.0)
