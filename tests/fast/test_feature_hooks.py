"""Each feature's hook on its own (django_cogworker/features/*/hook.py), on the suite's real Redis
and with no worker: the phases called in the processor's order (engine/run/hooks.py), and what a
user relies on from each feature.

A job is fetched as the processor gets it (its raw payload on the in-progress list of a real
ReliableFetch), and a Decision is settled by a real Settler holding the features' step runners, so
each test reads Redis for the result: what was acknowledged, counted, filed, released or written.
"""

from __future__ import annotations

import json
import random
import time
from typing import TypeVar

import pytest
from engine_fixtures import make_config
from limiter_fixtures import fresh_limiters  # noqa: F401 - the fresh_limiters fixture
from peek import queued_payloads

from django_cogworker import Batch, Job, Limiter
from django_cogworker.broker import locks
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.run.cancels import Cancels
from django_cogworker.engine.run.hooks import Decision, Feature, JobRun, Outcome
from django_cogworker.engine.run.run_locks import RunLocks
from django_cogworker.engine.settle.retry import Filing, RetryPolicy
from django_cogworker.engine.settle.settlement import ACK, Settlement
from django_cogworker.engine.settle.settling import Settler
from django_cogworker.errors import Cancelled, JobExpired, OverLimit
from django_cogworker.features.batches.hook import Batches
from django_cogworker.features.batches.steps import BatchStep
from django_cogworker.features.cancellation.hook import Cancellation
from django_cogworker.features.expiry.hook import Expiry
from django_cogworker.features.limits.gate import LimitGate, Release, Ticket
from django_cogworker.features.limits.hook import ClassLimits, InlineLimits
from django_cogworker.features.locks.hook import RunLockRelease
from django_cogworker.features.results.api import job_result
from django_cogworker.features.results.hook import Results
from django_cogworker.features.results.writer import ResultWriter
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import JobSetter
from django_cogworker.push.scope import Running

K = Keys()
F = TypeVar("F", bound=Feature)
IDENTITY = "host:1:hooks"
one_place = Limiter.concurrent("test:hooks:one", 1)  # (at import: registered for the whole run)


class Plain(Job):
    def perform(self):
        return "done"


class Kept(Job):
    result_ttl = 600

    def perform(self, n):
        return {"n": n}


class Stubborn(Job):
    cancellable = False

    def perform(self):
        return None


class Limited(Job):
    limits = [one_place]

    def perform(self):
        return None


class Core:
    """The core's side of the phases: jobs fetched onto a real in-progress list, and a real Settler
    holding the step runners of the features ``use``d."""

    def __init__(self, redis_url: str, rb):
        config = make_config(redis_url)
        self.rb = rb
        self.fetch = ReliableFetch(config, rb, K, IDENTITY)
        self.retry = RetryPolicy(config)
        self.settler = Settler(self.fetch, self.retry)

    def use(self, feature: F) -> F:
        """``feature``, its step runners handed to the Settler (as the Launcher does)."""
        self.settler.runners.update(feature.step_runners())
        return feature

    def fetched(self, job: type[Job], *args, payload: dict | None = None, **options) -> JobRun:
        """A job of ``job`` (or ``payload`` as given) as the fetch hands it over."""
        payload = payload or JobSetter(job, options).build(list(args), {})
        raw = payloads.encode(payload).encode()
        self.rb.lpush(self.fetch.in_progress, raw)
        return JobRun(Unit(raw, payload["queue"]), payloads.decode(raw), job, str(payload["jid"]), job.__name__)

    def settle(self, run: JobRun, decision: Decision) -> None:
        run.decision = decision
        self.settler.settle(run.raw, decision.settlement)

    def nowhere(self, run: JobRun) -> bool:
        """Whether the job was settled away: off the in-progress list, and not waiting, filed or scheduled."""
        return (not self.rb.lrange(self.fetch.in_progress, 0, -1) and not queued_payloads(self.rb)
                and not self.rb.zcard(K.retry) and not self.rb.zcard(K.dead) and not self.rb.zcard(K.schedule))

    def counter(self, key: str) -> int:
        return int(self.rb.get(key) or 0)


@pytest.fixture
def c(redis_url, rb) -> Core:
    return Core(redis_url, rb)


# -- expiry --------------------------------------------------------------------------------------------


def test_an_expired_job_is_dropped_unrun_acknowledged_and_counted(c, rb):
    later = time.time() + 61
    expiry = c.use(Expiry(rb, K, clock=lambda: later))
    run = c.fetched(Plain, expires_in=60)
    decision = expiry.before(run)
    assert decision is not None and decision.outcome is Outcome.DEAD and decision.settlement == Settlement(ACK)
    assert isinstance(decision.error, JobExpired) and not decision.failure  # (not counted as a failure)
    assert c.counter(K.stat_expired) == 1
    c.settle(run, decision)
    assert c.nowhere(run)  # acknowledged: not filed in dead, not run again


def test_a_job_before_its_expiry_or_without_one_goes_on_uncounted(c, rb):
    expiry = c.use(Expiry(rb, K))
    assert expiry.before(c.fetched(Plain, expires_in=60)) is None
    assert expiry.before(c.fetched(Plain)) is None
    assert c.counter(K.stat_expired) == 0


# -- cancellation ----------------------------------------------------------------------------------


def request(*jids: str) -> dict[str, str]:
    """The cancels hash as a heartbeat reads it, with a request for each of ``jids``."""
    return {jid: json.dumps({"at": time.time(), "interrupt": False}) for jid in jids}


def test_a_job_with_a_cancel_request_is_dropped_unrun_and_counted(c, rb):
    cancels = Cancels()
    cancellation = c.use(Cancellation(rb, K, cancels))
    asked, other = c.fetched(Plain), c.fetched(Plain)
    cancels.update(request(asked.jid))
    decision = cancellation.before(asked)
    assert decision is not None and (decision.outcome, decision.settlement) == (Outcome.DEAD, Settlement(ACK))
    assert isinstance(decision.error, Cancelled)
    assert cancellation.before(other) is None
    assert c.counter(K.stat_cancelled) == 1
    c.settle(asked, decision)
    assert rb.lrange(c.fetch.in_progress, 0, -1) == [other.raw]  # only the cancelled one is gone


def test_a_run_asked_to_stop_ends_dead_never_retried_whatever_it_returned(c, rb):
    cancels = Cancels()
    cancellation = c.use(Cancellation(rb, K, cancels))
    run = c.fetched(Plain)
    run.scope = Running(run.payload)

    def the_run():
        cancels.update(request(run.jid))  # (asked while it runs: a beat tells the run)
        return "done"

    run.value = cancellation.around(run, the_run)
    assert run.value == "done" and run.scope.cancelled
    decision = cancellation.decide(run)
    assert decision is not None and decision.outcome is Outcome.DEAD and isinstance(decision.error, Cancelled)
    c.settle(run, decision)
    assert c.nowhere(run) and c.counter(K.stat_cancelled) == 1

    unasked = c.fetched(Plain)
    unasked.scope = Running(unasked.payload)
    unasked.value = cancellation.around(unasked, lambda: "done")
    assert cancellation.decide(unasked) is None  # (the core acks its success)


def test_only_a_class_that_can_be_cancelled_pays_for_the_hook(rb):
    cancellation = Cancellation(rb, K, Cancels())
    assert cancellation.applies(Plain) and cancellation.applies(None)  # (None: a class this worker doesn't know)
    assert not cancellation.applies(Stubborn)


# -- limits ----------------------------------------------------------------------------------------


def gate(c: Core) -> LimitGate:
    return LimitGate(c.rb, K, over_limit_max=3, retry=c.retry, rng=random.Random(7))


def test_a_limited_job_holds_its_place_until_its_ack_carries_the_release(c, rb):
    limits = c.use(ClassLimits(gate(c)))
    first, second = c.fetched(Limited), c.fetched(Limited)
    assert limits.applies(Limited) and not limits.applies(Plain)
    assert limits.before(first) is None and isinstance(first.notes["limits"], Ticket)

    refused = limits.before(second)  # its one place is held: back to the schedule, not failed
    assert refused is not None and refused.outcome is Outcome.RESCHEDULED
    end = refused.settlement.end
    assert isinstance(end, Filing) and end.target == "schedule" and not refused.settlement.steps
    c.settle(second, refused)
    limits.after(second)

    decision = limits.settling(first, Decision(Outcome.SUCCESS, ACK))
    (release,) = decision.settlement.steps
    assert isinstance(release, Release) and decision.settlement.end is ACK
    assert decision.settlement.holdable  # (it may wait with the acks for the fetcher's next round trip)
    third = c.fetched(Limited)
    assert limits.before(third) is not None  # still held: the release travels with the ack
    c.rb.delete(K.schedule)
    c.settle(first, decision)
    limits.after(first)
    fourth = c.fetched(Limited)
    assert limits.before(fourth) is None  # the ack gave the place back
    fourth.notes["limits"].release()


def test_a_job_that_meets_its_limit_inside_its_run_goes_back_to_the_schedule_uncounted(c, rb):
    inline = c.use(InlineLimits(gate(c)))
    run = c.fetched(Plain)
    run.error = OverLimit("test:hooks:inline", "bucket", retry_after=5.0)
    decision = inline.decide(run)
    assert decision is not None and decision.outcome is Outcome.RESCHEDULED and not decision.failure
    c.settle(run, decision)
    inline.after(run)
    [(raw, due)] = rb.zrange(K.schedule, 0, -1, withscores=True)
    assert json.loads(raw)["jid"] == run.jid and json.loads(raw).get("retry_count") is None  # retries untouched
    assert due >= time.time() + 4  # (its retry_after, and a backoff)
    plain = c.fetched(Plain)
    plain.error = RuntimeError("boom")
    assert inline.decide(plain) is None  # (any other error: the core files it)


# -- run locks -------------------------------------------------------------------------------------


def locked(c: Core, until: str) -> JobRun:
    run = c.fetched(Plain, unique_for=3600, unique_until=until)
    digest = run.payload["unique_digest"]
    assert locks.take(c.rb, K, K.unique(digest), run.jid, 3600)[0] or c.rb.exists(K.unique(digest))
    return run


def test_a_unique_job_keeps_its_lock_through_a_retry_and_gives_it_up_at_its_success(c, rb):
    feature = c.use(RunLockRelease(RunLocks(rb, K)))
    run = locked(c, "success")
    lock = K.unique(run.payload["unique_digest"])
    run.started = time.monotonic()
    feature.around(run, lambda: None)
    assert rb.exists(lock)
    run.decision = Decision(Outcome.RETRY, ACK)
    feature.after(run)
    assert rb.exists(lock)  # (it runs again: nobody else may push it meanwhile)
    run.decision = Decision(Outcome.SUCCESS, ACK)
    feature.after(run)
    assert not rb.exists(lock)


def test_an_until_start_lock_goes_as_the_run_starts_and_a_job_never_started_keeps_its_lock(c, rb):
    feature = c.use(RunLockRelease(RunLocks(rb, K)))
    run = locked(c, "start")
    lock = K.unique(run.payload["unique_digest"])
    assert feature.around(run, lambda: rb.exists(lock)) == 0  # gone before the job's own code ran

    waiting = locked(c, "success")
    waiting.decision = Decision(Outcome.RESCHEDULED, ACK)  # (refused by a limit: it never started)
    feature.after(waiting)
    assert rb.exists(K.unique(waiting.payload["unique_digest"]))


# -- results ---------------------------------------------------------------------------------------


def test_a_kept_result_reads_running_during_its_run_then_successful_with_its_value(c, rb):
    results = c.use(Results(ResultWriter(rb, K, IDENTITY), timeouts=None))
    assert results.applies(Kept) and not results.applies(Plain)
    run = c.fetched(Kept, 7)
    run.job = Kept(run.payload)
    seen = []
    run.value = results.around(run, lambda: seen.append(job_result(run.jid, rb, K).status) or {"n": 7})
    assert seen == ["RUNNING"] and json.loads(run.value) == {"n": 7}
    results.settling(run, Decision(Outcome.SUCCESS, ACK))
    record = job_result(run.jid, rb, K)
    assert record.status == "SUCCESSFUL" and record.return_value == {"n": 7} and record.worker_ids == [IDENTITY]


def test_a_result_reads_ready_while_a_retry_waits_and_failed_once_dead(c, rb):
    results = c.use(Results(ResultWriter(rb, K, IDENTITY), timeouts=None))
    run = c.fetched(Kept, 7)
    run.job = Kept(run.payload)
    error = RuntimeError("boom")
    results.around(run, lambda: None)
    run.started = time.monotonic()
    results.settling(run, Decision(Outcome.RETRY, Filing("retry", time.time() + 30, run.payload), error, failure=True))
    assert job_result(run.jid, rb, K).status == "READY"
    results.settling(run, Decision(Outcome.DEAD, Filing("dead", time.time(), run.payload), error, failure=True))
    record = job_result(run.jid, rb, K)
    assert record.status == "FAILED" and "RuntimeError" in record.errors[-1]["exception_class_path"]


# -- batches ---------------------------------------------------------------------------------------


def batch_job(c: Core, rb) -> tuple[str, JobRun]:
    """A batch of one Plain job, pushed through the public API and fetched."""
    batch = Batch()
    with batch.jobs():
        Plain.perform_async()
    [payload] = queued_payloads(rb)
    rb.delete(K.queue("default"))
    return batch.bid, c.fetched(Plain, payload=payload)


def test_a_batch_job_s_success_is_a_batch_step_wrapping_its_ack(c, rb):
    batches = c.use(Batches(rb, K, ttl=3600))
    bid, run = batch_job(c, rb)
    decision = batches.settling(run, Decision(Outcome.SUCCESS, ACK))
    (step,) = decision.settlement.steps
    assert isinstance(step, BatchStep) and (step.bid, step.jid, step.outcome) == (bid, run.jid, "success")
    # (rides the fetcher's next round trip with the acks)
    assert decision.settlement.end is ACK and decision.settlement.holdable
    assert Batch.status(bid).pending == 1  # nothing moved until it settles
    c.settle(run, decision)
    status = Batch.status(bid)
    assert (status.pending, status.success, status.complete) == (0, True, True) and c.nowhere(run)


def test_a_batch_job_dropped_unrun_is_dead_for_its_batch_and_a_retry_only_a_failure(c, rb):
    batches = c.use(Batches(rb, K, ttl=3600))
    bid, run = batch_job(c, rb)
    retried = batches.settling(run, Decision(Outcome.RETRY, Filing("retry", time.time() + 30, run.payload),
                                             RuntimeError("boom"), failure=True))
    (step,) = retried.settlement.steps
    assert isinstance(step, BatchStep) and step.outcome == "failure"
    assert not retried.settlement.holdable
    dropped = batches.settling(run, Decision(Outcome.DEAD, ACK, JobExpired("expired")))
    assert dropped.settlement.steps[0].outcome == "dead"
    c.settle(run, dropped)
    status = Batch.status(bid)
    assert (status.dead, status.pending, status.success) == (1, 1, False)  # (dead: pending, never a success)
    plain = c.fetched(Plain)
    untouched = Decision(Outcome.SUCCESS, ACK)
    assert batches.settling(plain, untouched).settlement == Settlement(ACK)  # a job of no batch settles as it was
