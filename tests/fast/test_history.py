"""Metrics history (features/history/): runs counted in memory by minute, queue and class, written
once a beat in one pipeline, read back with percentiles from the buckets; TTLs, the hour roll-up,
clock jumps, odd names and a failed flush."""

from __future__ import annotations

import calendar
import logging
import types

import pytest
import redis
from helpers import RedisServer, free_port, round_trips

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.run.hooks import Decision, JobRun, Outcome
from django_cogworker.engine.settle.settlement import ACK
from django_cogworker.features.history import api
from django_cogworker.features.history.buckets import BOUNDS_MS, BUCKETS, bucket_of, percentile
from django_cogworker.features.history.hook import History
from django_cogworker.features.history.recorder import HOUR_KEEP, MINUTE_KEEP, UNWRITTEN_MINUTES, Recorder, minute_stamp

K = Keys()
NOW = calendar.timegm((2026, 3, 14, 10, 30, 15))  # 10:30:15 UTC
MINUTE = NOW - NOW % 60
HOUR = NOW - NOW % 3600


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def recorder(clock: Clock, redis_now: float = NOW) -> Recorder:
    """A Recorder on ``clock``, whose Redis TIME reads ``redis_now`` when the clock read 1000."""
    rec = Recorder(K, monotonic=clock, redis_now=lambda _redis: redis_now + clock.t - 1000.0)
    rec.anchor(redis_now + clock.t - 1000.0)
    return rec


def test_counts_run_times_and_percentiles_of_runs_of_known_duration_in_one_pipeline(rb, monkeypatch):
    clock = Clock()
    rec = recorder(clock)
    for i in range(10):  # 10 runs of 200 ms, 2 failed
        rec.record("default", "shop.Sync", 0.2, failed=i < 2)
    for _ in range(90):
        rec.record("default", "shop.Ping", 0.003, failed=False)
    for _ in range(9):
        rec.record("default", "shop.Ping", 0.040, failed=False)
    rec.record("default", "shop.Ping", 2.0, failed=False)
    trips = round_trips(monkeypatch)
    rec.flush(rb)
    assert trips["n"] == 1  # (anchored already: TIME isn't read again within a minute)
    window = api.read(10, redis=rb, keys=K, now=NOW + 5)
    sync, ping = window.classes["shop.Sync"], window.classes["shop.Ping"]
    assert list(window.classes) == ["shop.Ping", "shop.Sync"]  # busiest by run time first: 2,630 ms, then 2,000
    assert (sync.processed, sync.failed, sync.ms_total) == (10, 2, pytest.approx(2000.0))
    assert sync.buckets[bucket_of(200)] == 10 and BOUNDS_MS[bucket_of(200)] == 250
    # interpolated inside (100, 250] ms, as Prometheus' histogram_quantile does
    assert (sync.p50, sync.p95, sync.p99) == (175.0, 242.5, 248.5)
    assert (ping.processed, ping.failed, ping.ms_total) == (100, 0, pytest.approx(90 * 3 + 9 * 40 + 2000))
    assert ping.p50 == pytest.approx(5 * 50 / 90, abs=1e-3)  # in (0, 5] ms
    assert ping.p95 == pytest.approx(25 + 25 * 5 / 9, abs=1e-3)  # in (25, 50]
    assert ping.p99 == 50.0
    assert sync.document() == {"processed": 10, "failed": 2, "ms_p50": 175.0, "ms_p95": 242.5, "ms_p99": 248.5,
                               "ms_mean": 200.0, "ms_total": 2000.0}
    assert [p.processed for p in sync.series][-1] == 10 and sum(p.processed for p in sync.series) == 10


def test_percentiles_of_empty_and_slowest_buckets():
    assert percentile([0] * BUCKETS, 0.5) is None
    slow = [0] * BUCKETS
    slow[-1] = 3  # past a minute
    assert percentile(slow, 0.99) == 60_000.0
    assert bucket_of(5) == 0 and bucket_of(5.001) == 1 and bucket_of(10 ** 9) == BUCKETS - 1


def test_keys_live_72_hours_by_the_minute_and_30_days_by_the_hour_counted_from_their_own_slot(rb):
    rec = recorder(Clock())
    rec.record("default", "shop.Sync", 0.01, failed=False)
    rec.flush(rb)
    minute_key, hour_key = K.history("m:202603141030"), K.history("h:2026031410")
    assert rb.exists(minute_key, hour_key) == 2
    assert MINUTE + 60 + MINUTE_KEEP - NOW - 2 <= rb.ttl(minute_key) <= MINUTE + 60 + MINUTE_KEEP - NOW
    assert HOUR + 3600 + HOUR_KEEP - NOW - 2 <= rb.ttl(hour_key) <= HOUR + 3600 + HOUR_KEEP - NOW
    assert rb.ttl(K.history_totals) == -1  # (the Prometheus histogram's: counters since counting began)


def test_the_hour_holds_the_sum_of_its_minutes_and_long_windows_read_it(rb):
    clock = Clock()
    rec = recorder(clock)
    rec.record("default", "shop.Sync", 0.2, failed=False)
    clock.t += 60  # the next minute, same hour
    rec.record("default", "shop.Sync", 0.2, failed=True)
    rec.record("mail", "shop.Sync", 0.02, failed=False)
    rec.flush(rb)
    assert rb.hget(K.history("m:202603141030"), "default|shop.Sync|p") == b"1"
    assert rb.hget(K.history("m:202603141031"), "default|shop.Sync|p") == b"1"
    assert rb.hget(K.history("h:2026031410"), "default|shop.Sync|p") == b"2"
    by_minute = api.read(120, redis=rb, keys=K, now=NOW + 60)
    by_hour = api.read(24 * 60, redis=rb, keys=K, now=NOW + 60)
    assert (by_minute.step, by_hour.step) == (60, 3600)
    for window in (by_minute, by_hour):
        sync = window.classes["shop.Sync"]
        assert (sync.processed, sync.failed) == (3, 1) and window.queues == ["default", "mail"]
    assert api.read(120, queue="mail", redis=rb, keys=K, now=NOW + 60).classes["shop.Sync"].processed == 1
    assert api.read(120, job_class="shop.Other", redis=rb, keys=K, now=NOW + 60).classes == {}


def test_a_jump_of_the_hosts_clock_changes_nothing_and_one_of_redises_never_deletes_a_minute(rb, monkeypatch):
    clock = Clock()
    rec = recorder(clock)
    rec.record("default", "shop.Sync", 0.01, failed=False)
    rec.flush(rb)
    # This host's wall clock stepped a day ahead: runs are still filed by Redis's clock.
    monkeypatch.setattr("time.time", lambda: NOW + 86_400.0)
    rec.record("default", "shop.Sync", 0.01, failed=False)
    # Then Redis's own clock jumps 4 days ahead before the flush: the minute's counts are past its
    # 72 h and are dropped, not written with an EXPIRE in the past (which would delete the minute).
    clock.t += 1
    rec.anchor(NOW + 4 * 86_400 + 1)
    rec.record("default", "shop.Sync", 0.01, failed=False)  # (now filed 4 days later)
    rec.flush(rb)
    assert rb.hget(K.history("m:202603141030"), "default|shop.Sync|p") == b"1"
    assert rb.hget(K.history("h:2026031410"), "default|shop.Sync|p") == b"2"
    assert rb.hget(K.history("m:202603181030"), "default|shop.Sync|p") == b"1"
    assert not rb.exists(K.history("m:202603151030"))


@pytest.mark.parametrize("name", ["shop.A|b", "two\nlines", "ünïcödé", "lone \ud800 surrogate", "%41|p"])
def test_odd_class_and_queue_names_are_safe_in_fields_and_read_back_as_they_were(rb, name):
    rec = recorder(Clock())
    rec.record("q|x", name, 0.01, failed=True)
    rec.record("default", "shop.Plain", 0.01, failed=False)
    rec.flush(rb)
    fields = rb.hkeys(K.history("m:202603141030"))
    assert all(f.isascii() and f.count(b"|") == 2 for f in fields)
    window = api.read(5, redis=rb, keys=K, now=NOW)
    assert set(window.classes) == {name, "shop.Plain"} and window.queues == ["default", "q|x"]
    assert (window.classes[name].processed, window.classes[name].failed) == (1, 1)
    assert window.classes["shop.Plain"].failed == 0


def test_a_failed_flush_keeps_its_counts_for_the_next_one_and_counts_none_twice(rb):
    rec = recorder(Clock())
    rec.record("default", "shop.Sync", 0.2, failed=False)
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    with pytest.raises(redis.ConnectionError):
        rec.flush(away)
    rec.record("default", "shop.Sync", 0.2, failed=False)
    rec.flush(rb)
    rec.flush(rb)
    assert api.read(5, redis=rb, keys=K, now=NOW).classes["shop.Sync"].processed == 2


def test_through_a_long_outage_a_class_keeps_its_last_minutes_in_memory_and_every_run_in_its_hours(
        tmp_path, caplog):
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    client = server.client(socket_connect_timeout=0.5, socket_timeout=2)
    try:
        clock = Clock()
        rec = recorder(clock)

        def minutes(n: int) -> None:  # (a run of each class in each of the next n minutes)
            for _ in range(n):
                clock.t += 60
                rec.record("default", "shop.Sync", 0.01, failed=False)
                rec.record("mail", "shop.Mail", 0.3, failed=True)

        minutes(1)
        rec.flush(client)
        server.kill()
        minutes(30)
        with pytest.raises(redis.ConnectionError):
            rec.flush(client)  # (kept, written again by the next flush)
        minutes(UNWRITTEN_MINUTES + 15)  # (no flush meanwhile: the heartbeat fails, so its chores don't run)
        with pytest.raises(redis.ConnectionError):
            rec.flush(client)
        server.restart()
        with caplog.at_level(logging.WARNING, logger="django_cogworker.features.history.recorder"):
            rec.flush(client)
            rec.flush(client)
        said = [r.getMessage() for r in caplog.records if "dropped while Redis took no counts" in r.getMessage()]
        # (for each of the two classes: 15 minutes folded out of memory as they were counted, 30 more out
        # of what the failed flushes kept)
        assert len(said) == 1 and said[0].startswith("metrics history: 90 minute bucket(s) dropped")
        last = [K.history("m:" + minute_stamp(MINUTE + 60 * m)).encode() for m in range(1, 107)][-UNWRITTEN_MINUTES:]
        written = sorted(client.keys(K.history("m:*")))
        assert written == sorted([K.history("m:202603141031").encode(), *last])
        for queue, name in (("default", "shop.Sync"), ("mail", "shop.Mail")):
            field = f"{queue}|{name}|p"
            assert sum(int(client.hget(key, field) or 0) for key in client.keys(K.history("h:*"))) == 106
            assert sum(int(client.hget(key, field) or 0) for key in written) == 1 + UNWRITTEN_MINUTES
        assert client.hget(K.history_totals, "shop.Mail|b6") == b"106"  # (0.3 s: the 250-500 ms bucket)
        assert (client.hget(K.history("h:2026031411"), "mail|shop.Mail|f"), client.ttl(K.history("h:2026031411")) > 0) \
            == (b"60", True)
    finally:
        client.close()
        server.cleanup()


def test_a_key_of_the_wrong_type_is_moved_aside_and_the_counts_go_to_a_fresh_one(rb):
    rec = recorder(Clock())
    rb.set(K.history("m:202603141030"), "planted")
    rec.record("default", "shop.Sync", 0.2, failed=False)
    rec.flush(rb)
    rec.flush(rb)
    assert rb.hget(K.history("m:202603141030"), "default|shop.Sync|p") == b"1"
    assert rb.hget(K.history("h:2026031410"), "default|shop.Sync|p") == b"1"
    assert len(rb.keys(K.quarantine_prefix + "*")) == 1


def _run(outcome: Outcome, failure: bool, ran: bool, cls: object = object) -> JobRun:
    run = JobRun(Unit(b"{}", "default"), {"class": "shop.Sync"}, cls, "jid", "shop.Sync",
                 started=1.0 if ran else None, elapsed=0.2)
    run.decision = Decision(outcome, ACK, failure=failure)
    return run


def test_the_feature_counts_what_the_stats_count_and_flushes_from_its_chore(rb):
    feature = History(rb, K, recorder(Clock()))
    assert feature.applies(object) and not feature.applies(None)
    for run in (_run(Outcome.SUCCESS, False, True), _run(Outcome.RETRY, True, True),
                _run(Outcome.DEAD, True, False),  # (failed before its run: a before hook raised)
                _run(Outcome.RESCHEDULED, False, True),  # (over a limit: not counted)
                _run(Outcome.DEAD, False, False)):  # (dropped unrun: expired, cancelled)
        feature.after(run)
    (chore,) = feature.chores()
    chore(rb)
    sync = api.read(5, redis=rb, keys=K, now=NOW).classes["shop.Sync"]
    assert (sync.processed, sync.failed) == (3, 2)


def test_deploy_marks_are_kept_with_their_time_and_read_in_their_window(rb):
    api.add_mark("deploy 1.4.2", redis=rb, keys=K, now=NOW - 30)
    api.add_mark("deploy 1.4.2", redis=rb, keys=K, now=NOW - 7200)  # (the same label twice: two marks)
    with pytest.raises(ValueError):
        api.add_mark("  ", redis=rb, keys=K)
    assert [(m.at, m.label) for m in api.read(10, redis=rb, keys=K, now=NOW).marks] == [(NOW - 30, "deploy 1.4.2")]
    assert len(api.read(180, redis=rb, keys=K, now=NOW).marks) == 2
    api.add_mark("later", redis=rb, keys=K, now=NOW - 7200 + HOUR_KEEP + 1)  # (marks older than 30 days go)
    assert rb.zcard(K.history_marks) == 2


def test_history_is_off_with_its_setting():
    from django_cogworker.conf import build_config
    from django_cogworker.engine.run.hooks import WorkerParts
    from django_cogworker.features import standard

    def names(config):
        parts = WorkerParts(config, types.SimpleNamespace(), K, "id", None)  # type: ignore[arg-type]
        return [f.name for f in standard.build(parts)]

    assert "history" in names(build_config({}))
    assert "history" not in names(build_config({"METRICS_HISTORY": False}))


def test_prometheus_gets_a_run_time_histogram_per_class_whose_inf_bucket_is_its_count(rb):
    from prometheus_client.parser import text_string_to_metric_families

    from django_cogworker.engine.settle.stats import Stats
    from django_cogworker.metrics.collect import collect
    from django_cogworker.metrics.exposition import render

    stats, rec = Stats(K), recorder(Clock())
    for seconds in (0.003, 0.2, 0.2, 2.0):
        stats.job_done(False, 'we"ird\nclass', seconds)
        rec.record("default", 'we"ird\nclass', seconds, failed=False)
    stats.job_done(False, "shop.Uncounted", 0.5)  # (counted before the history was on)
    stats.flush(rb)
    rec.flush(rb)
    page = render(collect(redis=rb, keys=K))
    (family,) = [f for f in text_string_to_metric_families(page) if f.name == "cogworker_job_duration_seconds"]
    assert family.type == "histogram"
    got = {(s.name, s.labels["class"], s.labels.get("le")): s.value for s in family.samples}
    weird = 'we"ird\nclass'
    assert got["cogworker_job_duration_seconds_bucket", weird, "0.005"] == 1
    assert got["cogworker_job_duration_seconds_bucket", weird, "0.1"] == 1
    assert got["cogworker_job_duration_seconds_bucket", weird, "0.25"] == 3
    assert got["cogworker_job_duration_seconds_bucket", weird, "2.5"] == 4
    assert got["cogworker_job_duration_seconds_bucket", weird, "+Inf"] == 4
    assert got["cogworker_job_duration_seconds_count", weird, None] == 4
    assert got["cogworker_job_duration_seconds_sum", weird, None] == pytest.approx(2.403)
    assert got["cogworker_job_duration_seconds_bucket", "shop.Uncounted", "+Inf"] == 1
    assert got["cogworker_job_duration_seconds_sum", "shop.Uncounted", None] == pytest.approx(0.5)
    assert ("cogworker_job_duration_seconds_bucket", "shop.Uncounted", "0.5") not in got


def test_prometheus_shows_the_histogram_of_the_classes_the_other_per_class_series_show(rb, monkeypatch):
    from django_cogworker.api import stats as api_stats
    from django_cogworker.engine.settle.stats import Stats
    from django_cogworker.metrics.collect import collect

    stats, rec = Stats(K), recorder(Clock())
    for n in range(5):
        for _ in range(n + 1):
            stats.job_done(False, f"shop.Job{n}", 0.01)
            rec.record("default", f"shop.Job{n}", 0.01, failed=False)
    stats.flush(rb)
    rec.flush(rb)
    monkeypatch.setitem(api_stats.JobClassStats.all.__func__.__kwdefaults__, "limit", 2)  # (CLASS_LIMIT: 2)
    families = {f.name: f for f in collect(redis=rb, keys=K)}
    shown = {labels["class"] for _suffix, labels, _value in families["cogworker_job_duration_seconds"].samples}
    processed = {labels["class"] for _suffix, labels, _value in families["cogworker_job_processed_total"].samples}
    assert shown == processed == {"shop.Job4", "shop.Job3"}


def test_a_scrape_with_many_classes_reads_the_totals_of_the_classes_it_shows_alone(rb, monkeypatch):
    # (The totals hash never expires and counts every class ever run: a scrape read all of it, every
    # scrape, to show the CLASS_LIMIT busiest.)
    from django_cogworker.api import stats as api_stats
    from django_cogworker.engine.settle.stats import Stats
    from django_cogworker.metrics.collect import collect

    stats, rec = Stats(K), recorder(Clock())
    for n in range(40):
        for _ in range(n + 1):
            stats.job_done(False, f"shop.Job{n}", 0.01)
            rec.record("default", f"shop.Job{n}", 0.01, failed=False)
    for n in range(200):  # (classes long gone: in the totals, not in the per-class stats)
        rec.record("default", f"old.Job{n}", 0.01, failed=False)
    stats.flush(rb)
    rec.flush(rb)
    monkeypatch.setitem(api_stats.JobClassStats.all.__func__.__kwdefaults__, "limit", 3)  # (CLASS_LIMIT: 3)
    asked: list[tuple] = []
    real = redis.Redis.execute_command

    def seen(self, *args, **options):
        if K.history_totals in args[1:2]:
            asked.append(args)
        return real(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", seen)
    families = {f.name: f for f in collect(redis=rb, keys=K)}
    samples = families["cogworker_job_duration_seconds"].samples
    assert {labels["class"] for _suffix, labels, _value in samples} == {"shop.Job39", "shop.Job38", "shop.Job37"}
    assert [(suffix, value) for suffix, labels, value in samples if labels["class"] == "shop.Job39"
            and labels.get("le") in ("0.01", "+Inf", None)] == [("_bucket", 40), ("_bucket", 40), ("_sum", 0.4),
                                                                ("_count", 40)]
    [(command, _key, *fields)] = asked
    assert command == "HMGET" and len(fields) == 3 * (1 + BUCKETS)
    assert {f.rpartition("|")[0] for f in fields} == {"shop.Job39", "shop.Job38", "shop.Job37"}
