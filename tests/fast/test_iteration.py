"""Iterable jobs on a worker's path (django_cogworker/features/iteration/): a processor called on the
test's thread (``make_processor``) runs each job, against the suite's Redis. Every test job records
each item it does (``RUNS[token]``), so "no item twice" and "none left out" are read off the record.

A worker's TERM is the called processor's stopping event (``called.stopping``), set from inside an
item as a TERM lands while one runs: the run ends after it, and the job waits in the schedule, due
now, for ``called.sweep()`` (the poller's round) to put it back in its queue.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from engine_fixtures import (  # noqa: F401 - the make_processor and launcher_factory fixtures
    GATES,
    RUNS,
    launcher_factory_fixture,
    make_processor_fixture,
    new_token,
)

from django_cogworker import Batch, ConfigError, InvalidArgument, IterableJob, Limiter, testing
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.engine.run.timeouts import Timeouts
from django_cogworker.features import Outcome
from django_cogworker.features.iteration import IterationError
from django_cogworker.features.iteration.hook import Iteration
from django_cogworker.features.iteration.state import ENDED_KEEP
from django_cogworker.outbox.models import OutboxJob
from django_cogworker.push import runtime
from django_cogworker.push import scope as _scope
from testproject.demo.jobs import BatchCallbackJob
from testproject.demo.models import Receipt

K = Keys()
# (token, item) -> what the job does once that item is done (set the stopping event, raise...)
ACTIONS: dict[tuple[str, Any], Callable[[Any], None]] = {}
SEEN: dict[str, list[Any]] = {}  # token -> what a job saw of its state while it ran


def at(token: str, item: Any, action: Callable[[Any], None]) -> None:
    ACTIONS[(token, item)] = action


class Walk(IterableJob):
    """Walks range(n), recording each number; its hooks recorded too."""

    retry = 3
    iteration_checkpoint = 1000.0  # (saved at its ends only, unless a test's class says otherwise)

    def build_enumerator(self, token, n, cursor=None):
        return self.range_enumerator(n, cursor=cursor)

    def each_iteration(self, number, token, n):
        RUNS[token].append(number)
        action = ACTIONS.pop((token, number), None)
        if action is not None:
            action(self)

    def token(self):
        return (self.arguments[0] if self.arguments else self.payload["args"])[0]  # (clear, sealed or not)

    def retry_in(self, count, exc):
        return 0  # (due at once: the test sweeps it back)

    def on_start(self):
        RUNS[self.token() + ":hooks"].append("start")

    def on_resume(self):
        RUNS[self.token() + ":hooks"].append(f"resume@{self.cursor}")

    def on_stop(self):
        RUNS[self.token() + ":hooks"].append("stop")

    def on_complete(self):
        RUNS[self.token() + ":hooks"].append("complete")

    def on_cancel(self):
        RUNS[self.token() + ":hooks"].append("cancel")


class Rows(Walk):
    """Walks the demo's receipts on one database, by primary key, two a query."""

    def build_enumerator(self, token, alias, cursor=None):
        return self.queryset_enumerator(Receipt.objects.using(alias).all(), cursor=cursor, batch_size=2)

    def each_iteration(self, row, token, alias):
        super().each_iteration(row.pk, token, alias)


class EveryThree(Walk):
    checkpoint_every = 3


class Saving(Walk):
    iteration_checkpoint = 1e-9  # (every item's end is past it: a save after each)


def saved(r, jid: str) -> dict[str, str]:
    return r.hgetall(K.iteration(jid))


def scheduled(r) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(raw), score) for raw, score in r.zrange(K.schedule, 0, -1, withscores=True)]


def stop_worker(called):
    return lambda job: called.stopping.set()


def resume(called):
    """The worker's next life: its stopping event clear, the schedule swept into the queue, the job run."""
    called.stopping.clear()
    assert called.sweep() == 1
    return called.run_next()


# -- a TERM between two items -----------------------------------------------------------------------


def test_a_stopping_worker_ends_the_run_after_its_item_and_the_job_resumes_after_it(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 3, stop_worker(called))

    run = called.run(Walk, token, 10)

    jid = run.payload["jid"]
    assert RUNS[token] == [0, 1, 2, 3]  # (the item running when it stopped finished; none after it)
    assert run.decision.outcome is Outcome.RESCHEDULED and called.ends() == ["schedule"]
    assert saved(r, jid)["cursor"] == "3" and saved(r, jid)["done"] == "4"
    [(payload, due)] = scheduled(r)
    assert payload["jid"] == jid and due <= time.time()  # (due now: back to its queue at the poller's round)
    assert called.clear()  # (settled: nothing left on the in-progress list)

    second = resume(called)

    assert RUNS[token] == list(range(10))  # every item once, across the TERM
    assert second.payload["jid"] == jid and second.decision.outcome is Outcome.SUCCESS
    assert RUNS[token + ":hooks"] == ["start", "stop", "resume@3", "stop", "complete"]
    # Done: its state kept a while only, at its end: run again as after a kill -9 that came before its
    # ack landed (the ack rides the next fetch), it does no item again.
    assert 0 < r.ttl(K.iteration(jid)) <= ENDED_KEEP
    r.lpush(K.queue(second.payload["queue"]), second.raw)
    third = called.run_next()
    assert third.decision.outcome is Outcome.SUCCESS and RUNS[token] == list(range(10))


def test_a_run_sent_back_to_the_schedule_wakes_the_poller_and_a_hint_that_raises_is_logged_naming_it(
        make_processor, r, caplog):
    called = make_processor()
    told: list[float] = []
    called.retry.on_retry = told.append  # (the Launcher's: its poller's ``expect``)
    token = new_token()
    at(token, 1, stop_worker(called))
    run = called.run(Walk, token, 10)
    [(_, due)] = scheduled(r)
    assert run.decision.outcome is Outcome.RESCHEDULED and told == [pytest.approx(due)]

    def gone(due):
        raise RuntimeError("the poller is gone")

    called.retry.on_retry = gone
    called.stopping.clear()
    other = new_token()
    at(other, 1, stop_worker(called))
    with caplog.at_level(logging.ERROR):
        run = called.run(Walk, other, 10)
    assert run.decision.outcome is Outcome.RESCHEDULED and len(scheduled(r)) == 2
    assert f"on_retry hook failed for jid={run.jid}" in caplog.text


def test_a_stopping_worker_before_the_first_item_runs_none(make_processor, r):
    called, token = make_processor(), new_token()
    called.stopping.set()

    run = called.run(Walk, token, 3)

    assert RUNS[token] == [] and run.decision.outcome is Outcome.RESCHEDULED
    assert resume(called).decision.outcome is Outcome.SUCCESS and RUNS[token] == [0, 1, 2]


def test_a_stopped_run_that_did_an_item_counts_its_orphanings_afresh(make_processor, r):
    # A long walk recovered after kill -9s (orphan recovery counts them in its payload) that does
    # an item and is sent back at a TERM: its count starts again, or MAX_ORPHANINGS + 1 deploys over
    # its life sent it dead while it progressed. One sent back before any item keeps its count.
    called, token = make_processor(), new_token()
    for items in (3, 0):
        payload = Walk.set(queue="default").build([token, items], {})
        payload["orphan_count"] = 2
        r.lpush(K.queue("default"), json.dumps(payload))
        if not items:
            called.stopping.set()
        else:
            at(token, 1, stop_worker(called))
        assert called.run_next().decision.outcome is Outcome.RESCHEDULED
        [(rescheduled, _due)] = scheduled(r)
        assert rescheduled.get("orphan_count") == (2 if not items else None)
        r.delete(K.schedule)
        called.stopping.clear()


def test_a_job_stopped_again_and_again_does_each_item_once(make_processor, r):
    called, token = make_processor(), new_token()
    for number in (0, 4, 5, 8):
        at(token, number, stop_worker(called))

    outcomes = [called.run(Walk, token, 10).decision.outcome]
    while outcomes[-1] is Outcome.RESCHEDULED:
        outcomes.append(resume(called).decision.outcome)

    assert RUNS[token] == list(range(10))
    assert outcomes == [Outcome.RESCHEDULED] * 4 + [Outcome.SUCCESS]


def test_the_rescheduled_payload_keeps_its_jid_and_loses_its_expiry(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 1, stop_worker(called))

    run = called.run(Walk, token, 5, expires_in=60)

    [(payload, _due)] = scheduled(r)
    # (Measured from its first push, and only until it began: a job that began is never dropped as expired.)
    assert payload["jid"] == run.payload["jid"] and "expires_at" in run.payload and "expires_at" not in payload
    assert resume(called).decision.outcome is Outcome.SUCCESS and RUNS[token] == list(range(5))


# -- checkpoints ------------------------------------------------------------------------------------


def _saved_at_each_item(r, token: str, cls: type[Walk], n: int) -> list[str | None]:
    for number in range(n):
        at(token, number, lambda job: SEEN.setdefault(token, []).append(r.hget(K.iteration(job.jid), "cursor")))
    return SEEN.setdefault(token, [])


def test_a_run_saves_its_cursor_no_sooner_than_its_checkpoint_interval(make_processor, r):
    called, token = make_processor(), new_token()
    seen = _saved_at_each_item(r, token, Walk, 6)

    called.run(Walk, token, 6)

    assert seen == [None] * 6  # (1,000 s between two saves: none while it ran, each item read before its own)


def test_a_run_saves_its_cursor_once_its_checkpoint_interval_passed(make_processor, r):
    called, token = make_processor(), new_token()
    seen = _saved_at_each_item(r, token, Saving, 5)

    called.run(Saving, token, 5)

    assert seen == [None, "0", "1", "2", "3"]  # (read during each item: the save of the one before)


def test_checkpoint_every_n_items(make_processor, r):
    called, token = make_processor(), new_token()
    seen = _saved_at_each_item(r, token, EveryThree, 8)

    called.run(EveryThree, token, 8)

    assert seen == [None, None, None, "2", "2", "2", "5", "5"]


def test_the_setting_is_the_default_interval(make_processor, r):
    class Default(Walk):
        iteration_checkpoint = None

    called, token = make_processor(ITERATION_CHECKPOINT=1e-9), new_token()
    seen = _saved_at_each_item(r, token, Default, 3)

    called.run(Default, token, 3)

    assert seen == [None, "0", "1"]


# -- a failure -------------------------------------------------------------------------------------


def test_an_item_that_raises_saves_the_last_item_done_and_its_retry_resumes_there(make_processor, r):
    called, token = make_processor(), new_token()

    def boom(job):
        raise ValueError("item 4 broke")

    at(token, 4, boom)

    run = called.run(Walk, token, 7)

    assert run.decision.outcome is Outcome.RETRY and isinstance(run.error, ValueError)
    assert saved(r, run.payload["jid"])["cursor"] == "3"
    assert called.sweep() == 1
    assert called.run_next().decision.outcome is Outcome.SUCCESS
    # (4 raised and was done again, as a failed item is; nothing before it was)
    assert RUNS[token] == [0, 1, 2, 3, 4, 4, 5, 6]
    assert RUNS[token + ":hooks"] == ["start", "resume@3", "stop", "complete"]


def test_a_job_dead_for_good_keeps_its_cursor_for_the_dead_sets_retention(make_processor, r):
    class Once(Walk):
        retry = 0

    called, token = make_processor(DEAD_TIMEOUT=5000), new_token()
    at(token, 2, lambda job: 1 / 0)

    run = called.run(Once, token, 5)

    jid = run.payload["jid"]
    assert run.decision.outcome is Outcome.DEAD and called.ends() == ["dead"]
    assert saved(r, jid)["cursor"] == "1" and 4000 < r.ttl(K.iteration(jid)) <= 5000
    # Retried from dead (the admin's "retry": back to its queue as it is): it resumes.
    [raw] = r.zrange(K.dead, 0, -1)
    r.zrem(K.dead, raw)
    r.lpush(K.queue("default"), raw)
    assert called.run_next().decision.outcome is Outcome.SUCCESS
    assert RUNS[token] == [0, 1, 2, 2, 3, 4]


# -- throttles and time limits -----------------------------------------------------------------------

HELD: dict[str, bool] = {}


class Throttled(Walk):
    throttle_on = [(lambda job: HELD.get(job.payload["args"][0], False), 30)]


def test_a_throttle_that_holds_sends_the_job_to_the_schedule_after_its_backoff(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 2, lambda job: HELD.__setitem__(token, True))

    before = time.time()
    run = called.run(Throttled, token, 6)

    assert RUNS[token] == [0, 1, 2] and run.decision.outcome is Outcome.RESCHEDULED
    [(payload, due)] = scheduled(r)
    assert before + 30 <= due <= time.time() + 30
    # The thread is given back: the run ended, and the processor takes the next job.
    assert not called.processor.ledger.busy and called.clear()
    other = new_token()
    called.run(Walk, other, 2)
    assert RUNS[other] == [0, 1]
    # Once due and the condition gone, it resumes after its last item.
    HELD[token] = False
    r.zadd(K.schedule, {r.zrange(K.schedule, 0, 0)[0]: time.time()})
    assert called.sweep() == 1 and called.run_next().decision.outcome is Outcome.SUCCESS
    assert RUNS[token] == list(range(6))


def test_a_limiter_throttle_takes_a_place_per_item_and_reschedules_when_refused(make_processor, r):
    # (A bucket of 1e8 s: a minute's would fill afresh if the test crossed its end, and say "in 0.2 s" near it.)
    limiter = Limiter.bucket(f"iteration-test-{new_token()}", 3, per=1e8)

    class Limited(Walk):
        throttle_on = [limiter]

    called, token = make_processor(), new_token()

    run = called.run(Limited, token, 5)

    assert RUNS[token] == [0, 1, 2] and run.decision.outcome is Outcome.RESCHEDULED
    [(_payload, due)] = scheduled(r)
    assert due > time.time() + 1  # (the bucket's next place: when it ends, not now)
    assert saved(r, run.payload["jid"])["cursor"] == "2"


def test_max_iteration_runtime_sends_the_job_back_with_its_cursor(make_processor, r):
    class Short(Walk):
        max_iteration_runtime = 1e-9  # (past after any item: one item a run)

    called, token = make_processor(), new_token()
    runs = [called.run(Short, token, 3)]
    while runs[-1].decision.outcome is Outcome.RESCHEDULED:
        runs.append(resume(called))

    assert RUNS[token] == [0, 1, 2] and len(runs) == 4  # (the fourth finds nothing left, and completes)


# -- cancellation ----------------------------------------------------------------------------------


def test_a_cancelled_job_stops_at_the_next_item_calls_on_cancel_and_is_dead(make_processor, r):
    called, token = make_processor(), new_token()

    def cancelled(job):
        _scope.running.get().cancelled = True  # (what the heartbeat does for a cancel request)

    at(token, 1, cancelled)

    run = called.run(Walk, token, 5)

    assert RUNS[token] == [0, 1]
    assert run.decision.outcome is Outcome.DEAD and called.ends() == ["ack"]  # (never retried)
    assert RUNS[token + ":hooks"] == ["start", "stop", "cancel"]
    assert 0 < r.ttl(K.iteration(run.payload["jid"])) <= ENDED_KEEP  # (ended: kept a while only)


# -- bad input -------------------------------------------------------------------------------------


class NotPairs(IterableJob):
    retry = 1

    def build_enumerator(self, cursor=None):
        return iter([1, 2, 3])

    def each_iteration(self, item):
        pass


class BadCursor(IterableJob):
    retry = 1

    def build_enumerator(self, cursor=None):
        return iter([("a", {1, 2})])

    def each_iteration(self, item):
        pass


@pytest.mark.parametrize(("job", "said"), [(NotPairs, "yielded 1, not an (item, cursor) pair"),
                                           (BadCursor, "a cursor JSON can't hold: {1, 2}")])
def test_an_enumerator_that_yields_what_it_must_not_fails_the_job_naming_it(make_processor, job, said):
    run = make_processor().run(job)

    assert isinstance(run.error, IterationError) and said in str(run.error)
    assert run.decision.outcome is Outcome.RETRY  # (failed as any job: retry, then dead)


def test_an_iterable_job_that_defines_perform_fails_at_its_first_run_naming_it(make_processor, caplog):
    with caplog.at_level(logging.WARNING):
        class Performs(IterableJob):
            def perform(self):
                RUNS["performs"].append("ran")

    assert "defines perform()" in caplog.text

    run = make_processor().run(Performs)

    assert isinstance(run.error, IterationError) and "Performs defines perform()" in str(run.error)
    assert RUNS["performs"] == [] and run.decision.outcome is Outcome.RETRY


# -- the other features ------------------------------------------------------------------------------


def test_a_unique_job_keeps_its_lock_across_its_reschedules(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 1, stop_worker(called))

    run = called.run(Walk, token, 4, unique_for=600)

    lock = K.unique(run.payload["unique_digest"])
    assert run.decision.outcome is Outcome.RESCHEDULED and r.exists(lock)
    assert called.push(Walk, token, 4, unique_for=600) is not None  # (built, but refused by the lock:)
    assert called.waiting() == 0
    assert resume(called).decision.outcome is Outcome.SUCCESS and not r.exists(lock)


def test_a_sealed_jobs_cursor_is_sealed(make_processor, r, settings):
    called, token = make_processor(ENCRYPTION_KEYS=settings.COGWORKER["ENCRYPTION_KEYS"]), new_token()
    at(token, 2, stop_worker(called))

    run = called.run(Walk, token, 5, encrypt=True)

    cursor = saved(r, run.payload["jid"])["cursor"]
    assert "encrypted" in run.payload and cursor.startswith("v1.") and "2" != cursor
    assert resume(called).decision.outcome is Outcome.SUCCESS and RUNS[token] == list(range(5))


def test_a_sealed_cursor_copied_to_another_job_does_not_open(make_processor, r, settings):
    called = make_processor(ENCRYPTION_KEYS=settings.COGWORKER["ENCRYPTION_KEYS"])
    first, second = new_token(), new_token()
    at(first, 1, stop_worker(called))
    run = called.run(Walk, first, 5, encrypt=True)
    called.stopping.clear()
    other = called.push(Walk, second, 5, encrypt=True)
    r.hset(K.iteration(other["jid"]), "cursor", saved(r, run.payload["jid"])["cursor"])
    r.delete(K.schedule)

    failed = called.run_next()

    assert isinstance(failed.error, IterationError) and "saved cursor can't be read" in str(failed.error)
    assert RUNS[second] == []


def test_a_timeout_is_armed_anew_for_each_item(make_processor, r):
    class Timed(Walk):
        timeout = 30

    called, token = make_processor(), new_token()
    at(token, 0, lambda job: SEEN.setdefault(token, []).append(callable(_scope.running.get().extras.get("timeout"))))

    assert called.run(Timed, token, 2).decision.outcome is Outcome.SUCCESS
    assert SEEN[token] == [True]


def test_a_batch_counts_an_iterable_job_once_and_calls_back_when_it_completes(make_processor, r):
    called, token, key = make_processor(), new_token(), f"iteration-batch-{new_token()}"
    at(token, 1, stop_worker(called))
    batch = Batch()
    batch.on("success", BatchCallbackJob, key=key)
    with batch.jobs():
        Walk.perform_async(token, 4)

    assert called.run_next().decision.outcome is Outcome.RESCHEDULED
    assert Batch.status(batch.bid)["pending"] == 1 and called.waiting() == 0  # (no callback yet)

    assert resume(called).decision.outcome is Outcome.SUCCESS
    assert Batch.status(batch.bid)["pending"] == 0
    [callback] = called.drain()  # (its one callback, delivered once)
    assert callback.payload["class"] == BatchCallbackJob.name and r.lrange(key, 0, -1) != []
    assert RUNS[token] == [0, 1, 2, 3]


@pytest.mark.django_db(databases=["default", "pg"])
@pytest.mark.parametrize("db_alias", ["default", "pg"])
def test_a_queryset_job_stopped_by_a_term_resumes_after_its_last_row(make_processor, r, db_alias):
    rows = [Receipt.objects.using(db_alias).create(order_id=i, sent_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
            for i in range(7)]
    called, token = make_processor(), new_token()
    at(token, rows[2].pk, stop_worker(called))

    run = called.run(Rows, token, db_alias)

    assert RUNS[token] == [row.pk for row in rows[:3]] and run.decision.outcome is Outcome.RESCHEDULED
    assert saved(r, run.payload["jid"])["cursor"] == str(rows[2].pk)
    assert resume(called).decision.outcome is Outcome.SUCCESS
    assert RUNS[token] == [row.pk for row in rows]


def test_its_progress_rides_its_checkpoint_with_the_enumerators_length(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 3, stop_worker(called))

    run = called.run(Walk, token, 8)

    progress = r.hgetall(K.progress(run.payload["jid"]))
    assert progress["done"] == "4" and progress["total"] == "8"


def test_its_progress_is_written_on_its_own_between_checkpoints_further_apart_than_a_second(make_processor, r):
    # Walk saves at its ends only (iteration_checkpoint 1000 s): the bar moved only at the end.
    called, token = make_processor(), new_token()
    seen: list[Any] = []
    at(token, 2, lambda job: seen.append(r.hget(K.progress(job.jid), "done")))

    called.run(Walk, token, 5)

    assert seen == ["1"]  # (the first report written at once; the next not before a second)


# -- the setting, the startup warning, the timeout's re-arm -----------------------------------------


@pytest.mark.parametrize("value", [0, -1, "1", None])
def test_a_bad_iteration_checkpoint_setting_is_refused_at_startup_naming_it(value):
    with pytest.raises(ConfigError, match=r'COGWORKER\["ITERATION_CHECKPOINT"\] must be a positive number'):
        build_config({"ITERATION_CHECKPOINT": value})


def test_a_bad_class_option_is_refused_as_the_class_is_defined():
    with pytest.raises(InvalidArgument, match=r"Bad.checkpoint_every must be a whole number above 0"):
        class Bad(Walk):
            checkpoint_every = 0
    with pytest.raises(InvalidArgument, match=r"throttle_on\[0\]'s condition must be a callable or a Limiter"):
        class Worse(Walk):
            throttle_on = [("lag", 5)]
    # (A backoff of 0: a job throttled again at once, begun, enumerated and counted as fast as the
    # poller woke for it, for as long as its condition held.)
    with pytest.raises(InvalidArgument, match=r"throttle_on\[0\]'s backoff must be at least 1 seconds, got 0"):
        class Spinning(Walk):
            throttle_on = [(lambda: True, 0)]


def test_a_worker_warns_at_startup_of_a_class_whose_longest_iteration_is_past_the_shutdown_timeout(
        make_processor, r, caplog):
    config = make_processor(SHUTDOWN_TIMEOUT=25).config
    r.hset(K.iteration_longest, mapping={"shop.jobs.Reindex": "41.5", "shop.jobs.Quick": "0.2"})

    with caplog.at_level(logging.WARNING, logger="django_cogworker.features.iteration.hook"):
        Iteration(r, K, config).start()

    [record] = caplog.records
    assert "shop.jobs.Reindex" in record.message and "41.5s" in record.message and "(25.0s)" in record.message


def test_a_run_records_its_classs_longest_iteration(make_processor, r):
    class Slow(Walk):
        name = f"iteration-slow-{new_token()}"

    called, token = make_processor(), new_token()
    at(token, 1, lambda job: time.sleep(0.02))

    called.run(Slow, token, 3)

    assert float(r.hget(K.iteration_longest, Slow.name)) >= 0.02


def test_a_timeout_rearmed_is_watched_for_its_whole_length_from_then():
    now = [100.0]
    timeouts = Timeouts(clock=lambda: now[0])
    token = timeouts.arm(5.0, "j")
    now[0] = 104.0

    timeouts.rearm(token)

    assert timeouts._check(now[0]) == pytest.approx(5.0)  # (due 5 s from the re-arm, not 1 s)


def test_the_test_helpers_run_an_iterable_job_to_its_end_in_one_go_and_write_no_state(r):
    token = new_token()

    with testing.fake() as jobs:
        Walk.perform_async(token, 4)
        assert jobs.drain() == 1

    assert RUNS[token] == [0, 1, 2, 3] and RUNS[token + ":hooks"] == ["start", "stop", "complete"]
    assert r.keys("*iteration*") == []


def test_a_periodic_runs_lock_is_held_while_it_waits_between_two_runs(make_processor, r):
    called, token = make_processor(), new_token()
    at(token, 1, stop_worker(called))
    payload = Walk.set().build([token, 4], {})
    payload["periodic_pjid"] = pjid = f"nightly-{token}"
    lock = K.periodic_running(pjid)
    r.set(lock, payload["jid"], ex=300)  # (as the ticker's claim takes it)
    called.client.push(payload)

    assert called.run_next().decision.outcome is Outcome.RESCHEDULED
    # (Held for its wait: the entry's next slot doesn't start a second run beside it.)
    assert r.get(lock) == payload["jid"] and r.ttl(lock) > 300

    assert resume(called).decision.outcome is Outcome.SUCCESS and not r.exists(lock)


# -- a worker's stop ---------------------------------------------------------------------------------


class Slowly(IterableJob):
    """Walks range(n) a few milliseconds an item, recording each; opens its gate at item 2."""

    def build_enumerator(self, token, n, cursor=None):
        return self.range_enumerator(n, cursor=cursor)

    def each_iteration(self, number, token, n):
        RUNS[token].append(number)
        if number == 2:
            GATES[token].set()
        time.sleep(0.005)


def test_a_worker_that_stops_ends_a_running_iterable_job_at_its_next_item_into_the_schedule(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=1, SHUTDOWN_TIMEOUT=30)
    pushed = running.push(Slowly, token, 1_000_000)
    assert GATES[token].wait(10)

    running.stop()

    done = RUNS[token]
    assert done == list(range(len(done))) and len(done) < 1_000_000
    # (Saved as it stopped itself, not handed back unsaved at the deadline: no checkpoint came due in its run.)
    assert r.hget(K.iteration(pushed["jid"]), "cursor") == str(done[-1])
    # Back in its queue, or in the schedule due now if the poller hadn't moved it before it stopped.
    queued = [json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)]
    assert queued + [p["jid"] for p, due in scheduled(r) if due <= time.time()] == [pushed["jid"]]


# -- pushed through the outbox ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_iterable_job_committed_through_the_outbox_walks_each_item_once_across_a_term(make_processor, r,
                                                                                          settings, redis_url):
    # OUTBOX on: the job is a row of the transaction until its commit, then the same job as any push;
    # sent back at a TERM it goes to the schedule (a filing, never the outbox again) and resumes.
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": redis_url}
    called, token = make_processor(), new_token()
    try:
        with transaction.atomic():
            jid = Walk.perform_async(token, 6)
            assert r.llen(K.queue("default")) == 0 and OutboxJob.objects.count() == 1
        assert OutboxJob.objects.count() == 0 and r.llen(K.queue("default")) == 1
        at(token, 2, stop_worker(called))

        first = called.run_next()
        second = resume(called)

        assert (first.payload["jid"], second.payload["jid"]) == (jid, jid)
        assert first.decision.outcome is Outcome.RESCHEDULED and second.decision.outcome is Outcome.SUCCESS
        assert RUNS[token] == list(range(6)) and OutboxJob.objects.count() == 0
    finally:
        runtime.reset()
