"""Progress for every job (features/progress/, issue 45 point 4): ``Job.progress`` written at most
once a second and at the run's end, kept across a retry, gone when the job succeeds or dies;
``get_progress``; ``cogworker busy``; the busy page's one round trip; the test helpers; tasks.

Jobs run through a processor called on the test's thread (engine_fixtures' ``make_processor``),
on the suite's Redis; the tracker's throttle is driven by injected clocks, never by sleeping.
"""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

import pytest
import redis
from django.core.management import call_command
from engine_fixtures import make_processor_fixture  # noqa: F401 - the make_processor fixture
from helpers import free_port, round_trips

import django_cogworker
from django_cogworker import api, testing
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run.hooks import Outcome
from django_cogworker.features.progress import tracker as tracking
from django_cogworker.features.progress.api import Progress, current
from django_cogworker.features.progress.tracker import Tracker
from django_cogworker.push import payload as payloads
from django_cogworker.push import runtime
from django_cogworker.push import scope as _scope
from django_cogworker.push.job import Job

K = Keys()
SEEN: dict[str, Any] = {}


class Clock:
    """A wall clock and a monotonic one that move only when told."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def hset_calls(client: redis.Redis) -> int:
    """How many HSETs this Redis has run since its stats were reset (the server's own count)."""
    return int(client.info("commandstats").get("cmdstat_hset", {}).get("calls", 0))


# -- the tracker ------------------------------------------------------------------------------------


def test_many_updates_are_written_at_most_once_a_second_and_the_last_at_the_end(rb, r):
    clock = Clock()
    tracker = Tracker(rb, K, "j1", clock=clock, monotonic=clock)
    rb.config_resetstat()
    start = clock.now
    for i in range(3_500):  # 1,000 reports a second for 3.5 s
        clock.now = start + i / 1000
        tracker.update(i, 3_500, f"row {i}")
        tracker.flush()
    assert hset_calls(rb) == 4  # at 0, 1, 2 and 3 s
    assert r.hget(K.progress("j1"), "done") == "3000"
    tracker.flush(force=True)  # (the run's end)
    assert r.hgetall(K.progress("j1"))["done"] == "3499" and r.hget(K.progress("j1"), "note") == "row 3499"
    assert hset_calls(rb) == 5
    tracker.flush(force=True)  # nothing unwritten: no write
    assert hset_calls(rb) == 5


def test_a_report_rides_a_checkpoints_pipeline_with_its_ttl(rb, r):
    clock = Clock()
    tracker = Tracker(rb, K, "j2", clock=clock, monotonic=clock)
    tracker.update(0, 200)
    clock.now += 10
    tracker.update(50, 200, "halfway there? no: a quarter")
    assert tracker.due()
    pipe = rb.pipeline(transaction=False)
    pipe.set("checkpoint", "cursor")
    tracker.queue(pipe)
    assert not tracker.due()  # (marked written)
    pipe.execute()
    stored = r.hgetall(K.progress("j2"))
    assert stored["done"] == "50" and stored["total"] == "200" and stored["note"] == "halfway there? no: a quarter"
    assert float(stored["eta"]) == pytest.approx(30.0)  # 150 left at 50 per 10 s
    assert float(stored["started"]) == float(stored["updated"]) - 10
    assert 0 < r.ttl(K.progress("j2")) <= tracking.TTL
    tracker.queue(rb.pipeline())  # nothing unwritten: nothing added
    clock.now += 5
    tracker.update(50, 200)  # no item since: the rate of the run so far still holds
    tracker.flush(force=True)
    assert float(r.hget(K.progress("j2"), "eta")) == pytest.approx(150 * 15 / 50)


def test_a_resumed_run_keeps_the_first_start_and_its_eta_counts_only_its_own_rate(rb, r):
    clock = Clock()
    first = Tracker(rb, K, "j3", clock=clock, monotonic=clock)
    first.update(100, 1_000)
    first.flush()
    started = r.hget(K.progress("j3"), "started")
    clock.now += 3_600  # an hour waiting for its retry: not slow progress
    second = Tracker(rb, K, "j3", clock=clock, monotonic=clock)
    second.update(100, 1_000)
    clock.now += 9
    second.update(190, 1_000)
    second.flush()
    stored = r.hgetall(K.progress("j3"))
    assert stored["started"] == started and stored["done"] == "190"
    assert float(stored["eta"]) == pytest.approx(810 * 9 / 90)


def test_without_a_total_or_before_any_item_moved_there_is_no_eta(rb):
    clock = Clock()
    tracker = Tracker(rb, K, "j4", clock=clock, monotonic=clock)
    tracker.update(5)
    clock.now += 1
    tracker.update(9, note="no total known")
    tracker.flush()
    assert api.get_progress("j4") == Progress(9, None, "no total known", None, None,
                                              api.get_progress("j4").updated_at)  # type: ignore[union-attr]
    other = Tracker(rb, K, "j5", clock=clock, monotonic=clock)
    other.update(3, 10)
    other.flush()
    assert api.get_progress("j5").eta is None  # type: ignore[union-attr]


def test_bad_values_are_refused_naming_the_problem_and_a_long_note_is_clipped(rb):
    tracker = Tracker(rb, K, "j6")
    for done, total, note, said in ((-1, None, "", "done must be a finite number >= 0"),
                                    (float("nan"), None, "", "done must be"), (True, None, "", "done must be"),
                                    ("3", None, "", "done must be"), (1, 0, "", "total must be None"),
                                    (1, -5, "", "total must be None"), (1, float("inf"), "", "total must be None"),
                                    (1, None, b"bytes", "note must be text"), (1, None, None, "note must be text")):
        with pytest.raises(ValueError, match=said):
            tracker.update(done, total, note)  # type: ignore[arg-type]
    assert not tracker.unwritten
    tracker.update(12, 10, "é" * 500 + "\ud800")  # (past its total: the fraction stops at 1)
    tracker.flush()
    report = api.get_progress("j6")
    assert report is not None and report.note == "é" * tracking.NOTE_MAX and report.fraction == 1.0


def test_a_write_that_fails_is_logged_once_never_raised_and_written_when_redis_answers(caplog):
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    clock = Clock()
    tracker = Tracker(away, K, "j7", clock=clock, monotonic=clock)
    with caplog.at_level(logging.DEBUG, logger="django_cogworker.features.progress.tracker"):
        for _ in range(3):
            tracker.update(1, 2)
            tracker.flush(force=True)
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not write its progress" in warnings[0].getMessage()
    assert tracker.unwritten  # (kept for the next write)


# -- Job.progress on the job's path --------------------------------------------------------------


class Reports(Job):
    retry = 3

    def retry_in(self, count: int, exc: BaseException) -> float | None:
        return 0  # (due at once: the test sweeps it back to its queue)

    def perform(self, token: str, fail: bool, reports: list[list[Any]]) -> None:
        for done, total, note in reports:
            self.progress(done, total, note)
        SEEN[token] = api.get_progress(self.jid)  # type: ignore[arg-type]
        if fail:
            raise RuntimeError("failed after its reports")


class Dies(Reports):
    retry = False


def test_progress_is_readable_while_the_job_runs_and_gone_once_it_succeeded(make_processor):
    called = make_processor()
    run = called.run(Reports, "ok", False, [[0, 4, "start"], [1, 4, "first"]])
    report = SEEN["ok"]
    assert (report.done, report.total, report.note, report.fraction) == (0, 4, "start", 0.0)  # (the 1st a second)
    assert run.decision.outcome is Outcome.SUCCESS
    assert api.get_progress(run.jid) is None and not called.redis.exists(K.progress(run.jid))


def test_the_last_report_is_written_at_a_failure_and_kept_for_the_retry_which_deletes_it_at_its_success(
        make_processor, r):
    called = make_processor()
    run = called.run(Reports, "retried", True, [[0, 10, "start"], [7, 10, "the last one"]])
    assert run.decision.outcome is Outcome.RETRY
    report = api.get_progress(run.jid)
    assert report is not None and (report.done, report.total, report.note) == (7, 10, "the last one")
    assert 0 < r.ttl(K.progress(run.jid)) <= tracking.TTL
    # Its retry reports nothing and succeeds: what the first run left is deleted all the same.
    entry = json.loads(r.zrange(K.retry, 0, -1)[0])
    entry["args"] = ["retried-again", False, []]
    r.delete(K.retry)
    r.lpush(K.queue("default"), payloads.encode(entry))
    again = called.run_next()
    assert again is not None and again.decision.outcome is Outcome.SUCCESS
    assert SEEN["retried-again"].note == "the last one"  # (it saw the first run's while it ran)
    assert not r.exists(K.progress(run.jid))


def test_a_job_dead_for_good_loses_its_progress(make_processor, r):
    called = make_processor()
    run = called.run(Dies, "dies", True, [[3, 9, "about to fail"]])
    assert run.decision.outcome is Outcome.DEAD and not r.exists(K.progress(run.jid))


def test_a_job_killed_from_its_retry_set_loses_its_progress(make_processor, r):
    called = make_processor()
    run = called.run(Reports, "killed", True, [[2, 5, "x"]])
    assert r.exists(K.progress(run.jid))
    entry = api.RetrySet().entry(run.jid)
    assert entry is not None and entry.kill()
    assert not r.exists(K.progress(run.jid))


def test_a_job_that_reports_nothing_pays_no_round_trip_for_progress(make_processor, monkeypatch):
    called = make_processor()
    called.push(Reports, "quiet", False, [])
    trips = round_trips(monkeypatch)
    run = called.run_next()
    with_none = trips["n"]
    assert run is not None and run.decision.outcome is Outcome.SUCCESS
    called.push(Reports, "loud", False, [[1, 2, ""]])
    trips["n"] = 0
    called.run_next()
    assert trips["n"] == with_none + 2  # (its write; the delete at its success)


def test_outside_a_run_a_report_is_checked_and_does_nothing(r):
    job = Reports({"jid": "by-hand"})
    job.progress(1, 2, "nobody runs me")
    with pytest.raises(ValueError, match="total must be None"):
        job.progress(1, 0)
    assert current() is None and not r.exists(K.progress("by-hand"))


def test_get_progress_is_public_and_none_for_a_job_without_progress(r):
    assert django_cogworker.get_progress is api.get_progress
    assert api.get_progress("nobody") is None
    r.hset(K.progress("hand"), mapping={"done": "2.5", "total": "10", "note": "<b>", "updated": "1700000000.5",
                                        "started": "1700000000", "eta": "30.000"})
    report = api.get_progress("hand")
    assert report is not None and report.percent == 25 and report.eta == 30.0 and report.note == "<b>"
    assert report.as_dict() == {"done": 2.5, "total": 10, "note": "<b>", "fraction": 0.25, "eta": 30.0,
                                "updated_at": 1700000000.5}
    r.set(K.progress("wrong"), "a string")
    assert api.progress_of(["hand", "wrong", None, "nobody"]) == {"hand": report, "wrong": None, "nobody": None}


# -- cogworker busy ------------------------------------------------------------------------------


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("cogworker", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


class Listed(Job):
    """Reports, then lists the running jobs as ``cogworker busy`` does, its process written as a
    beat writes it (the processes set; the workers hash from the processor's ledger) beside a
    thread running a job that reports nothing."""

    def perform(self, token: str, identity: str) -> None:
        self.progress(40, 100, "rows of <shop>")
        client = runtime.get_redis()
        quiet = payloads.encode({"jid": "quiet-one", "class": "x.Y", "args": [], "queue": "mail"})
        workers = {**SEEN.pop("ledger").workers_snapshot(),
                   "processor-9": json.dumps({"queue": "mail", "payload": quiet, "run_at": time.time()})}
        client.sadd(K.processes, identity)
        client.hset(K.workers(identity), mapping=workers)
        SEEN[token] = (cli("busy", "--json"), cli("busy"))


def test_cogworker_busy_lists_each_running_job_with_its_progress_or_null(make_processor):
    called = make_processor()
    SEEN["ledger"] = called.processor.ledger
    run = called.run(Listed, "busy", called.identity)
    assert run.decision.outcome is Outcome.SUCCESS, run.error
    document, text = SEEN["busy"]
    items = {item["jid"]: item for item in json.loads(document)["items"]}
    assert set(items) == {run.jid, "quiet-one"}
    progress = items[run.jid]["progress"]
    assert progress["done"] == 40 and progress["total"] == 100 and progress["note"] == "rows of <shop>"
    assert progress["fraction"] == 0.4 and progress["eta"] is None and progress["updated_at"] > 0
    assert items[run.jid]["class"] == Listed.name and items["quiet-one"]["progress"] is None
    header, *rows = text.splitlines()
    assert header.split()[-1] == "PROGRESS"
    assert next(row for row in rows if run.jid in row).endswith("40/100 40%")
    assert next(row for row in rows if "quiet-one" in row).endswith(" -")


def test_the_busy_page_reads_every_rows_progress_in_one_round_trip(admin_client, rb, monkeypatch):
    def trips_for(rows: int) -> int:
        rb.flushdb()
        rb.sadd(K.processes, "host:1:abc")
        for n in range(rows):
            jid = f"job-{n}"
            payload = payloads.encode({"jid": jid, "class": "x.Y", "args": [], "queue": "default"})
            rb.hset(K.workers("host:1:abc"), f"processor-{n}",
                    json.dumps({"queue": "default", "payload": payload, "run_at": time.time()}))
            rb.hset(K.progress(jid), mapping={"done": n, "total": rows, "note": f"note {n}", "updated": time.time(),
                                              "eta": "65"})
        trips = round_trips(monkeypatch)
        page = admin_client.get("/admin/django_cogworker/busy/")
        assert page.status_code == 200
        html = page.content.decode()
        assert html.count('class="cw-job-progress"') == rows and f"note {rows - 1}" in html and "ETA 1m 5s" in html
        return trips["n"]

    assert trips_for(1) == trips_for(6)


# -- the test helpers and tasks ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [testing.fake, testing.inline])
def test_under_the_helpers_each_report_is_recorded_and_nothing_is_written(mode, rb):
    with mode() as jobs:
        jid = Reports.perform_async("helped", False, [[0, 3, "a"], [1, 3, "b"], [3, 3, "c"]])
        if isinstance(jobs, testing.FakeJobs):
            jobs.drain()
        reports = jobs.progress(jid)  # type: ignore[arg-type]
    assert [(p.done, p.total, p.note, p.fraction) for p in reports] == [(0, 3, "a", 0.0), (1, 3, "b", 1 / 3),
                                                                        (3, 3, "c", 1.0)]
    assert rb.keys("*progress*") == []
    with testing.fake() as jobs, pytest.raises(ValueError, match="done must be"):
        Reports.perform_async("helped", False, [[-1, None, ""]])
        jobs.drain()


def test_a_task_reports_through_report_progress_and_reads_none_once_finished(make_processor, r, monkeypatch):
    from django_cogworker.tasks import task_progress
    from testproject.demo.tasks import counting

    with testing.inline() as jobs:
        result = counting.enqueue("counted", 3)
    assert [p.note for p in jobs.progress(result.id)] == ["step 1", "step 2", "step 3"]
    called = make_processor()
    result = counting.enqueue("counted", 5)
    real_delete, before_delete = Tracker.delete, []

    def delete(tracker: Tracker) -> None:  # (what its run wrote, seen just before its success deletes it)
        before_delete.append(task_progress(tracker.jid))
        real_delete(tracker)

    monkeypatch.setattr(Tracker, "delete", delete)
    run = called.run_next()
    assert run is not None and run.decision.outcome is Outcome.SUCCESS and r.lrange("counted", 0, -1) == ["done"] * 2
    [report] = before_delete  # (its first report, or a later one if a second passed between them)
    assert report is not None and report.total == 5 and report.note == f"step {report.done}"
    assert task_progress(result) is None and task_progress(result.id) is None
    r.hset(K.progress(result.id), mapping={"done": "5", "total": "5"})
    report = task_progress(result)
    assert report is not None and report.fraction == 1.0


class Twice(Job):
    def perform(self) -> None:
        first = current(self.payload)
        SEEN["twice"] = (first, current(), _scope.running.get().extras["progress"])  # type: ignore[union-attr]


def test_a_run_finds_its_tracker_made_once(make_processor):
    called = make_processor()
    called.run(Twice)
    first, again, kept = SEEN["twice"]
    assert isinstance(first, Tracker) and first is again is kept
