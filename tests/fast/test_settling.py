"""Settling (engine/settle/): acks, filings, pending settlements and the hand-off at shutdown.

Through a real in-process Launcher, and the settlement queue (queue.py, outgoing.py) on its own
against the suite's Redis.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis
from engine_fixtures import (
    GATES,
    Boom,
    Hold,
    Note,
    fail_acks,
    fetch_mode_fixture,  # noqa: F401 - the fetch_mode fixture
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import RedisServer, round_trips, wait_until
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import Batch, Limiter
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.settle.queue import SettlementQueue
from django_cogworker.engine.settle.retry import Filing, RetryPolicy
from django_cogworker.engine.settle.settlement import ACK, Settlement
from django_cogworker.engine.settle.settling import Settler
from django_cogworker.features.batches.steps import BatchStep, BatchSteps
from django_cogworker.features.limits.gate import LimitGate, Release, Ticket
from django_cogworker.features.limits.hook import ClassLimits
from django_cogworker.push import payload as payloads
from testproject.demo.jobs import BatchCallbackJob

K = Keys()
# Retries with backoff inside redis-py would only slow the outage tests down.
NO_RETRY = {"socket_timeout": 0.75, "socket_connect_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}


def test_a_failed_filing_is_kept_in_memory_and_filed_later_by_the_heartbeat(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")  # after the key guard's boot round: FILE_FAILURE now fails

    pushed = running.push(Boom, token)

    pending = wait_until(running.manager.pending_settlements, message="a pending settlement")
    ((raw, how),) = pending.items()
    assert not how.steps and isinstance(how.end, Filing)
    assert how.end.target == "retry" and how.end.payload["jid"] == pushed["jid"]
    if fetch_mode == "reliable":
        assert r.lrange(running.in_progress, 0, -1) == [raw.decode()]  # not filed, so not acked
    time.sleep(0.5)  # a few beats that still fail
    assert running.manager.pending_settlements()

    r.delete(K.retry)

    wait_until(lambda: not running.manager.pending_settlements(), message="filed by a later beat")
    (filed,) = r.zrange(K.retry, 0, -1)
    assert json.loads(filed)["jid"] == pushed["jid"]
    assert json.loads(filed)["error_message"] == "boom"
    assert r.llen(running.in_progress) == 0
    assert r.llen(K.queue("default")) == 0
    assert runs(token) == [pushed["jid"]]  # ran once: a failed settle never puts a job back to run


def test_an_ack_lost_to_a_redis_outage_is_made_once_redis_is_back(launcher_factory, tmp_path):
    token = new_token()
    with RedisServer(tmp_path / "redis", appendonly=True) as srv:
        client = srv.client(decode_responses=True)
        try:
            running = launcher_factory(url=srv.url, REDIS_OPTIONS=NO_RETRY, CONCURRENCY=1)
            pushed = running.push(Hold, token)
            wait_until(lambda: runs(token) == [("start", pushed["jid"])])
            assert client.llen(running.in_progress) == 1

            srv.stop()  # graceful: the AOF keeps the in-progress list
            GATES[token].set()
            pending = wait_until(running.manager.pending_settlements, message="the ack is pending")
            assert list(pending.values()) == [Settlement(ACK)]

            srv.start()
            wait_until(lambda: not running.manager.pending_settlements(), timeout=15, message="ack retried")
            assert client.llen(running.in_progress) == 0
            wait_until(lambda: client.get(K.stat_processed) == "1", timeout=15, message="stats flushed")
            assert client.llen(K.queue("default")) == 0
            assert runs(token) == [("start", pushed["jid"]), ("end", pushed["jid"])]  # never run again
            assert running.stop() == 0
        finally:
            client.close()


def test_at_shutdown_an_unfileable_failure_is_handed_over_to_unsettled_never_requeued(launcher_factory, fetch_mode,
                                                                                     r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")
    pushed = running.push(Boom, token)
    wait_until(running.manager.pending_settlements)

    assert running.stop() == 0

    (record,) = r.lrange(K.unsettled, 0, -1)
    assert json.loads(json.loads(record)["payload"])["jid"] == pushed["jid"]
    assert json.loads(record)["target"] == "retry"
    assert r.llen(K.queue("default")) == 0  # it ran: never requeued
    assert r.llen(running.in_progress) == 0
    assert running.manager.pending_settlements() == {}

    # Any live process files it once it can.
    r.delete(K.retry)
    launcher_factory(FETCH=fetch_mode)
    wait_until(lambda: r.llen(K.unsettled) == 0)
    (filed,) = r.zrange(K.retry, 0, -1)
    assert json.loads(filed)["jid"] == pushed["jid"]
    assert runs(token) == [pushed["jid"]]


def test_a_failure_that_cannot_even_be_handed_over_stays_for_orphan_recovery(launcher_factory, r):
    token = new_token()
    running = launcher_factory(KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")
    r.set(K.unsettled, "not a list either")
    pushed = running.push(Boom, token)
    wait_until(running.manager.pending_settlements)

    assert running.stop() == 0

    (left,) = r.lrange(running.in_progress, 0, -1)
    assert json.loads(left)["jid"] == pushed["jid"]  # kept, not requeued to run again now
    assert r.llen(K.queue("default")) == 0
    assert r.sismember(K.in_progress_identities, running.launcher.identity) == 1  # so recovery finds it


@pytest.mark.parametrize("broken", ["retry_pending_settlements", "pending_settlements", "_park_unsettled",
                                    "fetch.requeue", "run_hook"])
@pytest.mark.parametrize("error", [RuntimeError("bug"), redis.ConnectionError("Redis went away"),
                                   UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")],
                         ids=["bug", "outage", "encoding"])
def test_requeue_unfinished_never_raises_whatever_fails_inside_it(launcher_factory, r, caplog, monkeypatch,
                                                                   broken, error):
    # It runs at shutdown, between the wait and the exit: raising there skipped the rest of the
    # shutdown (the heartbeat's goodbye, the registry), and the jobs' fate was nobody's.
    running = launcher_factory(CONCURRENCY=1)
    manager = running.manager
    raw = payloads.encode({"jid": "cut-short", "class": Note.name, "args": ["x"], "kwargs": {},
                           "queue": "default"}).encode()
    r.lpush(running.in_progress, raw)  # taken by this process, interrupted by the shutdown
    # As at a real shutdown, the fetcher is done first: a live one could fetch the requeued job,
    # run it and ack it before the lists are read.
    manager.make_quiet()
    manager.fetcher.join()
    if broken == "fetch.requeue":
        owners, name = [manager.fetch], "requeue"
    elif broken == "run_hook":  # the run locks' hook, told of each job handed back
        owners, name = [manager.settler], "run_hook"
    else:
        owners, name = [manager.settler], broken

    def fail(*args, **kwargs):
        raise error

    for owner in owners:
        monkeypatch.setattr(owner, name, fail)
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        moved = manager.settler.requeue_unfinished([Unit(raw, "default")])
    assert isinstance(moved, int)
    jids = [json.loads(x)["jid"] for x in r.lrange(running.in_progress, 0, -1) + r.lrange(K.queue("default"), 0, -1)]
    assert jids == ["cut-short"]  # requeued, or left for orphan recovery: never lost, never twice
    assert caplog.records  # and what failed is said


def test_a_filing_that_can_never_be_sent_is_filed_as_fetched_with_its_error_never_kept_pending(launcher_factory, r):
    # Waiting changes nothing for such a filing: taken for an outage, it was retried every beat,
    # forever, its job held on the in-progress list.
    running = launcher_factory(CONCURRENCY=1)
    raw = payloads.encode({"jid": "unsendable", "class": Boom.name, "args": ["t"], "kwargs": {},
                           "queue": "default", "retry": 3}).encode()
    r.lpush(running.in_progress, raw)
    payload = payloads.decode(raw)
    payload.update(retry_count=0, failed_at=time.time(), error_class="RuntimeError", error_message="boom",
                   spoiled=float("inf"))  # (a value JSON can't hold, put there by a middleware, say)

    running.manager.settler.settle(raw, Settlement(Filing("retry", time.time() + 60, payload)))

    assert not running.manager.pending_settlements()
    (filed,) = r.zrange(K.retry, 0, -1)
    assert filed.startswith(raw.decode()[:-1])  # as fetched, the failure's fields appended
    assert (json.loads(filed)["error_message"], json.loads(filed)["retry_count"]) == ("boom", 0)
    assert "spoiled" not in json.loads(filed)
    assert r.llen(running.in_progress) == 0


# -- the settlement queue on its own -------------------------------------------------------------------


@pytest.fixture
def batch(redis_url, rb):
    """A SettlementQueue over a reliable fetch whose in-progress list holds three jobs: (queue, fetch, settler)."""
    fetch = ReliableFetch(make_config(redis_url), rb, K, "host:1:acks")
    settler = Settler(fetch, RetryPolicy(fetch.config))
    rb.lpush(fetch.in_progress, *(job(n) for n in range(3)))
    return SettlementQueue(settler, cap=3), fetch, settler


def job(n):
    return payloads.encode({"jid": f"j{n}", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default"}).encode()


ACKED = Settlement(ACK)


def test_an_ack_goes_out_at_once_while_no_fetcher_runs(batch, rb):
    queue, fetch, _settler = batch
    queue.put(job(0), ACKED)  # never opened: no fetcher loop to ride on
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    queue.open()
    queue.close()  # the fetcher's loop ended
    queue.put(job(1), ACKED)
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)] and queue.held() == []


def test_an_ack_waits_for_the_next_fetch_while_the_fetcher_runs(batch, rb):
    queue, fetch, _settler = batch
    queue.open()
    queue.put(job(0), ACKED)
    queue.put(job(1), ACKED)
    assert rb.llen(fetch.in_progress) == 3  # no round trip of its own
    assert queue.held() == [job(0), job(1)]
    assert queue.take(fetch.rides).acks == [job(0), job(1)]
    assert not queue.take(fetch.rides) and queue.held() == []


def test_a_filing_is_never_held_it_goes_out_at_once(batch, rb):
    queue, fetch, _settler = batch
    queue.open()
    queue.put(job(0), Settlement(Filing("dead", time.time(), payloads.decode(job(0)))))
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)] and rb.zcard(K.dead) == 1
    assert queue.held() == []


def test_held_acks_that_closing_sends_go_out_once_and_closed_ones_at_once(batch, rb):
    # The fetcher's loop ended (quiet): what it held goes now, not at the stop.
    queue, fetch, _settler = batch
    queue.open()
    queue.put(job(0), ACKED)
    queue.close()
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)] and queue.held() == []


def test_before_a_blocking_fetch_the_held_acks_go_out_and_later_ones_at_once(batch, rb):
    queue, fetch, _settler = batch
    queue.open()
    queue.put(job(0), ACKED)
    queue.waiting()
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    queue.put(job(1), ACKED)  # while the fetcher blocks
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)]
    queue.fetching()
    queue.put(job(2), ACKED)
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)] and queue.take(fetch.rides).acks == [job(2)]


def test_held_acks_that_fail_before_a_block_are_kept_pending(batch, rb, monkeypatch):
    queue, fetch, settler = batch
    queue.open()
    queue.put(job(0), ACKED)
    fail_acks(fetch, lambda raw: True, monkeypatch)
    queue.waiting()  # (never raises: the blocking call that follows meets the outage, and the watchdog)
    assert settler.pending_settlements() == {job(0): ACKED}
    assert rb.llen(fetch.in_progress) == 3


def test_no_more_acks_are_held_than_the_cap_the_one_beyond_sends_them_all_itself(batch, rb):
    # A process killed, or taken for dead after a stall, runs again each finished job whose ack it
    # still held: a -c 2 worker taking 4 ahead per processor held up to 25 of them. The cap (the
    # concurrency: 3 here) bounds that to one per processor.
    queue, fetch, _settler = batch
    rb.lpush(fetch.in_progress, *(job(n) for n in range(3, 6)))
    queue.open()
    for n in range(3):
        queue.put(job(n), ACKED)
    assert rb.llen(fetch.in_progress) == 6 and queue.held() == [job(0), job(1), job(2)]  # (up to the cap: held)
    queue.put(job(3), ACKED)  # one more than the cap: the adding processor sends them all, in one round trip
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(5), job(4)] and queue.held() == []
    queue.put(job(4), ACKED)
    assert queue.held() == [job(4)] and rb.llen(fetch.in_progress) == 2


def test_acks_sent_at_the_cap_that_fail_are_kept_pending_and_the_job_that_sent_them_goes_on(batch, rb, monkeypatch):
    queue, fetch, settler = batch
    rb.lpush(fetch.in_progress, job(3))
    queue.open()
    fail_acks(fetch, lambda raw: True, monkeypatch)
    for n in range(4):
        queue.put(job(n), ACKED)  # (the fourth sends: no exception reaches its processor)
    assert settler.pending_settlements() == {job(n): ACKED for n in range(4)} and queue.held() == []
    assert rb.llen(fetch.in_progress) == 4
    monkeypatch.undo()
    assert settler.retry_pending_settlements() == 0 and rb.llen(fetch.in_progress) == 0


def _batch_of(count, callbacks=False):
    """A committed batch of ``count`` jobs (pushed, never run): (bid, their success settlements). With
    ``callbacks``, one on each event (pushed to ``default``, never run here)."""
    from testproject.demo.jobs import RecordJob

    batch = Batch()
    for event in ("complete", "success", "death") if callbacks else ():
        batch.on(event, BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [RecordJob.perform_async("x") for _ in range(count)]
    return batch.bid, [ACKED.first(BatchStep(batch.bid, jid, "success", "")) for jid in jids]


def test_a_batch_job_s_step_waits_with_its_ack_and_goes_through_before_the_fetch_that_acks_it(batch, rb):
    # (A fetch that can't carry the steps on its pipeline: they run just before it, and their acks go with it.)
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    queue.open()
    queue.put(job(0), steps[0])
    queue.put(job(1), ACKED)
    queue.put(job(2), steps[1])
    assert Batch.status(bid).pending == 2 and rb.llen(fetch.in_progress) == 3  # no round trip of its own
    assert sorted(queue.held()) == [job(0), job(1), job(2)]
    assert sorted(queue.take(riding=False).acks) == [job(0), job(1), job(2)]  # (their steps ran: the acks may ride)
    assert Batch.status(bid).success and rb.llen(fetch.in_progress) == 3
    assert not queue.take(riding=False) and queue.held() == []


def test_held_steps_go_through_before_a_blocking_fetch_and_later_ones_at_once_with_their_ack(batch, rb):
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    queue.open()
    queue.put(job(0), steps[0])
    queue.waiting()
    assert Batch.status(bid).pending == 1 and rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    queue.put(job(1), steps[1])  # while the fetcher blocks
    assert Batch.status(bid).success and rb.lrange(fetch.in_progress, 0, -1) == [job(2)]


def test_at_the_cap_the_acks_ready_go_alone_and_the_held_steps_wait_for_the_fetch(batch, rb):
    # A job of a batch holds its ack one fetch longer than its step: sending the steps too at each
    # overflow cost two round trips more, where the acks ready free the places in one.
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    rb.lpush(fetch.in_progress, job(3))
    queue.open()
    queue.put(job(0), steps[0])
    queue.put(job(1), ACKED)
    queue.put(job(2), ACKED)
    assert Batch.status(bid).pending == 2 and rb.llen(fetch.in_progress) == 4
    queue.put(job(3), steps[1])  # one more than the cap
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(3), job(0)]  # (the acks ready, alone)
    assert Batch.status(bid).pending == 2 and sorted(queue.held()) == [job(0), job(3)]  # (no step, no ack of theirs)
    assert sorted(queue.take(riding=False).acks) == [job(0), job(3)]  # (their steps ran first: the acks may ride)
    assert Batch.status(bid).success


def test_held_steps_at_the_cap_with_no_ack_ready_go_through_before_their_acks(batch, rb):
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(4)
    rb.lpush(fetch.in_progress, job(3))
    queue.open()
    for n in range(3):
        queue.put(job(n), steps[n])
    assert Batch.status(bid).pending == 4 and rb.llen(fetch.in_progress) == 4
    queue.put(job(3), steps[3])  # one more than the cap, and none of them ready to ack
    assert Batch.status(bid).success and rb.llen(fetch.in_progress) == 0 and queue.held() == []


def test_held_steps_redis_refuses_stay_pending_with_their_acks_behind_them(batch, rb, monkeypatch):
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(1)

    def refused(self, steps):
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(BatchSteps, "run_many", refused)
    queue.open()
    queue.put(job(0), steps[0])
    queue.put(job(1), ACKED)
    assert queue.take(riding=False).acks == [job(1)]  # (a plain ack rides on as ever; the other waits for its step)
    assert settler.pending_settlements() == {job(0): steps[0]}
    assert Batch.status(bid).pending == 1 and rb.llen(fetch.in_progress) == 3
    monkeypatch.undo()
    assert settler.retry_pending_settlements() == 0  # the step, then the ack
    assert Batch.status(bid).success and rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]


# Which events a batch can still vouch for once each key was lost: none once it can't tell what is
# pending or whether a block is open (docs/batches.md); its callbacks went with its meta.
VOUCHED = {"meta": False, "jobs": True, "pending": False, "failed": True, "dead": True, "open": False, "outbox": True}


@pytest.mark.parametrize("name", list(VOUCHED))
def test_a_batch_key_of_the_wrong_type_costs_its_jobs_nothing_it_is_quarantined_at_once(batch, rb, r, caplog, name):
    # (Its steps failed at every try: their jobs stayed on the in-progress list, each settlement
    # tried again every beat for ever, a WARNING each time; no guard round knows a batch's keys.)
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(3, callbacks=True)
    bk = K.batch(bid)
    r.set(getattr(bk, name), "not mine")
    queue.open()
    with caplog.at_level(logging.INFO):
        queue.put(job(0), steps[0])
        queue.put(job(1), steps[1])
        dead = steps[2].steps[0]._replace(outcome="dead", record='{"error": "x"}')
        settler.settle(job(2), ACKED.first(dead))  # (alone)
        assert sorted(queue.take(riding=False).acks) == [job(0), job(1)]
    fetch.ack_many([job(0), job(1)])
    assert settler.pending_settlements() == {} and rb.llen(fetch.in_progress) == 0  # every job settled
    (moved,) = r.scan_iter(match=f"{K.quarantine_prefix}{getattr(bk, name)}:*")
    assert r.get(moved) == "not mine"
    assert r.hget(bk.meta, f"lost:{name}") is not None  # (what it lost: shown by the admin and the CLI)
    assert [rec.name for rec in caplog.records if rec.levelno >= logging.WARNING] == [
        "django_cogworker.broker.quarantine"]  # (said once)
    status = Batch.status(bid)
    assert status.lost == [name] and status.complete is VOUCHED[name]
    queued = [json.loads(raw) for raw in r.lrange(K.queue("default"), 0, -1)]
    fired = sorted(job["args"][0]["event"] for job in queued if job["class"] == BatchCallbackJob.name)
    # (death too once the dead job is known pending; every callback went with meta)
    assert fired == {"meta": [], "pending": [], "open": ["death"]}.get(name, ["complete", "death"])


def test_jobs_handed_back_at_shutdown_are_named_in_the_log_at_most_20(launcher_factory, r, caplog):
    # "requeued 3000 job(s)" named none: an operator couldn't tell which were cut short.
    running = launcher_factory(CONCURRENCY=1)
    manager = running.manager
    manager.make_quiet()
    manager.fetcher.join()
    units = []
    for i in range(25):
        raw = payloads.encode({"jid": f"cut-{i:02d}", "class": Note.name, "args": ["x"], "kwargs": {},
                               "queue": "default"}).encode()
        r.lpush(running.in_progress, raw)
        units.append(Unit(raw, "default"))
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        assert manager.settler.requeue_unfinished(units) == 25
    (line,) = [m for m in caplog.messages if m.startswith("requeued 25 job(s) unfinished at shutdown: ")]
    assert line.endswith(" ".join(f"jid=cut-{i:02d}" for i in range(20)) + " (and 5 more)")
    assert r.llen(K.queue("default")) == 25


# -- held steps riding the fetch's own round trip (Outgoing) -----------------------------------------


def _fetch_with(fetch, queue, outgoing, rb):
    """One fetch carrying ``outgoing`` (as the fetcher makes it), with a job waiting; the queue told."""
    rb.lpush(K.queue("default"), job(9))
    units = fetch.retrieve(1, frozenset(), outgoing)
    queue.sent(outgoing)
    return units


def test_batch_steps_ride_the_fetch_and_their_acks_the_next_one(batch, rb):
    # One round trip for the steps and the fetch: the steps queued on its pipeline before the fetch
    # script. Their acks wait for the next fetch, once the steps are known to have landed: a step
    # always goes through before its job's ack.
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    queue.open()
    queue.put(job(0), steps[0])
    queue.put(job(1), ACKED)
    queue.put(job(2), steps[1])

    outgoing = queue.take(fetch.rides)
    assert outgoing.acks == [job(1)]
    units = _fetch_with(fetch, queue, outgoing, rb)

    assert len(units) == 1
    assert Batch.status(bid).success  # (the steps landed with the fetch)
    listed = rb.lrange(fetch.in_progress, 0, -1)
    assert job(1) not in listed and job(0) in listed and job(2) in listed  # (job 1's ack rode it)
    assert sorted(queue.held()) == [job(0), job(2)]  # (their acks, for the next fetch)
    assert sorted(queue.take(fetch.rides).acks) == [job(0), job(2)]


@pytest.mark.usefixtures("fresh_limiters")
def test_a_release_rides_the_fetch_with_its_own_ack(batch, rb):
    queue, fetch, settler = batch
    limiter = Limiter.concurrent(unique("ride"), 5, lease=60)
    gate = LimitGate(rb, K, over_limit_max=3, retry=settler.retry)
    settler.runners.update(ClassLimits(gate).step_runners())
    ticket = gate.take({"jid": "j0"}, [limiter])
    assert isinstance(ticket, Ticket) and rb.zcard(K.limit(limiter.name).holders) == 1
    queue.open()
    queue.put(job(0), ACKED.first(Release(ticket, "j0")))

    outgoing = queue.take(fetch.rides)
    assert outgoing.acks == [job(0)]  # (unordered: its ack goes with its release)
    _fetch_with(fetch, queue, outgoing, rb)

    assert rb.zcard(K.limit(limiter.name).holders) == 0
    assert job(0) not in rb.lrange(fetch.in_progress, 0, -1) and queue.held() == []


@pytest.mark.usefixtures("fresh_limiters")
def test_releases_held_past_the_cap_go_with_their_acks_in_one_round_trip(batch, rb, monkeypatch):
    # Every job of a concurrency limit has a release to send: past the cap, the releases and the
    # acks went in two round trips of their own.
    queue, fetch, settler = batch
    limiter = Limiter.concurrent(unique("cap"), 5, lease=60)
    gate = LimitGate(rb, K, over_limit_max=3, retry=settler.retry)
    settler.runners.update(ClassLimits(gate).step_runners())
    rb.lpush(fetch.in_progress, job(3))
    tickets = [gate.take({"jid": f"j{n}"}, [limiter]) for n in range(4)]
    assert rb.zcard(K.limit(limiter.name).holders) == 4
    queue.open()
    for n in range(3):
        queue.put(job(n), ACKED.first(Release(tickets[n], f"j{n}")))
    trips = round_trips(monkeypatch)
    queue.put(job(3), ACKED.first(Release(tickets[3], "j3")))  # one more than the cap
    assert trips["n"] == 1
    monkeypatch.undo()
    assert rb.zcard(K.limit(limiter.name).holders) == 0 and rb.llen(fetch.in_progress) == 0
    assert queue.held() == [] and settler.pending_settlements() == {}


@pytest.mark.usefixtures("fresh_limiters")
def test_releases_past_the_cap_whose_round_trip_fails_stay_pending_and_their_acks_behind_them(batch, rb,
                                                                                              monkeypatch):
    queue, fetch, settler = batch
    limiter = Limiter.concurrent(unique("capfail"), 5, lease=60)
    gate = LimitGate(rb, K, over_limit_max=3, retry=settler.retry)
    settler.runners.update(ClassLimits(gate).step_runners())
    rb.lpush(fetch.in_progress, job(3))
    tickets = [gate.take({"jid": f"j{n}"}, [limiter]) for n in range(4)]
    queue.open()

    def cut(self, *args, **kwargs):
        raise redis.ConnectionError("Redis went away (injected)")

    monkeypatch.setattr(redis.client.Pipeline, "execute", cut)
    for n in range(4):
        queue.put(job(n), ACKED.first(Release(tickets[n], f"j{n}")))  # (the fourth sends: nothing raises)
    pending = settler.pending_settlements()
    assert sorted(pending) == [job(n) for n in range(4)] and all(len(left.steps) == 1 for left in pending.values())
    assert rb.zcard(K.limit(limiter.name).holders) == 4 and rb.llen(fetch.in_progress) == 4
    monkeypatch.undo()
    assert settler.retry_pending_settlements() == 0  # the release, then the ack
    assert rb.zcard(K.limit(limiter.name).holders) == 0 and rb.llen(fetch.in_progress) == 0


def test_a_job_of_a_batch_under_a_limit_has_both_steps_ride_one_fetch_and_its_ack_the_next(batch, rb):
    # Both features add a step: the batch's (ordered) and the release (unordered), on one pipeline.
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    limiter = Limiter.concurrent(unique("both"), 5, lease=60)
    gate = LimitGate(rb, K, over_limit_max=3, retry=settler.retry)
    settler.runners.update(ClassLimits(gate).step_runners())
    bid, (step,) = _batch_of(1)
    ticket = gate.take({"jid": "j0"}, [limiter])
    queue.open()
    queue.put(job(0), step.first(Release(ticket, "j0")))

    outgoing = queue.take(fetch.rides)
    assert outgoing.acks == []  # (its batch step is ordered: its ack waits for it to land)
    _fetch_with(fetch, queue, outgoing, rb)

    assert Batch.status(bid).success and rb.zcard(K.limit(limiter.name).holders) == 0
    assert queue.held() == [job(0)] and job(0) in rb.lrange(fetch.in_progress, 0, -1)
    assert queue.take(fetch.rides).acks == [job(0)]


def test_steps_riding_a_fetch_redis_refuses_stay_pending_and_their_acks_behind_them(batch, rb, monkeypatch):
    queue, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(1)
    queue.open()
    queue.put(job(0), steps[0])
    outgoing = queue.take(fetch.rides)
    rb.client_pause(30_000, all=False)  # (a real outage of writes: the fetch's round trip times out)
    slow = ReliableFetch(make_config(fetch.config.redis_url, REDIS_OPTIONS={"socket_timeout": 0.3}),
                         make_redis(make_config(fetch.config.redis_url, REDIS_OPTIONS={"socket_timeout": 0.3})),
                         K, fetch.identity)
    try:
        with pytest.raises(redis.TimeoutError) as raised:
            slow.retrieve(1, frozenset(), outgoing)
    finally:
        rb.client_unpause()
    queue.sent(outgoing, raised.value)
    assert list(settler.pending_settlements().values()) == [steps[0]]
    assert settler.retry_pending_settlements() == 0
    assert Batch.status(bid).success and job(0) not in rb.lrange(fetch.in_progress, 0, -1)
