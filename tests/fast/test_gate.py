"""features/limits: what a processor checks before a job runs, for its limits (and expiry).

First the Gate on its own, with the real ReliableFetch, Settler and SettlementQueue on the suite's Redis
(a fixed clock and a seeded rng: scores are exact); then through a processor called on the test's
thread, for what it files (a key function that raises, a job refused once more than OVER_LIMIT_MAX
allows, an OverLimit raised by ``within`` in a job); last, a batch's jobs under a limit through a
running Launcher (their steps held for the fetch's round trip).
"""

from __future__ import annotations

import json
import logging
import random
import time

import pytest
from engine_fixtures import (
    RUNS,
    Note,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    make_processor_fixture,  # noqa: F401 - the make_processor fixture
    new_token,
    runs,
)
from helpers import refuse, serve_again, wait_until
from limiter_fixtures import fresh_limiters  # noqa: F401 - the fresh_limiters fixture

from django_cogworker import Batch, Job, Limiter
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.run.hooks import JobRun, Outcome
from django_cogworker.engine.settle.queue import SettlementQueue
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.engine.settle.settlement import ACK, Settlement
from django_cogworker.engine.settle.settling import Settler
from django_cogworker.errors import LimitError, LimitKeyError, OverLimit
from django_cogworker.features.expiry.hook import Expiry
from django_cogworker.features.limits import scripts as limit_scripts
from django_cogworker.features.limits.gate import (
    BACKOFF_MAX,
    UNREACHABLE_DELAY,
    LimitGate,
    Release,
    Releases,
    Ticket,
)
from django_cogworker.features.limits.hook import ClassLimits
from django_cogworker.features.limits.limiter import HELD, SEEN, holder_token
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import JobSetter

K = Keys()
NOW = 4_000_000_000.0  # the gate's clock: in 2096, so no poller of the run takes a rescheduled job as due

# Defined at import, so registered for the whole run: leases a check at any heartbeat can accept.
one_at_a_time = Limiter.concurrent("test:gate:one", 1)
two_a_minute = Limiter.bucket("test:gate:minute", 2, per=60)
three_at_a_time = Limiter.concurrent("test:gate:three", 3)
per_customer = Limiter.concurrent(lambda customer, *_: f"test:gate:cust:{customer['id']}", 1,
                                  family="test:gate:cust")


class OneAtATime(Job):
    limits = [one_at_a_time]

    def perform(self, token):
        RUNS[token].append(self.jid)


class ThreeAtATime(Job):
    limits = [three_at_a_time]

    def perform(self, token):
        RUNS[token].append(self.jid)


class OneAndRate(Job):
    limits = [one_at_a_time, two_a_minute]

    def perform(self, token):
        RUNS[token].append(self.jid)


class RateOnly(Job):
    limits = [two_a_minute]

    def perform(self, token):
        RUNS[token].append(self.jid)


class PerCustomer(Job):
    limits = [per_customer]

    def perform(self, customer, token):
        RUNS[token].append(self.jid)


class FailsUnderItsLimit(Job):
    limits = [one_at_a_time]

    def perform(self, token):
        RUNS[token].append(self.jid)
        raise RuntimeError("failed holding its place")


class WaitsWithin(Job):
    """Takes a place in ``one_at_a_time`` itself, not waiting: over it, OverLimit leaves perform."""

    def perform(self, token):
        RUNS[token].append(self.jid)
        with one_at_a_time.within(wait=0):
            RUNS[token].append("inside")


DROPPED, RESCHEDULED, FREE = "dropped", "rescheduled", None  # what ``Parts.enter`` says became of a job


class Parts:
    def __init__(self, rb, gate: LimitGate, fetch: ReliableFetch, settler: Settler, keys: Keys):
        self.rb, self.gate, self.fetch, self.settler = rb, gate, fetch, settler
        self.features = (Expiry(rb, keys, clock=lambda: NOW), ClassLimits(gate))

    def enter(self, raw: bytes, payload: dict, job_class: type) -> Ticket | str | None:
        """What the processor does before a job runs, with the expiry and limits features: the
        ticket of the places the job holds (None: none), or DROPPED / RESCHEDULED once settled."""
        run = JobRun(Unit(raw, "default"), payload, job_class, str(payload.get("jid")), job_class.__name__)
        for feature in self.features:
            if not feature.applies(job_class):
                continue
            decision = feature.before(run)
            if decision is not None:
                self.settler.settle(raw, decision.settlement)
                run.decision = decision
                feature.after(run)  # (a job refused by a concurrency limit waits on it: parked)
                return DROPPED if decision.outcome is Outcome.DEAD else RESCHEDULED
        return run.notes.get("limits")

    def fetched(self, job: type[Job], *args, **fields) -> tuple[bytes, dict]:
        """A job of ``job`` as the fetch hands it over: on the in-progress list, raw and decoded."""
        payload = {**JobSetter(job, {}).build(list(args), {}, now=NOW - 10), **fields}
        raw = payloads.encode(payload).encode()
        self.rb.lpush(self.fetch.in_progress, raw)
        return raw, payloads.decode(raw)

    def scheduled(self) -> list[tuple[dict, float]]:
        return [(json.loads(raw), score) for raw, score in self.rb.zrange(K.schedule, 0, -1, withscores=True)]


def make_parts(redis_url, rb, keys: Keys = K, over_limit_max: int = 3) -> Parts:
    config = make_config(redis_url, OVER_LIMIT_MAX=over_limit_max)
    fetch = ReliableFetch(config, rb, K, "host:1:gate")
    retry = RetryPolicy(config, clock=lambda: NOW)
    settler = Settler(fetch, retry)
    gate = LimitGate(rb, keys, over_limit_max=config.over_limit_max, retry=retry, clock=lambda: NOW,
                     rng=random.Random(7))
    return Parts(rb, gate, fetch, settler, keys)


@pytest.fixture
def parts(redis_url, rb):
    return make_parts(redis_url, rb)


def occupy(rb, limiter: Limiter, key: str | None = None) -> str:
    """Take the place of a concurrency limit as another process's job (30 s lease)."""
    token = holder_token("someone-else")
    reply = limit_scripts.LIMIT_TAKE(rb, list(K.limit(key or limiter.name)), [token, "", "", *limiter.argv()])
    assert int(reply[0]) == 1
    return token


def spend_the_minute(rb, keys: Keys = K) -> float:
    """Make ``two_a_minute``'s two starts of this minute (not in its last half second: the job's
    take must come in the same minute); return the seconds left of it, on Redis's clock."""
    seconds, micros = rb.time()
    left = 60 - (seconds % 60 + micros / 1e6)
    if left < 0.5:
        time.sleep(left + 0.01)
        left = 60.0
    for _ in range(2):
        assert int(limit_scripts.LIMIT_TAKE(rb, list(keys.limit(two_a_minute.name)), [holder_token(None), "", "",
                                                                              *two_a_minute.argv()])[0])
    return left


def stat(rb, key: str, field: str) -> int:
    return int(rb.hget(K.limit(key).stats, field) or 0)


# -- the gate on its own -------------------------------------------------------------------------


def test_a_job_over_its_limit_goes_to_the_schedule_counted_over_limit_with_its_retry_count_untouched(parts, rb):
    occupy(rb, one_at_a_time)
    raw, payload = parts.fetched(OneAtATime, "t", retry_count=2, error_class="RuntimeError")

    assert parts.enter(raw, payload, OneAtATime) == RESCHEDULED

    ((filed, score),) = parts.scheduled()
    assert filed["jid"] == payload["jid"] and filed["over_limit"] == 1
    assert (filed["retry_count"], filed["error_class"]) == (2, "RuntimeError")  # (no failure recorded)
    assert NOW + 0.5 <= score <= NOW + 1.5  # a concurrency limit's first backoff: CONCURRENT_BACKOFF, jittered
    assert rb.llen(parts.fetch.in_progress) == 0  # acknowledged with its filing
    assert rb.llen(K.retry) == 0 and rb.zcard(K.retry) == 0
    assert (stat(rb, one_at_a_time.name, "over"), stat(rb, one_at_a_time.name, "rescheduled")) == (1, 1)


def test_a_job_rescheduled_over_its_limit_wakes_the_poller_for_its_due_time_and_a_hint_that_raises_parks_it_still(
        parts, rb, caplog):
    told: list[float] = []
    parts.gate.retry.on_retry = told.append  # (the Launcher's: its poller's ``expect``)
    occupy(rb, one_at_a_time)
    raw, payload = parts.fetched(OneAtATime, "t")

    assert parts.enter(raw, payload, OneAtATime) == RESCHEDULED

    ((_, score),) = parts.scheduled()
    assert told == [pytest.approx(score)]

    def gone(due):
        raise RuntimeError("the poller is gone")

    parts.gate.retry.on_retry = gone
    raw, payload = parts.fetched(OneAtATime, "u")
    with caplog.at_level(logging.ERROR):
        assert parts.enter(raw, payload, OneAtATime) == RESCHEDULED
    assert f"on_retry hook failed for jid={payload['jid']}" in caplog.text
    assert len(parts.scheduled()) == 2 and rb.zcard(K.limit(one_at_a_time.name).waiting) == 2  # (both parked)


def test_each_refusal_counts_once_more_and_waits_longer(parts, rb):
    occupy(rb, one_at_a_time)
    raw, payload = parts.fetched(OneAtATime, "t")
    waits = []
    for count in (1, 2, 3):
        assert parts.enter(raw, payload, OneAtATime) == RESCHEDULED
        ((filed, score),) = parts.scheduled()
        assert filed["over_limit"] == count
        waits.append(score - NOW)
        rb.delete(K.schedule)  # (as the poller moves it back to its queue, and a fetch takes it)
        raw = payloads.encode(filed).encode()
        payload = payloads.decode(raw)
        rb.lpush(parts.fetch.in_progress, raw)
    assert waits[0] < 1.5 < waits[2]  # CONCURRENT_BACKOFF (1 s) doubled with each refusal (x 0.5 to 1.5)


def test_past_over_limit_max_the_next_refusal_is_raised_for_the_processor_to_file(redis_url, rb):
    parts = make_parts(redis_url, rb, over_limit_max=2)
    occupy(rb, one_at_a_time)
    raw, payload = parts.fetched(OneAtATime, "t", over_limit=2)

    with pytest.raises(OverLimit) as info:
        parts.enter(raw, payload, OneAtATime)

    assert (info.value.key, info.value.kind) == (one_at_a_time.name, "concurrent")
    assert "over_limit" not in payload  # (counted afresh after the failure's retry)
    assert parts.scheduled() == [] and rb.llen(parts.fetch.in_progress) == 1  # the processor files it
    assert (stat(rb, one_at_a_time.name, "failed"), stat(rb, one_at_a_time.name, "rescheduled")) == (1, 0)


def test_a_rate_refusal_waits_at_least_until_its_next_place(parts, rb):
    until_next_minute = spend_the_minute(rb)
    raw, payload = parts.fetched(RateOnly, "t")

    assert parts.enter(raw, payload, RateOnly) == RESCHEDULED

    ((_filed, score),) = parts.scheduled()
    assert until_next_minute - 0.5 <= score - NOW <= until_next_minute + 1.2


def test_a_job_within_its_limits_gets_a_ticket_and_the_ticket_gives_the_place_back(parts, rb):
    SEEN.take()
    raw, payload = parts.fetched(OneAndRate, "t")

    ticket = parts.enter(raw, payload, OneAndRate)

    assert isinstance(ticket, Ticket)
    holders = K.limit(one_at_a_time.name).holders
    (token,) = rb.zrange(holders, 0, -1)
    assert json.loads(token)["jid"] == payload["jid"]
    assert HELD.by_key()[one_at_a_time.name][1] == [token.decode()]  # renewed by the heartbeat meanwhile
    assert set(SEEN.take()) == {one_at_a_time.name, two_a_minute.name}
    assert rb.llen(parts.fetch.in_progress) == 1  # (still there: it runs now)
    ticket.release()
    assert rb.zcard(holders) == 0 and one_at_a_time.name not in HELD.by_key()
    assert stat(rb, two_a_minute.name, "granted") == 1  # (a start, made: never given back)


def test_a_job_with_rate_limits_only_holds_nothing(parts, rb):
    raw, payload = parts.fetched(RateOnly, "t")
    assert parts.enter(raw, payload, RateOnly) is FREE
    assert stat(rb, two_a_minute.name, "granted") == 1


def test_one_limit_refusing_leaves_the_others_untaken(parts, rb):
    spend_the_minute(rb)
    raw, payload = parts.fetched(OneAndRate, "t")
    assert parts.enter(raw, payload, OneAndRate) == RESCHEDULED
    assert rb.zcard(K.limit(one_at_a_time.name).holders) == 0
    assert stat(rb, one_at_a_time.name, "granted") == 0


def test_on_a_cluster_a_later_refusal_undoes_the_earlier_keys_takes(redis_url, rb):
    spread = Keys("{cw}:", spread=True)
    parts = make_parts(redis_url, rb, keys=spread)
    assert spread.limit(one_at_a_time.name).holders != K.limit(one_at_a_time.name).holders
    spend_the_minute(rb, spread)
    raw, payload = parts.fetched(OneAndRate, "t")

    assert parts.enter(raw, payload, OneAndRate) == RESCHEDULED

    one = spread.limit(one_at_a_time.name)
    assert rb.zcard(one.holders) == 0  # taken in its own round trip, then given back
    assert rb.hget(one.stats, "granted") == b"0"


def test_a_key_function_that_raises_is_raised_with_nothing_taken(parts, rb):
    raw, payload = parts.fetched(PerCustomer, "not a dict", "t")
    with pytest.raises(LimitKeyError, match=r"the key function of limiter 'test:gate:cust' raised TypeError"):
        parts.enter(raw, payload, PerCustomer)
    assert parts.scheduled() == [] and rb.llen(parts.fetch.in_progress) == 1
    assert rb.keys("*limit*") == []


def test_a_key_function_gives_each_argument_its_own_limit(parts, rb):
    first = parts.enter(*parts.fetched(PerCustomer, {"id": 1}, "t"), PerCustomer)
    second = parts.enter(*parts.fetched(PerCustomer, {"id": 2}, "t"), PerCustomer)
    third = parts.enter(*parts.fetched(PerCustomer, {"id": 1}, "t"), PerCustomer)
    assert isinstance(first, Ticket) and isinstance(second, Ticket) and third == RESCHEDULED
    first.release()
    second.release()


def test_redis_refusing_every_write_while_taking_reschedules_the_job_uncounted(parts, rb, caplog):
    raw, payload = parts.fetched(OneAtATime, "t")
    refuse(rb, "noreplicas")  # (an outage: the take is refused, and so is the reschedule, until it ends)
    try:
        with caplog.at_level(logging.ERROR, logger="django_cogworker.features.limits.gate"):
            assert parts.enter(raw, payload, OneAtATime) == RESCHEDULED
    finally:
        serve_again(rb)
    assert parts.settler.retry_pending_settlements() == 0

    ((filed, score),) = parts.scheduled()
    assert score == NOW + UNREACHABLE_DELAY
    assert "over_limit" not in filed and "retry_count" not in filed
    assert rb.llen(parts.fetch.in_progress) == 0
    assert f"jid={payload['jid']}: its limits could not be taken (ResponseError: NOREPLICAS" in caplog.text


@pytest.mark.parametrize("name", ["holders", "stats", "waiting", "parked"])
def test_a_limiter_key_of_the_wrong_type_is_quarantined_at_once_and_the_job_let_in(parts, rb, r, caplog, name):
    # (Rescheduled uncounted instead, such a job came back every 2 s for ever, each try a WRONGTYPE
    # line in the log: no key guard round knows the keys of each limiter.)
    lk = K.limit(one_at_a_time.name)
    rb.set(getattr(lk, name), "not mine")
    raw, payload = parts.fetched(OneAtATime, "t")

    with caplog.at_level(logging.INFO):
        ticket = parts.enter(raw, payload, OneAtATime)
    assert isinstance(ticket, Ticket)
    (moved,) = r.scan_iter(match=f"{K.quarantine_prefix}{getattr(lk, name)}:*")
    assert r.get(moved) == "not mine" and r.ttl(moved) > 29 * 86400
    assert rb.hget(lk.stats, f"lost:{name}") is not None  # (the limiter says what it lost: admin, CLI)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert [rec.name for rec in errors] == ["django_cogworker.broker.quarantine"]  # (said once)
    assert rb.zcard(lk.holders) == 1  # (the place it took, in a fresh key if it was the one moved)
    ticket.release()
    assert rb.zcard(lk.holders) == 0 and parts.scheduled() == []


def test_a_take_redis_refuses_for_good_fails_the_job_instead_of_rescheduling_it_for_ever(parts, rb):
    # (A spec this worker's scripts don't know: the script's error reply, every time; rescheduled
    # uncounted as if Redis were away, the job came back every 2 s for ever.)
    odd = one_at_a_time.bind()
    odd.kind = "fancy"
    raw, payload = parts.fetched(OneAtATime, "t")

    with pytest.raises(LimitError, match="its limits could not be taken: ResponseError: unknown limiter kind fancy"):
        parts.enter(raw, payload, type("Odd", (), {"limits": [odd]}))
    assert parts.scheduled() == []


def test_a_job_past_its_expiry_is_dropped_before_its_limits_are_looked_at(parts, rb):
    occupy(rb, one_at_a_time)
    raw, payload = parts.fetched(OneAtATime, "t", expires_at=NOW - 1)
    assert parts.enter(raw, payload, OneAtATime) == DROPPED
    assert rb.get(K.stat_expired) == b"1" and rb.llen(parts.fetch.in_progress) == 0
    assert parts.scheduled() == [] and stat(rb, one_at_a_time.name, "over") == 0


# -- backoff -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bucket", "window", "leaky"])
def test_a_rate_kind_waits_at_least_its_retry_after_and_a_little_more(parts, kind):
    for retry_after in (0.0, 0.01, 0.7, 30.0):
        for count in (1, 5, 50):
            waits = [parts.gate.backoff(retry_after, count, kind) for _ in range(200)]
            assert all(retry_after <= w <= retry_after + 1.05 for w in waits), (retry_after, count)
    # Spread a little more each time the job lost the race (at most 1.05 s).
    assert max(parts.gate.backoff(1.0, 1, kind) for _ in range(200)) <= 1.0 + 0.1
    assert max(parts.gate.backoff(1.0, 20, kind) for _ in range(200)) > 1.0 + 0.5


def test_a_concurrency_refusal_waits_longer_with_each_count_and_no_longer_than_backoff_max(parts):
    def spread(retry_after, count):
        waits = [parts.gate.backoff(retry_after, count, "concurrent") for _ in range(300)]
        return min(waits), max(waits)

    assert spread(None, 1) == pytest.approx((0.5, 1.5), abs=0.05)  # CONCURRENT_BACKOFF when nothing is known
    assert spread(2.0, 1) == pytest.approx((1.0, 3.0), abs=0.05)  # how long places were held lately
    assert spread(2.0, 3) == pytest.approx((4.0, 12.0), abs=0.2)  # doubled with each refusal
    for retry_after, count in ((2.0, 6), (0.1, 30), (3600.0, 1)):
        low, high = spread(retry_after, count)
        assert BACKOFF_MAX / 2 - 1 < low and high <= BACKOFF_MAX, (retry_after, count, low, high)


def due_now(r) -> None:
    """Make the one job rescheduled in the schedule due now (its wait over)."""
    (raw,) = r.zrange(K.schedule, 0, -1)
    r.zadd(K.schedule, {raw: 0}, xx=True)


# -- through a called processor ----------------------------------------------------------------------


def test_a_key_function_that_raises_files_the_job_in_retry_never_drops_it(make_processor, r):
    token = new_token()
    called = make_processor()

    run = called.run(PerCustomer, "no id here", token)

    assert run.decision.outcome is Outcome.RETRY
    (filed,) = [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]
    assert filed["jid"] == run.payload["jid"] and filed["error_class"] == "django_cogworker.errors.LimitKeyError"
    assert "the key function of limiter 'test:gate:cust' raised TypeError" in filed["error_message"]
    assert filed["retry_count"] == 0 and runs(token) == []
    assert r.llen(called.in_progress) == 0  # acknowledged


def test_a_job_refused_once_more_than_over_limit_max_is_filed_in_retry_with_over_limit(make_processor, r, rb):
    token = new_token()
    occupy(rb, one_at_a_time)
    called = make_processor(OVER_LIMIT_MAX=1)
    pushed = called.push(OneAtATime, token)

    # Refused: rescheduled (counted over its limit), then, once due, refused once more than the max.
    assert called.run_next().decision.outcome is Outcome.RESCHEDULED
    due_now(r)
    assert called.sweep() == 1
    assert called.run_next().decision.outcome is Outcome.RETRY
    (filed,) = [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]
    assert filed["jid"] == pushed["jid"] and filed["error_class"] == "django_cogworker.errors.OverLimit"
    assert filed["retry_count"] == 0 and "over_limit" not in filed  # (its next refusals count afresh)
    assert runs(token) == []
    assert (stat(rb, one_at_a_time.name, "rescheduled"), stat(rb, one_at_a_time.name, "failed")) == (1, 1)


def test_a_job_rescheduled_over_its_limit_that_then_fails_counts_its_refusals_afresh(make_processor, r, rb):
    token = new_token()
    occupy(rb, one_at_a_time)
    called = make_processor(OVER_LIMIT_MAX=3)
    pushed = called.push(FailsUnderItsLimit, token)

    assert called.run_next().decision.outcome is Outcome.RESCHEDULED
    (waiting,) = [json.loads(raw) for raw in r.zrange(K.schedule, 0, -1)]
    assert waiting["over_limit"] == 1
    rb.delete(K.limit(one_at_a_time.name).holders)  # (the other holder gone: its place is free)
    due_now(r)
    assert called.sweep() == 1
    assert called.run_next().decision.outcome is Outcome.RETRY
    (filed,) = [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]
    assert filed["jid"] == pushed["jid"] and filed["error_message"] == "failed holding its place"
    # A failure: its next refusals count from 0 again, OVER_LIMIT_MAX of them before one fails it.
    assert filed["retry_count"] == 0 and "over_limit" not in filed
    assert runs(token) == [pushed["jid"]]


def test_over_limit_raised_by_within_in_a_job_reschedules_it_then_fails_it_past_the_max(make_processor, r, rb):
    token = new_token()
    occupy(rb, one_at_a_time)
    called = make_processor(OVER_LIMIT_MAX=1)
    pushed = called.push(WaitsWithin, token)

    assert called.run_next().decision.outcome is Outcome.RESCHEDULED
    due_now(r)
    assert called.sweep() == 1
    assert called.run_next().decision.outcome is Outcome.RETRY
    (filed,) = [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]
    assert filed["jid"] == pushed["jid"] and filed["error_class"] == "django_cogworker.errors.OverLimit"
    assert filed["retry_count"] == 0 and "over_limit" not in filed
    assert runs(token) == [pushed["jid"]] * 2  # rescheduled once (not a failure), then failed


def test_a_run_s_places_go_back_with_its_ack_in_the_fetch_s_round_trip_not_one_of_their_own(redis_url, rb):
    # Held with the acks (engine/settle/queue.py): the place stays taken until the fetcher's next
    # round trip, where every release held goes on the fetch's own pipeline with the acks; a job of
    # a batch has its batch step too (Settlement(ACK, (BatchStep, Release))), still held, still one
    # trip each.
    parts = make_parts(redis_url, rb)
    settler = parts.settler
    settler.runners.update(ClassLimits(parts.gate).step_runners())
    settlements = SettlementQueue(settler, cap=10)
    settlements.open()
    holders = K.limit(one_at_a_time.name).holders
    raw, payload = parts.fetched(OneAtATime, "t")
    ticket = parts.enter(raw, payload, OneAtATime)
    settlement = Settlement(ACK).first(Release(ticket, payload["jid"]))
    assert settlement.holdable

    settlements.put(raw, settlement)

    assert rb.zcard(holders) == 1 and rb.llen(parts.fetch.in_progress) == 1  # no round trip of its own
    outgoing = settlements.take(parts.fetch.rides)
    assert outgoing.acks == [raw]  # (unordered: its ack rides with its release)
    assert parts.fetch.retrieve(1, frozenset(), outgoing) == []  # (the one round trip: release, ack, fetch)
    settlements.sent(outgoing)
    assert rb.zcard(holders) == 0 and one_at_a_time.name not in HELD.by_key()
    assert rb.llen(parts.fetch.in_progress) == 0 and settlements.held() == []
    assert settler.pending_settlements() == {}


def test_a_release_redis_refuses_costs_the_job_nothing_its_place_lapses_with_its_lease(redis_url, rb, caplog):
    parts = make_parts(redis_url, rb)
    parts.settler.runners.update(ClassLimits(parts.gate).step_runners())
    raw, payload = parts.fetched(OneAtATime, "t")
    ticket = parts.enter(raw, payload, OneAtATime)
    refuse(rb, "noreplicas")
    try:
        with caplog.at_level(logging.ERROR):
            parts.settler.settle(raw, Settlement(ACK, (Release(ticket, payload["jid"]),)))
    finally:
        serve_again(rb)
    # (Refused, the release is logged and not kept: the ack went on, which Redis refused too.)
    assert "places not given back" in caplog.text
    assert list(parts.settler.pending_settlements().values()) == [Settlement(ACK)]
    assert parts.settler.retry_pending_settlements() == 0 and rb.llen(parts.fetch.in_progress) == 0


def test_jobs_of_a_batch_under_a_concurrency_limit_settle_their_step_and_give_their_place_back(launcher_factory, r,
                                                                                               rb):
    # Both features wrap the ack: the batch step around the release (BatchStep, then Release, then
    # ACK), each held for the fetch, each run in its round: the batch succeeds, no place is left.
    token = new_token()
    running = launcher_factory(CONCURRENCY=3)
    batch = Batch()
    with batch.jobs():
        jids = [OneAtATime.perform_async(token) for _ in range(6)]

    wait_until(lambda: sorted(runs(token)) == sorted(jids), timeout=30, message="every job ran")
    wait_until(lambda: Batch.status(batch.bid).pending == 0, message="every step settled")
    status = Batch.status(batch.bid)
    assert (status.total, status.failures, status.complete) == (6, 0, True)
    wait_until(lambda: r.llen(running.in_progress) == 0, message="every job acked")
    assert rb.zcard(K.limit(one_at_a_time.name).holders) == 0  # every place given back


def evalshas(rb) -> int:
    return int(rb.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_the_takes_of_the_jobs_one_fetch_brings_go_in_one_round_trip_and_each_job_finds_its_own(parts, rb):
    SEEN.take()
    limits = ClassLimits(parts.gate)
    units = []
    for n in range(4):
        raw, _payload = parts.fetched(OneAtATime if n < 3 else RateOnly, "t")
        units.append(Unit(raw, "default"))
    plain_raw, _plain = parts.fetched(Note, "t")
    units.append(Unit(plain_raw, "default"))  # (no limits: never read, nothing taken)
    rb.script_load(limit_scripts.LIMIT_TAKE_MANY.source)  # (as after a worker's first take)
    before = evalshas(rb)

    limits.fetched(units)

    assert evalshas(rb) - before == 1  # every take in one LIMIT_TAKE_MANY: one round trip
    assert units[4].notes is None
    first, second, third, rate = (u.notes["limits.fetched"] for u in units[:4])
    assert isinstance(first, Ticket) and isinstance(second, OverLimit) and isinstance(third, OverLimit)
    assert rate is None  # (a rate limit: nothing held)
    # Each job's turn: what the fetch got it, no round trip of its own for the take.
    taken = before_turns = evalshas(rb)
    run = JobRun(units[0], payloads.decode(units[0].raw), OneAtATime, "j", "OneAtATime")
    assert limits.before(run) is None and run.notes["limits"] is first
    refused = JobRun(units[1], payloads.decode(units[1].raw), OneAtATime, "j", "OneAtATime")
    decision = limits.before(refused)
    assert decision is not None and decision.outcome is Outcome.RESCHEDULED
    assert evalshas(rb) == taken == before_turns  # (rescheduling is the settlement's: no script yet)
    first.release()


def test_places_the_fetch_took_for_jobs_that_never_run_here_are_given_back(parts, rb):
    rb.script_flush()  # (Redis restarted, its scripts forgotten: each take is made again alone, and loads it)
    limits = ClassLimits(parts.gate)
    holders = K.limit(one_at_a_time.name).holders
    raw, _payload = parts.fetched(OneAtATime, "t")
    handed_back = Unit(raw, "default")
    limits.fetched([handed_back])
    assert rb.zcard(holders) == 1

    limits.returned([handed_back])  # (handed back at quiet or stop)

    assert rb.zcard(holders) == 0 and one_at_a_time.name not in HELD.by_key()
    # A job the fetch took for that a feature before it dropped (expired): its after gives it back.
    raw, payload = parts.fetched(OneAtATime, "t", expires_at=NOW - 1)
    dropped = Unit(raw, "default")
    limits.fetched([dropped])
    assert rb.zcard(holders) == 1
    run = JobRun(dropped, payload, OneAtATime, "j", "OneAtATime")
    assert parts.features[0].before(run) is not None  # (expiry drops it first)
    limits.after(run)
    assert rb.zcard(holders) == 0


def test_a_limiter_key_of_the_wrong_type_in_a_fetch_s_takes_is_moved_aside_and_each_job_holds_one_place(parts, rb, r):
    # (The fetch's takes are one call: stopped at the key, the takes are made again one at a time.)
    lk = K.limit(three_at_a_time.name)
    rb.set(lk.holders, "not mine")
    limits = ClassLimits(parts.gate)
    units = [Unit(parts.fetched(ThreeAtATime, "t")[0], "default") for _ in range(3)]

    limits.fetched(units)

    tickets = [unit.notes["limits.fetched"] for unit in units]
    assert all(isinstance(ticket, Ticket) for ticket in tickets)
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{lk.holders}:*"))) == 1
    assert sorted(rb.zrange(lk.holders, 0, -1)) == sorted(ticket.token.encode() for ticket in tickets)
    Releases(parts.gate).run_many([Release(ticket, "j") for ticket in tickets])
    assert rb.zcard(lk.holders) == 0 and three_at_a_time.name not in HELD.by_key()


def test_the_releases_held_for_a_round_trip_go_in_one_call_even_after_redis_forgot_its_scripts(parts, rb):
    lk = K.limit(three_at_a_time.name)
    limits = ClassLimits(parts.gate)
    releases = Releases(parts.gate)
    someone_else = holder_token("someone-else")
    rb.zadd(lk.holders, {someone_else: NOW})
    for _round in range(2):  # (the first after a restart: NOSCRIPT; the call again loads it)
        units = [Unit(parts.fetched(ThreeAtATime, "t")[0], "default") for _ in range(2)]
        limits.fetched(units)
        steps = [Release(unit.notes["limits.fetched"], "j") for unit in units]
        if _round == 0:
            rb.script_flush()
        before = evalshas(rb)
        pipe = rb.pipeline(transaction=False)
        assert releases.queue(pipe, steps) == 1  # (one script call for both)
        releases.landed(steps, pipe.execute(raise_on_error=False))
        assert evalshas(rb) - before == (2 if _round == 0 else 1)  # (NOSCRIPT, then the call again)
        assert rb.zrange(lk.holders, 0, -1) == [someone_else.encode()]  # (only their own places)
        assert three_at_a_time.name not in HELD.by_key()


def test_a_limited_job_s_payload_is_decoded_once_by_the_fetch_s_takes_and_run_as_decoded(make_processor, rb,
                                                                                         monkeypatch):
    # (It was decoded twice: by the takes on the fetcher thread, then by the processor.)
    token = new_token()
    called = make_processor()
    pushed = called.push(ThreeAtATime, token)
    unit = called.take()
    assert unit.notes is not None and unit.notes["payload"]["jid"] == pushed["jid"]
    decoded: list[bytes] = []
    real = payloads.decode
    monkeypatch.setattr(payloads, "decode", lambda raw: decoded.append(raw) or real(raw))

    run = called.processor.process(unit)

    assert run is not None and run.decision.outcome is Outcome.SUCCESS and runs(token) == [pushed["jid"]]
    assert decoded == [] and "payload" not in unit.notes


# -- the fetch's one call: one key with two specs, a key of the wrong type partway ---------------------


@pytest.mark.usefixtures("fresh_limiters")
def test_one_key_counted_by_two_limiters_of_different_specs_grants_no_more_than_its_size(parts, rb, caplog):
    # (Two key functions returning one key, the leases differing: the call's memo was per spec, each
    # counting only its own grants: 5 tickets for a limit of 3.)
    longer = Limiter.concurrent(lambda c: f"test:gate:shared:{c}", 3, lease=60, family="test:gate:famA")
    shorter = Limiter.concurrent(lambda c: f"test:gate:shared:{c}", 3, lease=30, family="test:gate:famB")
    wanted = [({"jid": f"j{n}", "args": [1]}, [longer if n % 2 == 0 else shorter]) for n in range(8)]

    with caplog.at_level(logging.WARNING):
        taken = parts.gate.take_many(wanted)
        parts.gate.take_many(wanted[:2])

    tickets = [t for t in taken if isinstance(t, Ticket)]
    assert len(tickets) == 3 and rb.zcard(K.limit("test:gate:shared:1").holders) == 3
    assert all(isinstance(t, OverLimit) for t in taken if not isinstance(t, Ticket))
    said = [rec for rec in caplog.records if "two specs" in rec.getMessage()]
    assert len(said) == 1 and "test:gate:shared:1" in said[0].getMessage()  # (said once per key)
    for ticket in tickets:
        ticket.release()


@pytest.mark.usefixtures("fresh_limiters")
def test_a_key_of_the_wrong_type_partway_through_a_fetch_s_takes_stops_them_before_any_write(parts, rb, r):
    # (Stopped at the key, the call kept what it wrote before it: made again alone, the first job
    # met its own window start and was refused, its concurrent place held under a token the
    # heartbeat didn't renew, and the second job's refusal was counted twice.)
    some = Limiter.concurrent("test:gate:some", 5)
    once = Limiter.window("test:gate:once", 1, per=60)
    bad = Limiter.concurrent("test:gate:bad", 5)
    rb.set(K.limit(bad.name).holders, "not mine")
    wanted = [({"jid": "j0", "args": []}, [some, once]), ({"jid": "j1", "args": []}, [once]),
              ({"jid": "j2", "args": []}, [bad])]

    first, second, third = parts.gate.take_many(wanted)

    assert isinstance(first, Ticket) and isinstance(second, OverLimit) and isinstance(third, Ticket)
    assert rb.zrange(K.limit(once.name).starts, 0, -1) == [f"{first.token}:2".encode()]
    assert rb.zrange(K.limit(some.name).holders, 0, -1) == [first.token.encode()]
    assert HELD.by_key()[some.name][1] == [first.token]
    assert rb.hmget(K.limit(once.name).stats, "granted", "over", "rescheduled") == [b"1", b"1", b"1"]  # (once)
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.limit(bad.name).holders}:*"))) == 1
    first.release()
    third.release()


@pytest.mark.usefixtures("fresh_limiters")
def test_a_stats_hash_of_the_wrong_type_in_a_fetch_s_takes_counts_each_start_once(parts, rb, r):
    # (The stats are written at the call's end: stopped there, every start had been written, and
    # made again they were counted twice.)
    bucket = Limiter.bucket("test:gate:bucket", 5, per=3600)
    rb.set(K.limit(bucket.name).stats, "not mine")

    taken = parts.gate.take_many([({"jid": f"j{n}", "args": []}, [bucket]) for n in range(3)])

    assert taken == [None, None, None]
    assert rb.hget(K.limit(bucket.name).state, "bc") == b"3"
    assert rb.hget(K.limit(bucket.name).stats, "granted") == b"3"
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.limit(bucket.name).stats}:*"))) == 1


@pytest.mark.usefixtures("fresh_limiters")
def test_a_key_of_the_wrong_type_in_the_grouped_releases_loses_no_wake_up(parts, rb, r):
    # (The call stopped at the key kept the earlier holder's pop of a waiting job, but lost the
    # reply carrying it: the job waited for its backoff, the place free.)
    single = Limiter.concurrent("test:gate:single", 1)
    bad = Limiter.concurrent("test:gate:bad", 5)
    mine, other = parts.gate.take_many([({"jid": "a", "args": []}, [single]), ({"jid": "b", "args": []}, [bad])])
    assert isinstance(mine, Ticket) and isinstance(other, Ticket)
    lk = K.limit(single.name)
    raw = payloads.encode({"jid": "w", "class": "Note", "queue": "default", "args": []})
    rb.zadd(K.schedule, {raw: NOW})
    limit_scripts.LIMIT_PARK(rb, [lk.waiting, lk.parked], ["w", raw, repr(NOW)])
    rb.delete(K.limit(bad.name).holders)
    rb.set(K.limit(bad.name).holders, "not mine")

    Releases(parts.gate).run_many([Release(mine, "a"), Release(other, "b")])

    assert rb.zcard(lk.holders) == 0 and rb.zcard(lk.waiting) == 0 and rb.hlen(lk.parked) == 0
    assert rb.lrange(K.queue("default"), 0, -1) != [] and rb.zcard(K.schedule) == 0  # (woken at once)
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.limit(bad.name).holders}:*"))) == 1
    assert single.name not in HELD.by_key() and bad.name not in HELD.by_key()
