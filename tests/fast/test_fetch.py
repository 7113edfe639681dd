"""The fetch contract (engine/fetch/contract.py), one suite run against ReliableFetch and BasicFetch.

Outage tests use a redis-server of their own, made to refuse writes as a failover (READONLY) or a
full memory (OOM) does, and run the fetch under the Watchdog as the manager's fetcher thread does.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
import time

import pytest
import redis
from engine_fixtures import fetch_mode_fixture, make_config  # noqa: F401 - the fetch_mode fixture
from helpers import RedisServer, refuse, serve_again

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.basic import BasicFetch
from django_cogworker.engine.fetch.contract import Fetch, Unit
from django_cogworker.engine.fetch.registry import make_fetch as make_strategy
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.engine.loops import Watchdog
from django_cogworker.engine.settle.outgoing import Outgoing
from django_cogworker.engine.settle.retry import Filing
from django_cogworker.push import payload as payloads

K = Keys()
MODES = {"reliable": ReliableFetch, "basic": BasicFetch}


@pytest.fixture
def bclient(redis_url):
    """A bytes client as the engine uses (default options: a blocking fetch may wait 2 s)."""
    client = make_redis(make_config(redis_url, REDIS_OPTIONS={}))
    yield client
    client.close()


def _builder(redis_url, client, cls):
    def build(queues=("default",), seed=1, **settings):
        config = make_config(redis_url, QUEUES=list(queues), REDIS_OPTIONS={}, **settings)
        return cls(config, client, K, "host:1:abc", rng=random.Random(seed))

    return build


@pytest.fixture
def make_fetch(redis_url, bclient, fetch_mode):
    return _builder(redis_url, bclient, MODES[fetch_mode])


@pytest.fixture
def make_reliable(redis_url, bclient):
    """For what only the reliable fetch has: the in-progress list."""
    return _builder(redis_url, bclient, ReliableFetch)


def job(queue="default", n=0, **extra):
    return payloads.encode({"jid": f"{queue}-{n}", "class": "x.Job", "args": [n], "kwargs": {}, "queue": queue,
                            "retry": True, **extra})


def enqueue(r, queue, *raws):
    """Push in order: the first given is the first fetched."""
    for raw in raws:
        r.lpush(K.queue(queue), raw)


def raws(units):
    return [u.raw.decode() for u in units]


def test_retrieve_takes_oldest_first_and_never_more_than_n(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    pushed = [job(n=i) for i in range(5)]
    enqueue(r, "default", *pushed)

    units = fetch.retrieve(3)

    assert raws(units) == pushed[:3]
    assert {u.queue for u in units} == {"default"}
    assert r.lrange(K.queue("default"), 0, -1) == pushed[:2:-1]
    if fetch_mode == "reliable":
        # What this process holds is on its in-progress list, byte for byte.
        assert sorted(r.lrange(fetch.in_progress, 0, -1)) == sorted(pushed[:3])
    else:
        assert not r.exists(fetch.in_progress)


def test_retrieve_spans_queues_but_stops_at_n(make_fetch, fetch_mode, r):
    fetch = make_fetch(queues=("a", "b"), STRICT_QUEUES=True)
    enqueue(r, "a", job("a", 0), job("a", 1))
    enqueue(r, "b", *(job("b", i) for i in range(5)))

    units = fetch.retrieve(4)

    assert [(u.queue, json.loads(u.raw)["args"][0]) for u in units] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert r.llen(K.queue("b")) == 3
    if fetch_mode == "reliable":
        assert r.llen(fetch.in_progress) == 4


def test_weighted_queues_roughly_honour_their_weights(make_fetch, r):
    fetch = make_fetch(queues=("heavy,3", "light,1"), seed=42)
    pipe = r.pipeline()
    for q in ("heavy", "light"):
        pipe.lpush(K.queue(q), *(job(q, i) for i in range(400)))
    pipe.execute()

    taken = collections.Counter(fetch.retrieve(1)[0].queue for _ in range(400))

    assert 0.65 < taken["heavy"] / 400 < 0.85, taken
    assert taken["light"] > 0


def test_strict_queues_are_taken_strictly_in_order(make_fetch, r):
    fetch = make_fetch(queues=("a", "b", "c"), STRICT_QUEUES=True)
    enqueue(r, "c", *(job("c", i) for i in range(3)))
    enqueue(r, "b", *(job("b", i) for i in range(3)))

    order = [fetch.retrieve(1)[0].queue for _ in range(6)]

    assert order == ["b", "b", "b", "c", "c", "c"]


def test_paused_queues_are_not_fetched(make_fetch, fetch_mode, r):
    fetch = make_fetch(queues=("a", "b"))
    enqueue(r, "a", *(job("a", i) for i in range(3)))
    enqueue(r, "b", *(job("b", i) for i in range(3)))

    units = fetch.retrieve(10, paused=frozenset({"a"}))

    assert {u.queue for u in units} == {"b"} and len(units) == 3
    assert r.llen(K.queue("a")) == 3
    # Everything paused: nothing taken, and no blocking wait either.
    assert fetch.retrieve(10, paused=frozenset({"a", "b"})) == []
    assert fetch.wait(paused=frozenset({"a", "b"})) == []
    assert r.llen(K.queue("a")) == 3


def test_a_queue_of_the_wrong_type_is_skipped_and_nothing_is_stranded(make_fetch, fetch_mode, r, caplog):
    fetch = make_fetch(queues=("one", "bad", "two"), STRICT_QUEUES=True)
    enqueue(r, "one", job("one", 0))
    r.set(K.queue("bad"), "not a list")
    enqueue(r, "two", *(job("two", i) for i in range(5)))

    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        units = fetch.retrieve(4)

    assert "queue 'bad' can't be fetched from (WRONGTYPE" in caplog.text
    assert "the key guard will quarantine it" in caplog.text

    assert [(u.queue, json.loads(u.raw)["args"][0]) for u in units] == [("one", 0), ("two", 0), ("two", 1),
                                                                          ("two", 2)]
    assert r.get(K.queue("bad")) == "not a list"
    assert r.llen(K.queue("two")) == 2
    if fetch_mode == "reliable":
        # Exactly what was returned, no more: a job moved but not reported would be stranded.
        assert sorted(r.lrange(fetch.in_progress, 0, -1)) == sorted(raws(units))


def test_a_queue_of_the_wrong_type_in_random_order_never_loses_a_job(make_fetch, fetch_mode, r):
    fetch = make_fetch(queues=("one", "bad", "two"), seed=3)
    r.set(K.queue("bad"), "not a list")
    pushed = {job(q, i) for q in ("one", "two") for i in range(10)}
    for raw in pushed:
        enqueue(r, json.loads(raw)["queue"], raw)

    taken = []
    for _ in range(40):
        taken += fetch.retrieve(3)
        if len(taken) == len(pushed):
            break

    assert sorted(raws(taken)) == sorted(pushed)
    if fetch_mode == "reliable":
        assert sorted(r.lrange(fetch.in_progress, 0, -1)) == sorted(pushed)


def _push_later(r, queue, raw, delay=0.2):
    def push():
        time.sleep(delay)
        r.lpush(K.queue(queue), raw)

    thread = threading.Thread(target=push)
    thread.start()
    return thread


def test_the_blocking_wait_returns_a_job_pushed_during_it(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    raw = job(n=7)
    pusher = _push_later(r, "default", raw)
    try:
        units = fetch.retrieve(1) or fetch.wait()  # nothing waiting: the wait blocks, and the push wakes it
    finally:
        pusher.join()

    assert raws(units) == [raw]
    if fetch_mode == "reliable":
        assert r.lrange(fetch.in_progress, 0, -1) == [raw]


def test_the_blocking_wait_still_works_beside_a_queue_of_the_wrong_type(make_fetch, fetch_mode, r):
    # The blocking call used to include the broken queue: it failed at once, so the fetcher spun
    # on Redis without ever waiting (until the key guard's next round).
    fetch = make_fetch(queues=("bad", "good"), STRICT_QUEUES=True)
    r.set(K.queue("bad"), "not a list")
    raw = job("good", 1)
    pusher = _push_later(r, "good", raw)
    try:
        units = fetch.retrieve(1) or fetch.wait()
    finally:
        pusher.join()

    assert raws(units) == [raw]
    assert r.get(K.queue("bad")) == "not a list"


def test_ack_removes_one_copy_from_in_progress(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    twin, other = job(n=1), job(n=2)
    enqueue(r, "default", twin, twin, other)
    units = fetch.retrieve(3)

    fetch.ack(units[0].raw)

    if fetch_mode == "reliable":
        assert sorted(r.lrange(fetch.in_progress, 0, -1)) == sorted([twin, other])
    else:
        assert not r.exists(fetch.in_progress)  # nothing to acknowledge: basic holds jobs in memory
    assert r.llen(K.queue("default")) == 0


def test_file_puts_the_job_in_retry_and_acks_it_in_one_step(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    raw = job(n=1)
    enqueue(r, "default", raw)
    (unit,) = fetch.retrieve(1)
    payload = payloads.decode(unit.raw)
    payload.update(retry_count=0, error_class="RuntimeError")
    filing = Filing("retry", 12345.5, payload)

    fetch.file(unit.raw, filing, None)

    assert r.zrange(K.retry, 0, -1, withscores=True) == [(filing.raw(), 12345.5)]
    assert r.llen(fetch.in_progress) == 0


def test_file_that_fails_does_not_ack(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    raw = job(n=1)
    enqueue(r, "default", raw)
    (unit,) = fetch.retrieve(1)
    r.set(K.retry, "not a zset")

    with pytest.raises(redis.ResponseError):
        fetch.file(unit.raw, Filing("retry", 1.0, payloads.decode(unit.raw)), None)

    if fetch_mode == "reliable":
        assert r.lrange(fetch.in_progress, 0, -1) == [raw]  # not filed, so not acknowledged either


def test_file_to_dead_trims_by_age_and_count(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    now = 1_000_000.0
    r.zadd(K.dead, {"ancient": now - 500, "old-1": now - 50, "old-2": now - 40, "old-3": now - 30})
    enqueue(r, "default", job(n=1))
    (unit,) = fetch.retrieve(1)
    filing = Filing("dead", now, payloads.decode(unit.raw))

    fetch.file(unit.raw, filing, (now - 100, 3))

    assert r.zrange(K.dead, 0, -1) == ["old-2", "old-3", filing.raw()]
    assert r.llen(fetch.in_progress) == 0


def test_requeue_puts_unfinished_jobs_back_to_run_next(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    first = [job(n=i) for i in range(2)]
    waiting = [job(n=i) for i in range(2, 4)]
    enqueue(r, "default", *first, *waiting)
    units = fetch.retrieve(2)

    assert fetch.requeue(units) == 2

    assert raws(fetch.retrieve(2)) == first  # ahead of the jobs that were waiting, in their order
    assert raws(fetch.retrieve(2)) == waiting
    if fetch_mode == "reliable":
        assert sorted(r.lrange(fetch.in_progress, 0, -1)) == sorted(first + waiting)


def test_reliable_requeue_drops_acks_and_leaves_keep(make_reliable, r):
    fetch = make_reliable()
    acked, kept, unfinished = job(n=1), job(n=2), job(n=3)
    enqueue(r, "default", acked, kept, unfinished)
    units = fetch.retrieve(3)

    moved = fetch.requeue([u for u in units if u.raw.decode() == unfinished], acks=[acked.encode()],
                          keep=[kept.encode()])

    assert moved == 1
    assert r.lrange(fetch.in_progress, 0, -1) == [kept]
    assert r.lrange(K.queue("default"), 0, -1) == [unfinished]


def test_reliable_requeue_counts_copies(make_reliable, r):
    fetch = make_reliable()
    twin = job(n=1)
    enqueue(r, "default", twin, twin)
    units = fetch.retrieve(2)

    # One copy finished (its ack pending), the other didn't: one goes back, none stays.
    assert fetch.requeue(units[1:], acks=[twin.encode()]) == 1

    assert r.lrange(K.queue("default"), 0, -1) == [twin]
    assert r.llen(fetch.in_progress) == 0


def test_reliable_requeue_returns_unknown_entries_to_their_own_queue(make_reliable, r):
    fetch = make_reliable(queues=("default", "mail"))
    # Taken from Redis but never seen by this process (the reply was lost), and an unreadable one.
    lost_reply, garbage = job("mail", 1), "{not json"
    r.lpush(fetch.in_progress, lost_reply, garbage)

    assert fetch.requeue([]) == 1

    assert r.lrange(K.queue("mail"), 0, -1) == [lost_reply]
    assert r.lrange(fetch.in_progress, 0, -1) == [garbage]  # left for orphan recovery, not dropped
    assert "mail" in r.smembers(K.queues)


def test_requeue_with_one_unpushable_entry_still_requeues_the_others(make_fetch, fetch_mode, r):
    fetch = make_fetch(queues=("bad", "good"), STRICT_QUEUES=True)
    stuck = job("bad", 1)
    others = [job("good", i) for i in range(3)]
    enqueue(r, "bad", stuck)
    enqueue(r, "good", *others)
    units = fetch.retrieve(4)
    r.set(K.queue("bad"), "not a list")

    assert fetch.requeue(units) == 3

    assert sorted(r.lrange(K.queue("good"), 0, -1)) == sorted(others)
    assert r.get(K.queue("bad")) == "not a list"
    if fetch_mode == "reliable":
        assert r.lrange(fetch.in_progress, 0, -1) == [stuck]  # still held, for orphan recovery


def test_requeue_of_nothing_is_a_no_op(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    assert fetch.requeue([]) == 0
    assert r.dbsize() == 0


def test_unit_keeps_the_exact_bytes(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    raw = payloads.encode({"jid": "j", "class": "x.Job", "args": ["é", 2**64 + 1, 0.1], "kwargs": {},
                           "queue": "default"})
    enqueue(r, "default", raw)

    (unit,) = fetch.retrieve(1)

    assert unit == Unit(raw.encode(), "default")


# -- Redis refusing writes -------------------------------------------------------------------------


# Not (basic, oom): RPOP can only free memory, so Redis lets it through under OOM and basic fetch goes on.
@pytest.mark.parametrize("fetch_mode, how, with_acks", [("reliable", "readonly", False), ("reliable", "oom", False),
                                                  ("reliable", "readonly", True), ("basic", "readonly", False)])
def test_redis_refusing_writes_is_an_outage_logged_once_not_a_queue_to_quarantine(tmp_path, caplog, fetch_mode, how,
                                                                                 with_acks):
    """Logged as a queue "the key guard will quarantine", or (acks riding on the fetch) a traceback per try."""
    server = RedisServer(tmp_path).start()
    config = make_config(server.url, REDIS_OPTIONS={})
    client = make_redis(config)
    fetch = MODES[fetch_mode](config, client, K, "host:1:abc")
    watchdog = Watchdog("fetcher", threading.Event())
    acks = [job(n=99).encode()] if with_acks else []
    got: list[Unit] = []
    attempts = 0
    try:
        enqueue(client, "default", job(n=1))
        refuse(client, how)
        with caplog.at_level(logging.INFO, logger="django_cogworker"):
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                attempts += 1
                assert not watchdog.run_step(lambda: got.extend(fetch.retrieve(1, outgoing=Outgoing(acks))))
            serve_again(client)
            assert watchdog.run_step(lambda: got.extend(fetch.retrieve(1, outgoing=Outgoing(acks))))
    finally:
        client.close()
        server.cleanup()

    assert raws(got) == [job(n=1)]  # fetched at the first try once Redis serves again
    assert attempts <= 10  # backed off (0.1 s, 0.2 s, 0.4 s...), not spinning on Redis
    [lost, back] = [rec for rec in caplog.records if rec.name.startswith("django_cogworker")]
    assert lost.getMessage().startswith("fetcher: Redis refuses to serve (")
    assert {"readonly": "read only replica", "oom": "maxmemory"}[how] in lost.getMessage()
    assert lost.exc_info is None  # not a bug: no traceback
    assert back.levelno == logging.WARNING and back.getMessage().startswith("fetcher: Redis is back after ")


def test_a_fetch_failing_for_another_reason_is_still_logged_with_its_traceback_on_every_try(make_reliable, r,
                                                                                          caplog):
    fetch = make_reliable()
    r.set(fetch.in_progress, "not a list")  # the acks riding on the fetch can't be removed from it
    watchdog = Watchdog("fetcher", threading.Event())
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        for _ in range(2):
            assert not watchdog.run_step(lambda: fetch.retrieve(1, outgoing=Outgoing([b"done"])))
    records = [rec for rec in caplog.records if rec.name.startswith("django_cogworker")]
    assert [rec.getMessage() for rec in records] == ["fetcher failed (attempt 1); backing off",
                                                     "fetcher failed (attempt 2); backing off"]
    assert all(rec.exc_info for rec in records)


# -- the interface -------------------------------------------------------------------------------------


def test_a_job_taken_before_a_stall_is_started_only_while_still_ours(make_fetch, fetch_mode, r):
    # A process silent past ORPHAN_THRESHOLD may have been taken for dead, and the jobs it holds
    # requeued elsewhere (fetch/stall.py): it asks about one taken before then before starting it.
    fetch = make_fetch()
    enqueue(r, "default", job(n=1), job(n=2))
    kept, requeued = fetch.retrieve(2)
    if fetch_mode == "basic":  # what it took lives only in its memory: nobody else can take it back
        assert fetch.still_ours(kept) and fetch.still_ours(requeued) and fetch.stall.covers(0.0)
        assert not r.exists(K.last_beat)
        return
    r.lrem(fetch.in_progress, 1, requeued.raw)  # as orphan recovery does

    assert fetch.still_ours(kept) and not fetch.still_ours(requeued)

    # Stamped alive on the way: a recovery that takes the lock from then on leaves the list (orphans.py).
    seconds, _micros = r.time()
    assert abs(float(r.hget(K.last_beat, "host:1:abc")) - seconds) < 5
    assert r.sismember(K.in_progress_identities, "host:1:abc")
    r.set(K.orphan_lock("host:1:abc"), "live:2:def")  # another process recovering the list now
    assert not fetch.still_ours(kept)


def test_make_fetch_builds_the_strategy_the_config_names_and_each_is_a_fetch(redis_url, bclient, fetch_mode):
    fetch = make_strategy(make_config(redis_url, FETCH=fetch_mode), bclient, K, "host:1:abc")
    assert type(fetch) is MODES[fetch_mode] and isinstance(fetch, Fetch)
    assert not MODES[fetch_mode].__abstractmethods__  # every call the engine makes is declared and answered


def test_the_basic_fetch_answers_the_reliable_only_calls_without_touching_redis(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    r.lpush(fetch.in_progress, job(n=1))  # (what a reliable fetch would act on)
    suspects = fetch.reconcile(collections.Counter(), collections.Counter({job(n=1).encode(): 1}))
    if fetch_mode == "basic":
        assert (suspects, fetch.forget_if_empty(), fetch.heartbeat_writes(1.0)) == (collections.Counter(), True, [])
        assert r.lrange(fetch.in_progress, 0, -1) == [job(n=1)]
    else:
        assert r.llen(fetch.in_progress) == 0 and r.lrange(K.queue("default"), 0, -1) == [job(n=1)]
        assert [what for what, _write in fetch.heartbeat_writes(1.0)] == ["in-progress registry", "last-beat stamp"]
