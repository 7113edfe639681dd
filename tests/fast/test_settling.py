"""Settling (engine/settle/settling.py): acks, filings, pending settlements and the hand-off at shutdown.

Through a real in-process Launcher, and the ack batch on its own against the suite's Redis.
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
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import RedisServer, wait_until
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import Batch, Limiter
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.settle.acks import AckBatch
from django_cogworker.engine.settle.retry import Filing, RetryPolicy
from django_cogworker.engine.settle.settlement import ACK
from django_cogworker.engine.settle.settling import Settler
from django_cogworker.features.batches.steps import BatchStep, BatchSteps
from django_cogworker.features.limits.gate import LimitGate, Release, Ticket
from django_cogworker.features.limits.hook import ClassLimits
from django_cogworker.push import payload as payloads
from testproject.demo.jobs import BatchCallbackJob

K = Keys()
# Retries with backoff inside redis-py would only slow the outage tests down.
NO_RETRY = {"socket_timeout": 0.75, "socket_connect_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}


@pytest.fixture(params=["reliable", "basic"])
def fetch_mode(request):
    return request.param


def test_a_failed_filing_is_kept_in_memory_and_filed_later_by_the_heartbeat(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, KEY_GUARD_INTERVAL=3600)
    r.set(K.retry, "not a zset")  # after the key guard's boot round: FILE_FAILURE now fails

    pushed = running.push(Boom, token)

    pending = wait_until(running.manager.pending_settlements, message="a pending settlement")
    ((raw, how),) = pending.items()
    assert isinstance(how, Filing) and how.target == "retry" and how.payload["jid"] == pushed["jid"]
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
            assert list(pending.values()) == ["ack"]

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

    running.manager.settler.settle(raw, Filing("retry", time.time() + 60, payload))

    assert not running.manager.pending_settlements()
    (filed,) = r.zrange(K.retry, 0, -1)
    assert filed.startswith(raw.decode()[:-1])  # as fetched, the failure's fields appended
    assert (json.loads(filed)["error_message"], json.loads(filed)["retry_count"]) == ("boom", 0)
    assert "spoiled" not in json.loads(filed)
    assert r.llen(running.in_progress) == 0


# -- the ack batch on its own --------------------------------------------------------------------------


@pytest.fixture
def batch(redis_url, rb):
    """An AckBatch over a reliable fetch whose in-progress list holds three jobs: (batch, fetch, settler)."""
    fetch = ReliableFetch(make_config(redis_url), rb, K, "host:1:acks")
    settler = Settler(fetch, RetryPolicy(fetch.config))
    rb.lpush(fetch.in_progress, *(job(n) for n in range(3)))
    return AckBatch(fetch, settler, cap=3), fetch, settler


def job(n):
    return payloads.encode({"jid": f"j{n}", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default"}).encode()


def test_an_ack_goes_out_at_once_while_no_fetcher_runs(batch, rb):
    acks, fetch, _settler = batch
    acks.add(job(0))  # never opened: no fetcher loop to ride on
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    acks.open()
    acks.close()  # the fetcher's loop ended
    acks.add(job(1))
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)] and acks.take() == []


def test_an_ack_waits_for_the_next_fetch_while_the_fetcher_runs(batch, rb):
    acks, fetch, _settler = batch
    acks.open()
    acks.add(job(0))
    acks.add(job(1))
    assert rb.llen(fetch.in_progress) == 3  # no round trip of its own
    assert acks.held() == [job(0), job(1)]
    assert acks.take() == [job(0), job(1)]
    assert acks.take() == [] and acks.held() == []


def test_before_a_blocking_fetch_the_held_acks_go_out_and_later_ones_at_once(batch, rb):
    acks, fetch, _settler = batch
    acks.open()
    acks.add(job(0))
    acks.before_block()
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    acks.add(job(1))  # while the fetcher blocks
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)]
    acks.unblocked()
    acks.add(job(2))
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(2)] and acks.take() == [job(2)]


def test_held_acks_that_fail_before_a_block_are_kept_pending(batch, rb, monkeypatch):
    acks, fetch, settler = batch
    acks.open()
    acks.add(job(0))
    fail_acks(fetch, lambda raw: True, monkeypatch)
    with pytest.raises(redis.ConnectionError):
        acks.before_block()  # (the fetcher's watchdog logs it and backs off)
    assert settler.pending_settlements() == {job(0): "ack"}
    assert rb.llen(fetch.in_progress) == 3


def test_no_more_acks_are_held_than_the_cap_the_one_beyond_sends_them_all_itself(batch, rb):
    # A process killed, or taken for dead after a stall, runs again each finished job whose ack it
    # still held: a -c 2 worker taking 4 ahead per processor held up to 25 of them. The cap (the
    # concurrency: 3 here) bounds that to one per processor.
    acks, fetch, _settler = batch
    rb.lpush(fetch.in_progress, *(job(n) for n in range(3, 6)))
    acks.open()
    for n in range(3):
        acks.add(job(n))
    assert rb.llen(fetch.in_progress) == 6 and acks.held() == [job(0), job(1), job(2)]  # (up to the cap: held)
    acks.add(job(3))  # one more than the cap: the adding processor sends them all, in one round trip
    assert rb.lrange(fetch.in_progress, 0, -1) == [job(5), job(4)] and acks.held() == []
    acks.add(job(4))
    assert acks.held() == [job(4)] and rb.llen(fetch.in_progress) == 2


def test_acks_sent_at_the_cap_that_fail_are_kept_pending_and_the_job_that_sent_them_goes_on(batch, rb, monkeypatch):
    acks, fetch, settler = batch
    rb.lpush(fetch.in_progress, job(3))
    acks.open()
    fail_acks(fetch, lambda raw: True, monkeypatch)
    for n in range(4):
        acks.add(job(n))  # (the fourth sends: no exception reaches its processor)
    assert settler.pending_settlements() == {job(n): "ack" for n in range(4)} and acks.held() == []
    assert rb.llen(fetch.in_progress) == 4
    monkeypatch.undo()
    assert settler.retry_pending_settlements() == 0 and rb.llen(fetch.in_progress) == 0


def _batch_of(count, callbacks=False):
    """A committed batch of ``count`` jobs (pushed, never run): (bid, their success steps). With
    ``callbacks``, one on each event (pushed to ``default``, never run here)."""
    from testproject.demo.jobs import RecordJob

    batch = Batch()
    for event in ("complete", "success", "death") if callbacks else ():
        batch.on(event, BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [RecordJob.perform_async("x") for _ in range(count)]
    return batch.bid, [BatchStep(batch.bid, jid, "success", "", "ack") for jid in jids]


def test_a_batch_job_s_step_waits_with_its_ack_and_goes_through_before_the_fetch_that_acks_it(batch, rb):
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    acks.open()
    acks.add(job(0), steps[0])
    acks.add(job(1))
    acks.add(job(2), steps[1])
    assert Batch.status(bid).pending == 2 and rb.llen(fetch.in_progress) == 3  # no round trip of its own
    assert sorted(acks.held()) == [job(0), job(1), job(2)]
    assert sorted(acks.take()) == [job(0), job(1), job(2)]  # (their steps ran: the acks may ride now)
    assert Batch.status(bid).success and rb.llen(fetch.in_progress) == 3
    assert acks.take() == [] and acks.held() == []


def test_held_steps_go_through_before_a_blocking_fetch_and_later_ones_at_once_with_their_ack(batch, rb):
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    acks.open()
    acks.add(job(0), steps[0])
    acks.before_block()
    assert Batch.status(bid).pending == 1 and rb.lrange(fetch.in_progress, 0, -1) == [job(2), job(1)]
    acks.add(job(1), steps[1])  # while the fetcher blocks
    assert Batch.status(bid).success and rb.lrange(fetch.in_progress, 0, -1) == [job(2)]


def test_held_steps_at_the_cap_go_through_before_the_acks_sent_with_them(batch, rb):
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    rb.lpush(fetch.in_progress, job(3))
    acks.open()
    acks.add(job(0), steps[0])
    acks.add(job(1))
    acks.add(job(2))
    assert Batch.status(bid).pending == 2 and rb.llen(fetch.in_progress) == 4
    acks.add(job(3), steps[1])  # one more than the cap
    assert Batch.status(bid).success and rb.llen(fetch.in_progress) == 0 and acks.held() == []


def test_held_steps_redis_refuses_stay_pending_with_their_acks_behind_them(batch, rb, monkeypatch):
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(1)

    def refused(self, steps):
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(BatchSteps, "run_many", refused)
    acks.open()
    acks.add(job(0), steps[0])
    acks.add(job(1))
    assert acks.take() == [job(1)]  # (a plain ack rides on as ever; the other waits for its step)
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
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(3, callbacks=True)
    bk = K.batch(bid)
    r.set(getattr(bk, name), "not mine")
    acks.open()
    with caplog.at_level(logging.INFO):
        acks.add(job(0), steps[0])
        acks.add(job(1), steps[1])
        settler.settle(job(2), steps[2]._replace(outcome="dead", record='{"error": "x"}'))  # (alone)
        assert sorted(acks.take()) == [job(0), job(1)]
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


# -- held steps riding the fetch's own round trip (Ride) ---------------------------------------------


def _fetch_with(fetch, taken, ride, rb):
    """One fetch carrying ``ride`` (as the fetcher makes it), with a job waiting so it doesn't block."""
    rb.lpush(K.queue("default"), job(9))
    return fetch.retrieve(1, frozenset(), taken, None, ride)


def test_batch_steps_ride_the_fetch_and_their_acks_the_next_one(batch, rb):
    # One round trip for the steps and the fetch: the steps queued on its pipeline before the fetch
    # script. Their acks wait for the next fetch, once the steps are known to have landed: a step
    # always goes through before its job's ack.
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(2)
    acks.open()
    acks.add(job(0), steps[0])
    acks.add(job(1))
    acks.add(job(2), steps[1])

    ride = acks.ride()
    assert ride.acks == [job(1)]
    units = _fetch_with(fetch, ride.acks, ride, rb)

    assert len(units) == 1
    assert Batch.status(bid).success  # (the steps landed with the fetch)
    listed = rb.lrange(fetch.in_progress, 0, -1)
    assert job(1) not in listed and job(0) in listed and job(2) in listed  # (job 1's ack rode it)
    assert sorted(acks.held()) == [job(0), job(2)]  # (their acks, for the next fetch)
    assert sorted(acks.ride().acks) == [job(0), job(2)]


@pytest.mark.usefixtures("fresh_limiters")
def test_a_release_rides_the_fetch_with_its_own_ack(batch, rb):
    acks, fetch, settler = batch
    limiter = Limiter.concurrent(unique("ride"), 5, lease=60)
    gate = LimitGate(rb, K, over_limit_max=3, retry=settler.retry)
    settler.runners.update(ClassLimits(gate).step_runners())
    ticket = gate.take({"jid": "j0"}, [limiter])
    assert isinstance(ticket, Ticket) and rb.zcard(K.limit(limiter.name).holders) == 1
    acks.open()
    acks.add(job(0), Release(ticket, "j0", ACK))

    ride = acks.ride()
    assert ride.acks == [job(0)]  # (unordered: its ack goes with its release)
    _fetch_with(fetch, ride.acks, ride, rb)

    assert rb.zcard(K.limit(limiter.name).holders) == 0
    assert job(0) not in rb.lrange(fetch.in_progress, 0, -1) and acks.held() == []


def test_steps_riding_a_fetch_redis_refuses_stay_pending_and_their_acks_behind_them(batch, rb, monkeypatch):
    acks, fetch, settler = batch
    settler.runners[BatchStep] = BatchSteps(fetch.redis, K, 3600.0)
    bid, steps = _batch_of(1)
    acks.open()
    acks.add(job(0), steps[0])
    ride = acks.ride()
    rb.client_pause(30_000, all=False)  # (a real outage of writes: the fetch's round trip times out)
    slow = ReliableFetch(make_config(fetch.config.redis_url, REDIS_OPTIONS={"socket_timeout": 0.3}),
                         make_redis(make_config(fetch.config.redis_url, REDIS_OPTIONS={"socket_timeout": 0.3})),
                         K, fetch.identity)
    try:
        with pytest.raises(redis.TimeoutError):
            slow.retrieve(1, frozenset(), ride.acks, None, ride)
    finally:
        rb.client_unpause()
    assert list(settler.pending_settlements().values()) == [steps[0]]
    assert settler.retry_pending_settlements() == 0
    assert Batch.status(bid).success and job(0) not in rb.lrange(fetch.in_progress, 0, -1)
