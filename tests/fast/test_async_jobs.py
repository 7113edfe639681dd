"""Async jobs on a called processor (engine/run/processor.py's ``process_async``, the phases a worker's
event loop awaits: engine/loop/runner.py), the plan's rule for features without an async form,
the routing of a fetch between threads and the loop (engine/fetch/routing.py), the loop's lag
watch, ``async with limiter.within()`` and the setting. The real workers: tests/workers/test_async_workers.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest
from engine_fixtures import RUNS, launcher_factory_fixture, make_processor_fixture, new_token, runs  # noqa: F401
from helpers import wait_until
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture
from opentelemetry.trace import SpanKind, StatusCode
from tracing_fixtures import of_kind, spans_fixture  # noqa: F401 - the spans fixture

from django_cogworker import ConfigError, Job, Limiter, joblog
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.routing import Router
from django_cogworker.engine.loop.lag import LoopLag
from django_cogworker.engine.run.hooks import Feature, JobRun, Outcome, Plans
from django_cogworker.engine.run.interrupts import TaskInterrupt
from django_cogworker.errors import Cancelled, JobTimeout
from django_cogworker.push import payload as payloads
from django_cogworker.push.middleware import build_async_chain

K = Keys()
STARTED: dict[str, threading.Event] = {}


class AsyncNote(Job):
    """Record (jid, the job the log context names, the thread it ran on) under RUNS[token]."""

    async def perform(self, token: str) -> None:
        await asyncio.sleep(0)
        RUNS[token].append((self.jid, joblog.current(), threading.current_thread().name))


class AsyncFails(Job):
    async def perform(self, token: str) -> None:
        await asyncio.sleep(0)
        raise ValueError("async failure")


class AsyncWaits(Job):
    """Await a minute unless stopped; records "cancelled" when its task is cancelled."""

    async def perform(self, token: str) -> None:
        STARTED.setdefault(token, threading.Event()).set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            RUNS[token].append("cancelled")
            raise


class AsyncTimed(AsyncWaits):
    timeout = 1


class SyncNote(Job):
    def perform(self, token: str) -> None:
        RUNS[token].append(threading.current_thread().name)


class SyncAroundOnly(Feature):
    name = "sync-around-only"

    def around(self, run: JobRun, call: Any) -> Any:
        return call()


class BothArounds(SyncAroundOnly):
    name = "both-arounds"

    async def around_async(self, run: JobRun, call: Any) -> Any:
        return await call()


def test_an_async_job_runs_through_the_phases_and_is_acked_its_log_context_naming_it(make_processor):
    called, token = make_processor(), new_token()

    run = called.arun(AsyncNote, token)

    assert run.decision.outcome is Outcome.SUCCESS and called.ends() == ["ack"] and called.clear()
    [(jid, context, _thread)] = runs(token)
    assert jid == run.payload["jid"] and context == (jid, AsyncNote.name)
    assert joblog.current() is None  # (left at the end of its task)


def test_an_async_job_that_raises_is_filed_for_retry_as_a_sync_one(make_processor):
    called, token = make_processor(), new_token()

    run = called.arun(AsyncFails, token)

    assert run.decision.outcome is Outcome.RETRY and called.ends() == ["retry"]
    assert isinstance(run.error, ValueError) and str(run.error) == "async failure"


def test_a_timeout_cancels_the_task_and_files_it_with_job_timeout(make_processor):
    called, token = make_processor(), new_token()
    watchers = [f for f in called.features if getattr(f, "timeouts", None) is not None]
    for feature in watchers:
        feature.start()
    try:
        run = called.arun(AsyncTimed, token)
    finally:
        for feature in watchers:
            feature.stop()

    assert isinstance(run.error, JobTimeout) and run.decision.outcome is Outcome.RETRY
    assert runs(token) == ["cancelled"]  # (the job's own await saw the cancel: its cleanup ran)


def test_a_cancel_with_interrupt_cancels_the_task_and_the_job_is_dead(make_processor):
    called, token = make_processor(), new_token()
    [feature] = [f for f in called.features if f.name == "cancellation"]
    pushed = called.push(AsyncWaits, token)

    def cancel_once_started() -> None:
        STARTED.setdefault(token, threading.Event()).wait(10)
        feature.cancels.update({pushed["jid"]: json.dumps({"at": time.time(), "interrupt": True})})

    threading.Thread(target=cancel_once_started, daemon=True).start()
    run = called.run_next_async()

    assert run is not None and isinstance(run.error, Cancelled)
    assert run.decision.outcome is Outcome.DEAD and called.ends() == ["ack"]  # (cancelled: never retried)
    assert runs(token) == ["cancelled"]


def test_an_interrupt_sent_before_the_call_s_task_exists_stops_it_as_it_starts_and_one_sent_after_nothing():
    async def main() -> str:
        loop = asyncio.get_running_loop()
        early = TaskInterrupt(loop)
        early.send(Cancelled)  # (as a cancel read while the job's around hooks run)
        await asyncio.sleep(0)
        with pytest.raises(Cancelled):
            await early.run(asyncio.sleep(60))
        late = TaskInterrupt(loop)
        done = await late.run(asyncio.sleep(0, "done"))
        late.send(Cancelled)  # (the run returned: nothing to stop, nothing raised later)
        await asyncio.sleep(0.01)
        return done

    assert asyncio.run(main()) == "done"


def test_an_async_job_runs_on_the_loop_only_when_every_around_it_uses_has_an_async_form():
    assert Plans([BothArounds()]).plan(AsyncNote).on_loop
    assert not Plans([SyncAroundOnly()]).plan(AsyncNote).on_loop  # (on a thread, through async_to_sync)
    assert not Plans([BothArounds()]).plan(SyncNote).on_loop
    assert not Plans([BothArounds()], async_chain=False).plan(AsyncNote).on_loop
    assert not Plans([]).plan(None).on_loop  # (a class this worker doesn't know)


class Stamp:
    """Server middleware with an async form: stamps the payload it passes on."""

    def __init__(self, run: Any):
        self.run = run

    def __call__(self, job: Any, payload: dict) -> Any:
        return self.run(job, payload)

    async def acall(self, job: Any, payload: dict) -> Any:
        RUNS[payload["args"][0]].append("stamped")
        return await self.run(job, payload)


class SyncOnly(Stamp):
    acall = None  # type: ignore[assignment]


def test_the_async_server_chain_runs_each_middleware_acall_and_none_without_one(make_processor):
    called, token = make_processor(server_middleware=[Stamp]), new_token()

    assert called.arun(AsyncNote, token).decision.outcome is Outcome.SUCCESS
    assert runs(token)[0] == "stamped"
    assert build_async_chain([Stamp, SyncOnly], lambda job, payload: None) == (None, "SyncOnly")


class FakeLoop:
    capacity = 2
    alive = True


def unit_of(job: type[Job]) -> Unit:
    return Unit(payloads.encode({"class": job.name, "jid": new_token(), "args": [], "queue": "default"}), "default")


def test_a_job_fetched_for_a_pool_with_no_free_place_is_handed_back_and_that_pool_not_offered():
    woken: list[int] = []
    router = Router(FakeLoop(), Plans([]), wake=lambda: woken.append(1))  # type: ignore[arg-type]
    sync, asynchronous = unit_of(SyncNote), unit_of(AsyncNote)

    assert router.take() == 2
    to_threads, to_loop, back = router.split([sync, asynchronous], threads=0, places=2)

    assert (to_threads, to_loop, back) == ([], [asynchronous], [sync])
    assert router.blocked == "loop"
    router.give(1)
    assert router.places() == 0 and router.take() == 0  # (the loop's places not offered...)
    router.thread_freed()
    assert router.blocked is None and router.places() == 1  # (...until a thread frees)

    router.take()
    to_threads, to_loop, back = router.split([asynchronous, sync], threads=1, places=0)
    assert (to_threads, to_loop, back) == ([sync], [], [asynchronous]) and router.blocked == "thread"
    router.loop_freed()
    assert router.blocked is None and woken


def test_a_block_that_nothing_clears_lapses_so_that_a_process_fetches_again(monkeypatch):
    # The race a review found: a thread went idle (thread_freed, nothing blocked yet) while a fetch
    # was in flight, then split blocked the loop for the sync job it brought; with every thread idle
    # nothing would clear it, and at a mostly-async mix the fetcher asked for 0 jobs for good.
    from django_cogworker.engine.fetch import routing

    router = Router(FakeLoop(), Plans([]), wake=lambda: None)  # type: ignore[arg-type]
    router.share = 0.95  # (a mostly-async process)
    router.take()
    router.thread_freed()  # (the thread went idle before the block was set: nothing to clear)
    router.split([unit_of(SyncNote)], threads=0, places=2)
    router.give(2)
    assert router.blocked == "loop" and router.count(10, router.places()) == 0
    now = time.monotonic()
    monkeypatch.setattr(routing.time, "monotonic", lambda: now + routing.BLOCK_MAX + 0.01)
    assert router.blocked is None and router.places() == 2 and router.count(10, router.places()) > 0


def test_a_fetch_asks_for_what_both_pools_can_take_at_the_mix_of_jobs_fetched_lately():
    router = Router(FakeLoop(), Plans([]), wake=lambda: None)  # type: ignore[arg-type]
    # At first a process counts its jobs sync (most of a Django project's are): its loop's places are
    # not fetched for while its threads are busy.
    assert router.count(threads=2, places=2) == 2 and router.count(threads=0, places=2) == 0
    for _ in range(5):  # (its fetches bring async jobs only: the share of async jobs rises)
        router.split([unit_of(AsyncNote) for _ in range(20)], threads=0, places=100)
    assert router.count(threads=0, places=2) == 2  # (the loop fed, threads busy)
    assert router.count(threads=10, places=0) == 0  # (all async lately: a full loop, no fetch for the threads)
    assert router.count(threads=10, places=1) == 1


class Holder(Job):
    """Hold a processor thread until its token's event is set."""

    def perform(self, token: str) -> None:
        STARTED.setdefault(token, threading.Event()).wait(30)
        RUNS[token].append("held")


def test_in_a_worker_a_sync_job_waiting_behind_a_busy_thread_is_never_taken_ahead(launcher_factory, r):
    # One thread, busy; two loop places free: a fetch for the loop's places that brings the sync job
    # hands it back at once, never recorded as taken, and offers the loop's places no more until the
    # thread frees (the queue's order kept: the async job behind it may wait for it too).
    token = new_token()
    running = launcher_factory(CONCURRENCY=1, ASYNC_CONCURRENCY=2, PREFETCH=0)
    Holder.perform_async(token)
    wait_until(lambda: running.manager.busy == 1, message="the thread is held")
    sync_jid = SyncNote.perform_async(token)
    async_jid = AsyncNote.perform_async(token)

    def taken() -> set[str]:
        return {json.loads(raw)["jid"] for raw in running.manager.known_raws()}

    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # (watched a while: never taken, never run, while the thread is busy)
        assert sync_jid not in taken() and "cogworker-processor-0" not in runs(token)
        time.sleep(0.01)

    STARTED[token].set()
    wait_until(lambda: len(runs(token)) == 3, message="all three ran once the thread freed")
    ran = runs(token)
    assert ran.count("held") == 1 and ran.count("cogworker-processor-0") == 1
    [(jid, _context, thread)] = [e for e in ran if isinstance(e, tuple)]
    assert jid == async_jid and thread == "cogworker-loop"
    wait_until(lambda: r.llen(K.queue("default")) == 0 and not taken(), message="nothing left")


def test_the_lag_watch_names_the_job_holding_the_loop_and_says_when_it_ran_again(caplog):
    now = [100.0]
    lag = LoopLag(asyncio.new_event_loop(), lambda: ("j-1", "app.jobs.Blocker"), limit=0.25, clock=lambda: now[0])
    lag.stamp = 100.0
    with caplog.at_level(logging.WARNING):
        now[0] = 101.0
        lag.check(now[0])
        lag.check(now[0] + 0.5)  # (once per hold)
        lag.stamp = now[0] = 103.0
        lag.check(now[0])

    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 2
    assert said[0].startswith("the event loop is blocked (1.00s so far) by jid=j-1 class=app.jobs.Blocker")
    assert said[1] == "the event loop runs again after 3.00s blocked by jid=j-1 class=app.jobs.Blocker"


def test_async_with_within_holds_a_place_and_gives_it_back(rb):
    limiter = Limiter.concurrent(unique("async-within"), 1, lease=30)
    holders = K.limit(limiter.name).holders

    async def main() -> int:
        async with limiter.within(redis=rb, keys=K):
            held = rb.zcard(holders)
            with pytest.raises(Exception, match="limit"):
                async with limiter.within(0.05, redis=rb, keys=K):
                    pass
        return held

    assert asyncio.run(main()) == 1 and rb.zcard(holders) == 0


@pytest.mark.parametrize("value", [-1, 1.5, "10", True])
def test_async_concurrency_is_validated_naming_the_setting(value):
    with pytest.raises(ConfigError, match=r'COGWORKER\["ASYNC_CONCURRENCY"\] must be an integer >= 0, got '):
        build_config({"ASYNC_CONCURRENCY": value}, {})
    assert build_config({}, {}).async_concurrency == 100
    assert build_config({"ASYNC_CONCURRENCY": 0}, {}).async_concurrency == 0


def test_an_async_job_runs_in_its_consumer_span_a_failure_marking_it(make_processor, spans):
    called, token = make_processor(), new_token()
    pushed = called.push(AsyncFails, token)

    run = called.run_next_async()

    assert run is not None and run.decision.outcome is Outcome.RETRY
    [producer], [consumer] = of_kind(spans, SpanKind.PRODUCER), of_kind(spans, SpanKind.CONSUMER)
    assert consumer.name == "process default" and consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert dict(consumer.attributes or {})["messaging.message.id"] == pushed["jid"]
    assert consumer.status.status_code is StatusCode.ERROR


class AsyncCounts(Job):
    """Count the receipts through the async ORM (on asgiref's thread-sensitive thread)."""

    async def perform(self, token: str) -> None:
        from testproject.demo.models import Receipt

        RUNS[token].append(await Receipt.objects.acount())


@pytest.mark.django_db(transaction=True)
def test_the_database_connection_an_async_job_used_is_closed_after_it(make_processor):
    from asgiref.sync import sync_to_async
    from django.db import connections

    from django_cogworker.engine.run.db import CloseOldConnections

    called, token = make_processor(server_middleware=[CloseOldConnections]), new_token()

    def opened() -> bool:
        return connections["default"].connection is not None

    async def run_and_look() -> tuple[Any, bool]:
        ran = await called.processor.process_async(called.take(), None, "cogworker-loop-0")
        return ran, await sync_to_async(opened)()  # (on the thread the job's queries ran on)

    called.push(AsyncCounts, token)
    run, still_open = asyncio.run(run_and_look())

    assert run is not None and run.decision.outcome is Outcome.SUCCESS and runs(token) == [0]
    assert not still_open  # (CONN_MAX_AGE 0: closed after the job, as a sync job's)


class SwallowsCancel(Job):
    """Awaits 30 s; a cancel it swallows, returning as if done (the docs allow it: it runs on)."""

    async def perform(self, token: str) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return


def test_at_the_shutdown_deadline_a_job_that_swallows_its_cancel_is_handed_back_unsettled(make_processor):
    # A review's finding: abandon listed the job to hand back, then the job swallowed the cancel,
    # returned, and was acked too: run again by its hand-back after it was settled.
    from django_cogworker.engine.loop.runner import LoopRunner

    called = make_processor()
    called.push(SwallowsCancel, new_token())
    unit = called.take()
    runner = LoopRunner(2, called.processor)
    runner.start()
    try:
        runner.submit([unit])
        deadline = time.monotonic() + 10
        while runner.running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.running == 1
        handed_back = runner.abandon()
    finally:
        runner.loop.call_soon_threadsafe(runner.loop.stop)
    assert handed_back == [unit]
    assert called.settled == []  # (handed back: nothing settled, not acked)


def test_at_the_shutdown_deadline_jobs_handed_over_but_not_begun_are_handed_back(make_processor):
    # A loop held by a blocking job makes the tasks of jobs the fetcher handed over late: abandon
    # returned only the tasks made, and with basic fetch the others were lost.
    from django_cogworker.engine.loop.runner import LoopRunner

    called = make_processor()
    called.push(AsyncNote, new_token())
    unit = called.take()
    runner = LoopRunner(2, called.processor)  # (never started: its loop never makes the task)
    runner.submit([unit])
    assert runner.abandon() == [unit]
    runner.loop.run_until_complete(asyncio.sleep(0))  # (the _begin it had been asked for: a no-op now)
    assert runner.running == 0 and called.settled == []


def test_with_the_loop_s_thread_dead_no_job_is_sent_to_it_and_async_ones_run_on_threads():
    # A review's finding: a loop whose thread died (a bug of ours) was still offered its places and
    # handed jobs, taken from Redis and never started until the process exited.
    loop = FakeLoop()
    router = Router(loop, Plans([]), wake=lambda: None)  # type: ignore[arg-type]
    loop.alive = False
    asynchronous = unit_of(AsyncNote)
    assert router.places() == 0 and router.take() == 0
    assert router.split([asynchronous], threads=1, places=0) == ([asynchronous], [], [])

