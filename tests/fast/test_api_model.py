"""The object model (``django_cogworker.api``) the admin is built on, against the suite's real Redis."""

from __future__ import annotations

import json
import time

import pytest
import redis
from admin_fixtures import (
    FAIL_JOB,
    KEYS,
    RECORD_JOB,
    failed,
    fake_process,
    job,
    publish_periodic,
    push,
    quarantine,
    zadd,
)

from django_cogworker import api
from django_cogworker.broker import scripts
from django_cogworker.conf import Config
from django_cogworker.engine.schedule.periodic_ticker import Ticker
from django_cogworker.engine.settle.stats import Stats as EngineStats
from django_cogworker.engine.settle.stats import day_of
from django_cogworker.push import payload as payloads
from django_cogworker.push import unique
from django_cogworker.push.periodic import Entry


def fill(rb, key, n, *, start=1_000_000.0, **fields):
    """``n`` entries scored start, start+1...; returns their payloads in score order."""
    made = [job(args=[i], **fields) for i in range(n)]
    rb.zadd(key, {payloads.encode(p): start + i for i, p in enumerate(made)})
    return made


# -- queues ------------------------------------------------------------------


def test_queue_jobs_pages_by_rank_newest_first(rb):
    for i in range(30):
        push(rb, job(args=[i]))
    first, second = api.Queue("default").jobs(1, 25), api.Queue("default").jobs(2, 25)
    assert [j.args[0] for j in first.items] == list(range(29, 4, -1))
    assert [j.args[0] for j in second.items] == [4, 3, 2, 1, 0]
    assert (first.total, first.pages, first.has_next, second.has_next, second.items[0].position) == (30, 2, True,
                                                                                                     False, 25)
    assert api.Queue("default").jobs(9, 25).items == []
    assert api.Queue("default").jobs(1, 10_000).per_page == api.MAX_PER_PAGE


def test_queue_keeps_its_existing_api(rb):
    push(rb, job(queue="mail"))
    q = api.Queue("mail")
    q.pause()
    assert [x.name for x in api.Queue.all()] == ["mail"] and q.paused and q.size() == 1 and q.latency() > 0
    q.unpause()
    assert not q.paused and q.clear() == 1 and q.size() == 0


def test_unreadable_payloads_are_listed_not_fatal(rb):
    rb.lpush(KEYS.queue("default"), b"\xff not json", b"[1, 2]")
    items = api.Queue("default").jobs().items
    assert [i.display_class for i in items] == [payloads.UNPARSEABLE_CLASS] * 2
    assert all(i.parse_error and i.jid is None and i.ident.startswith("sha1:") for i in items)


# -- sorted sets: pages, filters, lookups -------------------------------------


def test_sorted_set_pages_by_rank(rb):
    made = fill(rb, KEYS.schedule, 60)
    fill(rb, KEYS.dead, 60)
    scheduled = api.ScheduledSet().page(2, 25)
    assert [e.args[0] for e in scheduled.items] == list(range(25, 50))
    assert [e.score for e in scheduled.items][:2] == [1_000_025.0, 1_000_026.0]
    assert scheduled.items[0].jid == made[25]["jid"] and scheduled.pages == 3
    dead = api.DeadSet().page(1, 25)  # the latest death first
    assert [e.args[0] for e in dead.items][:3] == [59, 58, 57]
    assert api.DeadSet().page(3, 25).items[-1].args == [0]
    assert api.RetrySet().page().items == [] and api.RetrySet().size() == 0


def test_filters_by_job_and_substring_literally(rb):
    now = time.time()
    zadd(rb, KEYS.retry, failed(klass=RECORD_JOB, message="disk *full* [x]?"), now + 3)
    zadd(rb, KEYS.retry, failed(klass=FAIL_JOB, message="disk full"), now + 1)
    zadd(rb, KEYS.retry, failed(klass=RECORD_JOB, message="timeout"), now + 2)
    retries = api.RetrySet()
    by_job = retries.page(job=RECORD_JOB)
    assert [e.error_message for e in by_job.items] == ["timeout", "disk *full* [x]?"]
    assert by_job.filtered and by_job.complete and by_job.total == 2
    assert [e.error_message for e in retries.page(substring="*full* [x]?").items] == ["disk *full* [x]?"]
    assert [e.error_message for e in retries.page(substring="disk").items] == ["disk full", "disk *full* [x]?"]
    assert [e.error_message for e in retries.page(job=FAIL_JOB, substring="disk").items] == ["disk full"]
    assert retries.page(job="no.Such").items == []
    assert retries.page(substring="[y]").total == 0  # as a glob, it would match "retry"


def test_filters_examine_a_bounded_window(rb, monkeypatch):
    fill(rb, KEYS.dead, 5000)
    monkeypatch.setattr(api.sorted_sets, "SCAN_BUDGET", 60.0)  # the entry cap under test, not the time one
    monkeypatch.setattr(api.sorted_sets, "SCAN_LIMIT", 2000)  # read where it lives
    page = api.DeadSet().page(1, 25, substring="matches nothing")
    assert not page.complete and 2000 <= page.scanned < 3000 and page.total == 0
    page = api.DeadSet().page(1, 25, job=RECORD_JOB)
    assert not page.complete and 1000 <= page.total < 5000  # the matches among what it examined
    monkeypatch.setattr(api.sorted_sets, "SCAN_LIMIT", 100_000)
    monkeypatch.setattr(api.sorted_sets, "MATCH_LIMIT", 100)
    page = api.DeadSet().page(1, 25, substring="default")
    assert not page.complete and 100 <= page.total < 5000
    scores = [e.score for e in page.items]
    assert scores == sorted(scores, reverse=True)
    monkeypatch.setattr(api.sorted_sets, "MATCH_LIMIT", 10_000)
    assert api.DeadSet().page(1, 25, substring="default").complete


def test_a_filter_stops_at_its_time_budget_and_says_so(rb, monkeypatch):
    # On a slow machine the entry cap alone let a filter page run past 200 ms: time bounds it too.
    fill(rb, KEYS.dead, 5000)
    monkeypatch.setattr(api.sorted_sets, "SCAN_BUDGET", 0.0)  # one ZSCAN call, then stop
    page = api.DeadSet().page(1, 25, substring="matches nothing")
    assert not page.complete and page.scanned == api._base.SCAN_COUNT and page.total == 0
    monkeypatch.setattr(api.sorted_sets, "SCAN_BUDGET", 60.0)
    assert api.DeadSet().page(1, 25, substring="matches nothing").complete


def test_entry_by_jid_by_score_and_raw_and_by_token(rb):
    made = fill(rb, KEYS.retry, 300)
    target = made[123]
    retries = api.RetrySet()
    assert retries.entry(target["jid"]).args == [123]
    raw = payloads.encode(target)
    assert retries.entry((1_000_123.0, raw)).jid == target["jid"]
    assert retries.entry((1_000_124.0, raw)) is None and retries.entry("0" * 24) is None
    token = retries.entry(target["jid"]).token
    assert retries.find(token).jid == target["jid"]
    assert retries.find("garbage") is None and retries.find("1.5|nope") is None


def test_find_among_many_entries_sharing_one_score(rb):
    made = [job(args=[i]) for i in range(2500)]  # a bulk push scheduled for one moment
    rb.zadd(KEYS.schedule, {payloads.encode(p): 1234.5 for p in made})
    scheduled = api.ScheduledSet()
    for p in (made[0], made[1777], made[-1]):
        assert scheduled.find(f"1234.5|{p['jid']}").jid == p["jid"]
    assert scheduled.find("1234.5|" + "0" * 24) is None


def test_tokens_survive_awkward_scores_and_payloads_without_jid(rb):
    score = time.time() + 1 / 3
    rb.zadd(KEYS.dead, {b"not json at all": score, payloads.encode(job()): score})
    dead = api.DeadSet()
    entries = dead.page().items
    assert len({e.token for e in entries}) == 2
    for entry in entries:
        assert dead.find(entry.token).raw == entry.raw


# -- sorted sets: actions ------------------------------------------------------


def test_enqueue_now_moves_to_the_queue_with_a_fresh_stamp(rb):
    token = zadd(rb, KEYS.schedule, job(queue="reports", at=123.0), time.time() + 60)
    entry = api.ScheduledSet().find(token)
    assert entry.enqueue_now(now=555.0) is True
    (raw,) = rb.lrange(KEYS.queue("reports"), 0, -1)
    moved = json.loads(raw)
    assert moved["enqueued_at"] == 555.0 and "at" not in moved and moved["jid"] == entry.jid
    assert rb.sismember(KEYS.queues, "reports") and api.ScheduledSet().size() == 0
    assert entry.enqueue_now() is False  # already gone: nothing pushed twice
    assert rb.llen(KEYS.queue("reports")) == 1


def test_retry_now_refuses_an_entry_without_a_queue(rb):
    rb.zadd(KEYS.dead, {payloads.encode(payloads.dead_letter(b"{oops", "unparseable", 1.0)): 1.0})
    (entry,) = api.DeadSet().page().items
    with pytest.raises(api.ActionRefused, match="names no queue"):
        entry.retry_now()
    assert api.DeadSet().size() == 1


def test_a_failed_push_leaves_the_entry_in_place(rb):
    token = zadd(rb, KEYS.retry, failed(queue="jammed"), 10.0)
    rb.set(KEYS.queue("jammed"), "wrong type")
    with pytest.raises(redis.ResponseError):
        api.RetrySet().find(token).retry_now()
    assert api.RetrySet().find(token) is not None  # pushed first, so never lost


def test_kill_moves_a_retry_to_dead_trimmed_like_the_engine(rb):
    config = Config(dead_max_jobs=2)
    fill(rb, KEYS.dead, 2, start=time.time() - 100)
    token = zadd(rb, KEYS.retry, failed(), time.time() + 60)
    retries = api.RetrySet(config=config)
    assert retries.find(token).kill(now=time.time()) is True
    dead = api.DeadSet().page().items
    assert len(dead) == 2 and dead[0].payload["dead_reason"] == api.KILLED_REASON
    assert dead[0].error_message == "boom" and api.RetrySet().size() == 0
    with pytest.raises(api.ActionRefused):
        dead[0].kill()


def test_delete_removes_and_releases_a_unique_lock(rb):
    payload = job(unique_digest="d1", unique_for=60, unique_until="success")
    rb.set(KEYS.unique("d1"), payload["jid"])
    token = zadd(rb, KEYS.schedule, payload, 100.0)
    assert api.ScheduledSet().find(token).delete() is True
    assert not rb.exists(KEYS.unique("d1")) and api.ScheduledSet().size() == 0
    assert unique.digest  # the engine's module: the lock name above is its


def test_retry_all_moves_in_batches_and_leaves_what_cannot_move(rb):
    fill(rb, KEYS.dead, api.BATCH + 150)
    fill(rb, KEYS.dead, 5, queue="mail", start=2_000_000.0)
    fill(rb, KEYS.dead, 3, queue="jammed", start=3_000_000.0)
    rb.set(KEYS.queue("jammed"), "wrong type")
    rb.zadd(KEYS.dead, {b"garbage": 0.5})
    assert api.DeadSet().retry_all() == api.BATCH + 155
    assert rb.llen(KEYS.queue("default")) == api.BATCH + 150 and rb.llen(KEYS.queue("mail")) == 5
    assert api.DeadSet().size() == 4  # the garbage and the three for the jammed queue


def test_delete_all(rb):
    fill(rb, KEYS.schedule, 42)
    assert api.ScheduledSet().delete_all() == 42 and api.ScheduledSet().size() == 0


def test_batch_script_has_a_header_and_pushes_before_removing():
    for script in (scripts.REQUEUE_FROM_ZSET_BATCH, scripts.RESTORE_QUARANTINED):
        assert script.source.strip()
    src = scripts.REQUEUE_FROM_ZSET_BATCH.source
    assert src.index("LPUSH") < src.index("ZREM")


# -- processes and workers ------------------------------------------------------


def test_process_set_reads_the_heartbeat_and_signals(rb):
    identity = fake_process(rb, busy_job=job(args=["running"]), quiet=True)
    rb.sadd(KEYS.processes, "ghost:1:dead")  # its hash expired: not listed
    (process,) = list(api.ProcessSet())
    assert (process.identity, process.hostname, process.pid, process.tag, process.queues, process.concurrency,
            process.busy, process.rss_kb, process.is_quiet) == (identity, "host", 4242, "web", ["default", "mail"],
                                                                5, 1, 51200, True)
    assert process.started_at < time.time() and process.beat is not None
    process.quiet()
    process.stop()
    process.dump()
    assert rb.lrange(KEYS.signals(identity), 0, -1) == [b"dump", b"stop", b"quiet"]
    assert 0 < rb.ttl(KEYS.signals(identity)) <= 60  # as the process hash of a default heartbeat
    with pytest.raises(ValueError):
        process.signal("explode")
    assert api.ProcessSet().get("ghost:1:dead") is None


def test_workers_lists_running_jobs_and_skips_a_broken_hash(rb):
    fake_process(rb, "a:1:x", busy_job=job(args=["one"], queue="mail"))
    fake_process(rb, "b:2:y")
    rb.set(KEYS.workers("b:2:y"), "wrong type")
    (work,) = list(api.Workers())
    assert (work.identity, work.thread, work.queue, work.job.args) == ("a:1:x", "cogworker-processor-1", "mail",
                                                                       ["one"])
    assert work.run_at < time.time()


# -- periodic entries -------------------------------------------------------


def entries():
    return (Entry(name="nightly", cron="0 3 * * *", job=RECORD_JOB, args=("periodic:ran",), tz="Europe/Paris",
                  queue="reports"),
            Entry(name="minutely", cron="* * * * *", job=RECORD_JOB, until_executed=True))


def test_periodic_entries_as_published_with_state(rb):
    publish_periodic(rb, *entries())
    rb.set(KEYS.periodic_last_slot("nightly"), 1_700_000_000)
    rb.sadd(KEYS.periodic_disabled, "minutely")
    minutely, nightly = api.PeriodicEntry.all()
    assert (nightly.pjid, nightly.cron, nightly.tz, nightly.job, nightly.queue, nightly.args, nightly.enabled,
            nightly.last_slot) == ("nightly", "0 3 * * *", "Europe/Paris", RECORD_JOB, "reports", ["periodic:ran"],
                                   True, 1_700_000_000.0)
    assert (minutely.enabled, minutely.until_executed, minutely.last_slot) == (False, True, None)
    # 2024-01-15 12:00 UTC = 13:00 in Paris: the next 03:00 Paris is 02:00 UTC the next day.
    assert nightly.next_run(now=1705320000.0) == 1705370400.0
    assert minutely.next_run(now=1705320000.0) == 1705320060.0


def test_enable_disable_is_what_the_ticker_reads(rb):
    publish_periodic(rb, *entries())
    ticker = Ticker(rb, KEYS, entries(), push=lambda p: None, ready=lambda: True, catch_up=False, catch_up_max=1)
    nightly = api.PeriodicEntry.get("nightly")
    nightly.disable()
    assert ticker.disabled(entries()[0]) and not api.PeriodicEntry.get("nightly").enabled
    nightly.enable()
    assert not ticker.disabled(entries()[0]) and api.PeriodicEntry.get("nightly").enabled
    assert api.PeriodicEntry.get("nope") is None


def test_an_entry_no_process_publishes_any_more_is_stale_and_can_be_forgotten(rb):
    publish_periodic(rb, *entries())
    nightly = api.PeriodicEntry.get("nightly")
    published = nightly.published_at
    assert time.time() - 5 < published <= time.time()
    assert not nightly.stale()
    assert nightly.stale(now=published + api.periodic.STALE_AFTER + 1)
    rb.set(KEYS.periodic_last_slot("nightly"), 1_700_000_000)
    nightly.forget()
    assert api.PeriodicEntry.get("nightly") is None
    assert api.PeriodicEntry.get("minutely") is not None
    assert rb.get(KEYS.periodic_last_slot("nightly")) == b"1700000000"  # back later: no catch-up burst
    # Published by an older version, without a time: not known to be stale.
    rb.hset(KEYS.periodic_schedule, "old", json.dumps({"cron": "* * * * *", "job": RECORD_JOB}))
    assert not api.PeriodicEntry.get("old").stale(now=time.time() + 10**9)


def test_enqueue_now_pushes_one_run_through_the_client(rb):
    publish_periodic(rb, *entries())
    jid = api.PeriodicEntry.get("nightly").enqueue_now()
    (raw,) = rb.lrange(KEYS.queue("reports"), 0, -1)
    pushed = json.loads(raw)
    assert (pushed["jid"], pushed["class"], pushed["args"]) == (jid, RECORD_JOB, ["periodic:ran"])
    assert not rb.exists(KEYS.periodic_last_slot("nightly"))  # no slot claimed
    rb.hset(KEYS.periodic_schedule, "unknown", json.dumps({"cron": "* * * * *", "job": "gone.Job"}))
    with pytest.raises(api.ActionRefused, match="not a registered job"):
        api.PeriodicEntry.get("unknown").enqueue_now()
    assert api.PeriodicEntry.get("unknown").next_run() is not None


# -- quarantine ---------------------------------------------------------------


def test_quarantined_keys_are_listed_with_details(rb):
    name = quarantine(rb, "a:b")  # an original key with colons of its own
    (q,) = api.QuarantinedKey.all()
    assert (q.key, q.original, q.type, q.size) == (name, KEYS.queue("a:b"), "hash", 2)
    assert 29 * 86400 < q.ttl <= 30 * 86400 and abs(q.quarantined_at - time.time()) < 5
    assert sorted(q.sample) == ["field: <script>alert('cogworker')</script>", "other: value"]
    assert api.QuarantinedKey.all().complete


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset", "stream"])
def test_every_type_has_a_size_and_sample(rb, kind):
    name = KEYS.quarantine(KEYS.retry, 1_700_000_000, "abcd")
    {"string": lambda: rb.set(name, "x" * 500), "list": lambda: rb.rpush(name, *range(9)),
     "set": lambda: rb.sadd(name, *range(9)), "zset": lambda: rb.zadd(name, {str(i): i for i in range(9)}),
     "stream": lambda: [rb.xadd(name, {"f": i}) for i in range(9)]}[kind]()
    q = api.QuarantinedKey.get(name)
    assert q.type == kind and q.size == (500 if kind == "string" else 9) and q.ttl == -1
    assert 1 <= len(q.sample) <= api.SAMPLE_ITEMS and all(len(s) <= api.SAMPLE_CHARS for s in q.sample)
    assert q.original == KEYS.retry and q.quarantined_at == 1_700_000_000


def test_restore_only_when_the_original_is_absent(rb):
    name = quarantine(rb)
    q = api.QuarantinedKey.get(name)
    rb.rpush(KEYS.queue("broken"), "fresh")
    assert q.restore() is False and rb.exists(name)
    rb.delete(KEYS.queue("broken"))
    assert q.restore() is True
    assert rb.type(KEYS.queue("broken")) == b"hash" and rb.ttl(KEYS.queue("broken")) == -1
    with pytest.raises(api.ActionRefused, match="gone"):
        q.restore()
    assert api.QuarantinedKey.get(name) is None and api.QuarantinedKey.get("cogworker:queue:x") is None


def test_delete_and_bounded_listing(rb, monkeypatch):
    for i in range(12):
        rb.set(KEYS.quarantine(f"cogworker:k{i}", 1_700_000_000 + i, "r"), "v")
    rb.set("cogworker:quarantine:not-one", "v")  # no time and random parts: not ours
    assert len(api.QuarantinedKey.all()) == 12
    monkeypatch.setattr(api.quarantine, "QUARANTINE_LIMIT", 5)  # read where they live
    monkeypatch.setattr(api._base, "SCAN_COUNT", 2)
    listed = api.QuarantinedKey.all()
    assert not listed.complete and 5 <= len(listed) < 12
    assert listed[0].delete() is True and not rb.exists(listed[0].key)


# -- stats --------------------------------------------------------------------


def test_stats_snapshot(rb):
    engine_stats = EngineStats(KEYS)
    for failed_ in (False, False, True):
        engine_stats.job_done(failed_)
    engine_stats.flush(rb)
    rb.set(KEYS.stat("processed", day_of(time.time() - 86400)), 7)
    push(rb, job())
    push(rb, job(queue="mail"))
    fill(rb, KEYS.schedule, 3)
    fill(rb, KEYS.retry, 2)
    fill(rb, KEYS.dead, 1)
    fake_process(rb, busy_job=job())
    stats = api.Stats()
    assert (stats.processed, stats.failed, stats.processed_today, stats.failed_today) == (3, 1, 3, 1)
    assert len(stats.history) == 30 and stats.history[-2].processed == 7 and stats.history[0].processed == 0
    assert stats.history[-1].day == day_of(time.time())
    assert (stats.enqueued, stats.busy, stats.process_count, stats.concurrency) == (2, 1, 1, 5)
    assert (stats.scheduled_size, stats.retry_size, stats.dead_size) == (3, 2, 1)
    assert stats.queue_sizes == {"default": 1, "mail": 1} and stats.queue_latencies["default"] > 0
    assert stats.redis_info["version"] and stats.redis_info["connected_clients"] >= 1


def test_job_class_stats_busiest_first_bounded_and_lenient(rb):
    engine_stats = EngineStats(KEYS)
    for job_class, failed_, seconds in (("shop.A", False, 0.5), ("shop.B", True, 1.0), ("shop.B", False, 2.0)):
        engine_stats.job_done(failed_, job_class, seconds)
    engine_stats.flush(rb)
    rows = api.JobClassStats.all()
    assert [(r.job_class, r.processed, r.failed) for r in rows] == [("shop.B", 2, 1), ("shop.A", 1, 0)]
    assert rows[0].seconds == pytest.approx(3.0)
    assert [r.job_class for r in api.JobClassStats.all(limit=1)] == ["shop.B"]
    rb.delete(KEYS.stat_class_seconds)
    rb.rpush(KEYS.stat_class_seconds, "a list")  # the wrong type (the key guard's to move): read as empty
    rb.hset(KEYS.stat_class_failed, "shop.A", "garbage")
    assert [(r.job_class, r.failed, r.seconds) for r in api.JobClassStats.all()] == [("shop.B", 1, 0.0),
                                                                                      ("shop.A", 0, 0.0)]


def test_objects_say_what_they_are_in_a_shell(rb):
    """``manage.py shell`` users see each object's identity, not ``<... object at 0x...>``."""
    pushed = fill(rb, KEYS.dead, 1)[0]
    rb.zadd(KEYS.dead, {b"{not json": 2_000_000.0})
    identity = fake_process(rb, busy_job=job(args=["running"]))
    publish_periodic(rb, *entries())
    name = quarantine(rb, "q")
    unreadable, first = api.DeadSet().page(1, 10).items  # (newest first)
    shown = [repr(x) for x in (api.Queue("mail"), api.DeadSet(), first, unreadable, api.ProcessSet().get(identity),
                               api.PeriodicEntry.get("nightly"), api.QuarantinedKey.all()[0], api.Stats())]
    assert shown[0] == "<Queue 'mail'>" and shown[1] == "<DeadSet 'cogworker:dead'>"
    assert shown[2].startswith(f"<SortedEntry jid={pushed['jid']} class={pushed['class']} args=[0]")
    assert shown[3].startswith("<SortedEntry (unparseable) '{not json'")
    assert shown[4].startswith(f"<Process {identity} busy=1/5 queues=['default', 'mail']")
    assert shown[5] == f"<PeriodicEntry nightly '0 3 * * *' Europe/Paris {RECORD_JOB} enabled>"
    assert shown[6] == f"<QuarantinedKey '{name}' from '{KEYS.queue('q')}' (hash)>"
    assert shown[7].startswith("<Stats processed=0 failed=0 enqueued=")
    assert not any(" object at 0x" in s for s in shown)


def test_the_walk_of_retry_all_goes_on_after_an_entry_gone_among_others_of_its_score(rb):
    # Byte order, as the set keeps it, whatever the server's locale (é sorts after z, \x80 after \x7f),
    # and members that differ only past a long common prefix.
    members = [b"a", b"e", b"\xc3\xa9", b"z", b"\x7f", b"\x80", b"p" * 200 + b"1", b"p" * 200 + b"2", b"p" * 200]
    rb.zadd(KEYS.retry, {m: 5.0 for m in members})
    rb.zadd(KEYS.retry, {b"before": 4.0, b"after": 6.0})
    expected = [b"before", *sorted(members), b"after"]
    walked, last = [], None
    while True:
        where = ["rank", 0, ""] if last is None else ["after", repr(last[1]), last[0]]
        reply = scripts.ENTRIES_AFTER(rb, [KEYS.retry], [*where, 1, 1_000_000])
        if len(reply) == 2:
            break
        last = (reply[2], float(reply[3]))
        walked.append(last[0])
        if len(walked) % 2:
            rb.zrem(KEYS.retry, last[0])  # moved: the next call finds its place without it
    assert walked == expected and rb.zcard(KEYS.retry) == len(expected) // 2  # (the others stayed: stuck)


def test_killing_a_retrying_job_of_a_batch_tells_its_batch_which_fires_its_death_once(rb, r):
    from django_cogworker import Batch
    from django_cogworker.features.batches import steps
    from testproject.demo.jobs import BatchCallbackJob, RecordJob

    batch = Batch().on("death", BatchCallbackJob, key="cb")
    with batch.jobs():
        jid = RecordJob.perform_async("k")
    raw = rb.rpop(KEYS.queue("default"))  # (as a worker takes it, and its run failed:)
    steps.settle(rb, KEYS, batch.bid, jid, "failure", '{"error": "boom"}', 60)
    token = zadd(rb, KEYS.retry, json.loads(raw), time.time() + 60)
    assert api.RetrySet().find(token).kill() is True
    status = Batch.status(batch.bid)
    assert (status.dead, status.death, status.pending) == (1, True, 1)
    assert [json.loads(p)["class"] for p in r.lrange(KEYS.queue("default"), 0, -1)] == [BatchCallbackJob.name]
