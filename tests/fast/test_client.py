"""client: what a push writes to Redis, bulk pushes in one round trip, on_commit, client middleware."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
import redis
from django.db import transaction
from django.test import override_settings
from helpers import Proxy, RedisServer
from peek import queued_payloads
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import CogworkerError, Job, WrongTypeError, api
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.scripts import RECEIPT_TTL
from django_cogworker.conf import build_config
from django_cogworker.push.client import Client

MIDDLEWARE = "middleware_fixtures."


class Push(Job):
    def perform(self, *args, **kwargs):
        pass


class Boom(Exception):
    pass


def command_calls(r) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in r.info("commandstats").items()}


# -- what lands in Redis ----------------------------------------------------------------------------


def test_push_writes_the_documented_payload_to_the_queue_list(r):
    before = time.time()
    jid = Push.perform_async(1, "a", k={"x": [1]})
    after = time.time()
    assert r.type("cogworker:queue:default") == "list"
    assert r.smembers("cogworker:queues") == {"default"}
    (payload,) = queued_payloads(r)
    assert set(payload) == {"jid", "class", "args", "kwargs", "queue", "retry", "created_at", "enqueued_at"}
    assert (payload["jid"], payload["class"], payload["args"], payload["kwargs"]) == (
        jid, Push.name, [1, "a"], {"k": {"x": [1]}})
    assert (payload["queue"], payload["retry"]) == ("default", True)
    assert before <= payload["created_at"] <= payload["enqueued_at"] <= after
    assert isinstance(payload["enqueued_at"], float)


def test_pushes_run_in_push_order(r):
    jids = [Push.perform_async(i) for i in range(3)]
    assert [p["jid"] for p in queued_payloads(r)] == jids
    assert json.loads(r.rpop("cogworker:queue:default"))["jid"] == jids[0]  # the end the fetch takes


def test_scheduled_push_goes_to_the_schedule_zset_scored_by_time(r):
    at = time.time() + 300
    jid = Push.perform_at(at, 1)
    assert r.type("cogworker:schedule") == "zset"
    ((raw, score),) = r.zrange("cogworker:schedule", 0, -1, withscores=True)
    payload = json.loads(raw)
    assert score == pytest.approx(at, abs=1e-3)
    assert set(payload) == {"jid", "class", "args", "kwargs", "queue", "retry", "created_at"}
    assert payload["jid"] == jid
    assert not r.exists("cogworker:queues")  # listed when it is enqueued, not before


@pytest.mark.parametrize(("key", "push"), [
    ("cogworker:queue:default", lambda: Push.perform_async(1)),
    ("cogworker:schedule", lambda: Push.perform_in(60, 1)),
    ("cogworker:queue:default", lambda: Push.perform_bulk([(1,), (2,)])),
], ids=["now", "scheduled", "bulk"])
def test_a_push_to_a_key_of_the_wrong_type_raises_an_error_naming_the_key(r, key, push):
    # Redis says WRONGTYPE and names no key: the caller couldn't tell which.
    r.set(key, "not what it should be")

    with pytest.raises(WrongTypeError, match=f"^{key} holds the wrong type of value") as info:
        push()

    assert isinstance(info.value, CogworkerError) and info.value.key == key
    assert isinstance(info.value, redis.ResponseError)  # (what code caught before still catches it)
    assert "WRONGTYPE" in str(info.value.__cause__)
    assert r.get(key) == "not what it should be"


def test_key_prefix_setting_namespaces_every_key(r):
    with override_settings(COGWORKER={"KEY_PREFIX": "shop:"}):
        Push.perform_async(1)
        Push.perform_in(60, 2)
    keys = set(r.keys("*"))
    receipts = {key for key in keys if key.startswith("shop:push_receipt:")}  # (this thread's, for a retry)
    assert sorted(keys - receipts) == ["shop:queue:default", "shop:queues", "shop:schedule"]
    assert len(receipts) == 1 and 0 < r.ttl(receipts.pop()) <= RECEIPT_TTL


def test_due_time_boundary_with_an_injected_clock(redis_url, r):
    conn = redis.Redis.from_url(redis_url)
    try:
        client = Client(build_config({}, {}), conn, clock=lambda: 1000.0)
        now = {"jid": "now", "class": Push.name, "args": [], "kwargs": {}, "queue": "default", "retry": True}
        later = dict(now, jid="later")
        client.push(now, at=1000.0)
        client.push(later, at=1000.5)
    finally:
        conn.close()
    assert [(p["jid"], p["enqueued_at"]) for p in queued_payloads(r)] == [("now", 1000.0)]
    assert r.zrange("cogworker:schedule", 0, -1, withscores=True)[0][1] == 1000.5


# -- bulk ---------------------------------------------------------------------------------------


def test_perform_bulk_pushes_all_in_one_lpush(r):
    r.config_resetstat()
    jids = Push.perform_bulk([(1,), [2, "b"], (3,)])
    calls = command_calls(r)
    assert (calls.get("lpush"), calls.get("sadd")) == (1, 1)
    payloads = queued_payloads(r)
    assert [p["args"] for p in payloads] == [[1], [2, "b"], [3]]
    assert [p["jid"] for p in payloads] == jids and len(set(jids)) == 3
    assert len({p["enqueued_at"] for p in payloads}) == 1


def test_perform_bulk_batches_large_pushes(r):
    r.config_resetstat()
    jids = Push.perform_bulk([(i,) for i in range(2500)])
    assert command_calls(r).get("lpush") == 3  # 1000 per LPUSH keeps each command bounded
    assert r.llen("cogworker:queue:default") == 2500 == len(jids)
    assert [p["args"] for p in queued_payloads(r)[:2]] == [[0], [1]]


def test_perform_bulk_checks_every_item_before_pushing_any(r):
    with pytest.raises(TypeError, match=r"^perform_bulk item 2: args\[0\] is a set"):
        Push.perform_bulk([(1,), (2,), ({3},)])
    assert r.dbsize() == 0


@pytest.mark.parametrize("items", [[1, 2], ["ab"], [{"a": 1}]], ids=["ints", "str", "dict"])
def test_perform_bulk_items_must_be_argument_lists(r, items):
    with pytest.raises(TypeError, match="perform_bulk items must be argument lists or tuples; item 0 is"):
        Push.perform_bulk(items)
    assert r.dbsize() == 0


def test_perform_bulk_of_nothing_writes_nothing(r):
    assert Push.perform_bulk([]) == []
    assert r.dbsize() == 0


# -- transactions -----------------------------------------------------------------------------------


def test_outside_a_transaction_the_push_is_immediate(r):
    jid = Push.perform_async(1)
    assert [p["jid"] for p in queued_payloads(r)] == [jid]


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_the_push_waits_for_commit(r):
    with transaction.atomic():
        jid = Push.perform_async(1)
        scheduled_jid = Push.perform_in(60, 2)
        assert r.dbsize() == 0
    assert [p["jid"] for p in queued_payloads(r)] == [jid]
    assert [json.loads(raw)["jid"] for raw in r.zrange("cogworker:schedule", 0, -1)] == [scheduled_jid]


@pytest.mark.django_db(transaction=True)
def test_rolled_back_push_is_never_made(r):
    with pytest.raises(Boom), transaction.atomic():
        Push.perform_async(1)
        Push.perform_bulk([(2,), (3,)])
        raise Boom
    with transaction.atomic():
        pass  # a later commit must not release the discarded pushes
    assert r.dbsize() == 0


@pytest.mark.django_db(transaction=True)
def test_rolled_back_savepoint_drops_only_its_own_pushes(r):
    with transaction.atomic():
        kept = Push.perform_async("outer")
        with pytest.raises(Boom), transaction.atomic():
            Push.perform_async("inner")
            raise Boom
    assert [p["jid"] for p in queued_payloads(r)] == [kept]


@pytest.mark.django_db(transaction=True)
def test_perform_bulk_waits_for_commit(r):
    with transaction.atomic():
        jids = Push.perform_bulk([(1,), (2,)])
        assert r.dbsize() == 0
        assert len(jids) == 2
    assert [p["jid"] for p in queued_payloads(r)] == jids


@pytest.mark.django_db(transaction=True)
def test_per_push_opt_out_pushes_inside_atomic(r):
    with transaction.atomic():
        jid = Push.set(on_commit=False).perform_async(1)
        bulk = Push.set(on_commit=False).perform_bulk([(2,)])
        assert [p["jid"] for p in queued_payloads(r)] == [jid, *bulk]


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_false_setting_pushes_inside_atomic(r):
    with override_settings(COGWORKER={"ENQUEUE_ON_COMMIT": False}), transaction.atomic():
        jid = Push.perform_async(1)
        assert [p["jid"] for p in queued_payloads(r)] == [jid]


@pytest.mark.django_db(transaction=True)
def test_opt_in_per_push_when_the_setting_is_off(r):
    with override_settings(COGWORKER={"ENQUEUE_ON_COMMIT": False}):
        with transaction.atomic():
            Push.set(on_commit=True).perform_async(1)
            assert r.dbsize() == 0
        assert len(queued_payloads(r)) == 1


@pytest.mark.django_db(transaction=True)
def test_bad_arguments_fail_at_the_call_not_at_commit(r):
    with transaction.atomic():
        with pytest.raises(TypeError, match=r"^args\[0\] is a tuple"):
            Push.perform_async((1,))
        Push.perform_async(2)
    assert [p["args"] for p in queued_payloads(r)] == [[2]]


@pytest.mark.django_db(transaction=True)
def test_a_push_that_fails_at_commit_says_the_transaction_committed_and_names_the_jobs_lost(
        settings, tmp_path, caplog):
    """OUTBOX off: Redis away at the commit. The order is committed and its jobs are gone (the push's
    and those Django never runs after it): the error raised out of atomic() says so, names them,
    and says what prevents it. It was a bare ConnectionError."""
    from django.contrib.auth.models import Group

    from django_cogworker.errors import PushLostAtCommit
    from django_cogworker.push import runtime

    server = RedisServer(tmp_path / "redis").start()
    settings.COGWORKER = {**settings.COGWORKER, "REDIS_URL": server.url,
                          "REDIS_OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 2}}
    try:
        with caplog.at_level(logging.ERROR, logger="django_cogworker"), pytest.raises(PushLostAtCommit) as caught:
            with transaction.atomic():
                Group.objects.create(name="the order")
                first = Push.perform_async(1)
                rest = Push.perform_bulk([(2,), (3,)])
                with pytest.raises(Boom), transaction.atomic():
                    Push.perform_async("rolled back: not lost, never made")
                    raise Boom
                server.kill()
    finally:
        runtime.reset()
        server.cleanup()
    assert Group.objects.filter(name="the order").exists()  # (committed)
    error = caught.value
    assert error.jobs == [(Push.name, first), *((Push.name, jid) for jid in rest)]
    assert error.database == "default"
    assert isinstance(error.__cause__, redis.ConnectionError)
    message = str(error)
    assert "the transaction on database 'default' committed" in message
    assert f"{Push.name} (jid {first})" in message and f"(jid {rest[1]})" in message
    assert 'COGWORKER["OUTBOX"] = True' in message
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR] == [message]


# -- the push path: one command, the on_commit check --------------------------------------------------


def test_a_push_is_one_command_that_also_lists_the_queue(r):
    r.config_resetstat()
    Push.perform_async(1)
    calls = command_calls(r)
    assert calls.get("evalsha") == 1 and not {"multi", "exec", "eval"} & set(calls)
    r.delete("cogworker:queues")  # listed again by the next push, not only the first
    Push.set(queue="mail").perform_async(2)
    assert r.smembers("cogworker:queues") == {"mail"}


def test_a_push_after_redis_forgot_the_script_still_goes_through(r):
    Push.perform_async(1)
    r.script_flush()  # as after a restart
    jid = Push.perform_async(2)
    assert [p["jid"] for p in queued_payloads(r)][-1] == jid
    assert r.smembers("cogworker:queues") == {"default"}


def test_a_push_onto_a_backlog_lists_a_queue_pruned_since(r):
    for i in range(20):
        Push.perform_async(i)
    r.config_resetstat()
    jid = Push.perform_async("onto the backlog")
    assert command_calls(r).get("evalsha") == 1
    assert queued_payloads(r)[-1]["jid"] == jid
    # Drained by the workers, then the admin's prune takes the empty queue off the list:
    # the next push lists it again.
    r.delete("cogworker:queue:default")
    assert api.Queue.prune() == 1 and not r.smembers("cogworker:queues")
    jid = Push.perform_async("after the prune")
    assert r.smembers("cogworker:queues") == {"default"}
    assert [p["jid"] for p in queued_payloads(r)] == [jid]


def test_a_refused_listing_leaves_the_push_done_and_the_next_push_lists_the_queue(r, caplog):
    r.set("cogworker:queues", "not a set")  # (until the key guard moves it aside)
    with caplog.at_level(logging.ERROR, logger="django_cogworker.push.client"):
        jid = Push.perform_async("x")  # no error: the job is queued, only the listing failed
        bulk = Push.perform_bulk([("y",)])
    assert [p["jid"] for p in queued_payloads(r)] == [jid, *bulk]
    assert caplog.text.count("cogworker:queues not updated") == 2 and "WRONGTYPE" in caplog.text
    r.delete("cogworker:queues")  # moved aside: the next push lists the queue
    Push.perform_async("z")
    assert r.smembers("cogworker:queues") == {"default"}


@pytest.mark.parametrize("kind", ["now", "scheduled", "bulk", "unique"])
def test_a_push_whose_reply_is_lost_is_written_once_though_redis_py_sends_it_again(redis_url, r, kind):
    """redis-py sends a command again when its connection drops before the reply (its retry: the
    cluster client's by default, another's when REDIS_OPTIONS sets one): a push Redis had applied
    was written twice, and a unique one refused as a duplicate of itself (None returned)."""
    proxy = Proxy(int(redis_url.rpartition(":")[2].partition("/")[0]))
    config = build_config({"REDIS_OPTIONS": {"retry": Retry(NoBackoff(), 3)}}, {"COGWORKER_REDIS_URL": proxy.url()})
    conn = make_redis(config)
    try:
        client = Client(config, conn)
        # (Its connection made, and the scripts loaded: the push's own write arms the proxy.)
        client.push(Push.set(queue="warm-up").build([0], {}), on_commit=False)
        client.push(Push.set(queue="warm-up").build([0], {}), at=time.time() + 60, on_commit=False)
        r.delete("cogworker:schedule")
        proxy.on_next_reply("drop")
        setter = Push.set(unique_for=60) if kind == "unique" else Push.set()
        if kind == "bulk":
            jids = client.push_bulk([setter.build([i], {}) for i in range(3)], on_commit=False)
        else:
            jids = [client.push(setter.build([1], {}), at=time.time() + 60 if kind == "scheduled" else None,
                                on_commit=False)]
        assert proxy.dropped == 1  # (the reply was lost, and the push sent again)
    finally:
        conn.close()
        proxy.close()
    assert None not in jids and len(jids) == (3 if kind == "bulk" else 1)
    stored = [json.loads(raw)["jid"] for raw in [*r.lrange("cogworker:queue:default", 0, -1),
                                                   *r.zrange("cogworker:schedule", 0, -1)]]
    assert sorted(stored) == sorted(jids)  # each once


def test_a_pushing_threads_next_push_is_written_after_its_receipt(redis_url, r):
    conn = redis.Redis.from_url(redis_url)
    try:
        client = Client(build_config({}, {}), conn)
        first = Push.set().build([1], {})
        assert client.push(first, on_commit=False) == first["jid"]
        assert client.push(Push.set().build([2], {}), on_commit=False)
        assert client.push_bulk([Push.set().build([3], {}), Push.set().build([4], {})], on_commit=False)
    finally:
        conn.close()
    assert [p["args"] for p in queued_payloads(r)] == [[1], [2], [3], [4]]


def test_perform_bulk_jobs_share_created_at_and_are_stored_as_encode_writes_them(r):
    from django_cogworker.push import payload as payloads

    Push.perform_bulk([(1,), ("é", {"k": [1.5]}), (3,)])
    raws = r.lrange("cogworker:queue:default", 0, -1)
    assert [raw == payloads.encode(json.loads(raw)) for raw in raws] == [True] * 3
    assert len({json.loads(raw)["created_at"] for raw in raws}) == 1


def _in_a_thread(fn):
    """Run ``fn`` in a new thread (which has no database connection yet); re-raise what it raised."""
    import threading

    from django.db import connections

    failure = []

    def run():
        try:
            fn()
        except BaseException as exc:  # (handed to the test)
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if failure:
        raise failure[0]


@pytest.mark.django_db(transaction=True)
def test_a_thread_that_pushed_without_a_connection_waits_for_commit_once_in_a_transaction(r):
    # A worker's job or a script: pushes outside any transaction go at once; once the same
    # thread opens a transaction, its pushes wait for the commit.
    def pushes():
        Push.perform_async("before")
        with transaction.atomic():
            Push.perform_async("inside")
            assert [p["args"] for p in queued_payloads(r)] == [["before"]]
        assert [p["args"] for p in queued_payloads(r)] == [["before"], ["inside"]]

    _in_a_thread(pushes)


# -- client middleware --------------------------------------------------------------------------------


def test_middleware_can_change_the_payload(r):
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": [MIDDLEWARE + "StampTenant"]}):
        Push.perform_async(1)
        Push.perform_in(60, 2)
    assert queued_payloads(r)[0]["tenant"] == "acme"
    assert json.loads(r.zrange("cogworker:schedule", 0, -1)[0])["tenant"] == "acme"


def test_middleware_can_stop_a_push(r):
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": [MIDDLEWARE + "DropMarked"]}):
        assert Push.perform_async("drop") is None
        assert r.dbsize() == 0
        jid = Push.perform_async("keep")
    assert [p["jid"] for p in queued_payloads(r)] == [jid]


def test_first_listed_middleware_is_outermost(r):
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": [MIDDLEWARE + "TrailOuter", MIDDLEWARE + "TrailInner"]}):
        Push.perform_async(1)
    assert queued_payloads(r)[0]["trail"] == ["outer", "inner"]


def test_bulk_pushes_go_through_the_middleware_too(r):
    chain = [MIDDLEWARE + "StampTenant", MIDDLEWARE + "DropMarked"]
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": chain}):
        r.config_resetstat()
        jids = Push.perform_bulk([("keep",), ("drop",), ("also",)])
        assert command_calls(r).get("lpush") == 1
    payloads = queued_payloads(r)
    assert [p["args"] for p in payloads] == [["keep"], ["also"]]
    assert [p["jid"] for p in payloads] == jids
    assert {p["tenant"] for p in payloads} == {"acme"}


@pytest.mark.parametrize("middleware, field", [("BreaksTheQueue", "queue"), ("DropsTheJid", "jid")])
def test_a_middleware_that_breaks_the_payload_fails_the_push_and_writes_nothing(r, middleware, field):
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": [MIDDLEWARE + middleware]}):
        for push in (lambda: Push.perform_async(1), lambda: Push.perform_in(60, 2),
                     lambda: Push.perform_bulk([(3,), (4,)])):
            with pytest.raises(TypeError, match=f"payload {field} must be a non-empty string"):
                push()
    assert r.dbsize() == 0


@pytest.mark.django_db(transaction=True)
def test_middleware_runs_at_commit_for_a_deferred_push(r):
    with override_settings(COGWORKER={"CLIENT_MIDDLEWARE": [MIDDLEWARE + "DropMarked"]}):
        with transaction.atomic():
            Push.perform_async("drop")
            Push.perform_async("keep")
        assert [p["args"] for p in queued_payloads(r)] == [["keep"]]


# -- scheduled pushes wake the pollers --------------------------------------------------------------

WAKE = "cogworker:schedule:wake"


@pytest.fixture
def wake(redis_url):
    """A subscription to the channel scheduled pushes announce their due time on (confirmed)."""
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(WAKE)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    yield pubsub
    pubsub.close()
    client.close()


def announced(pubsub, timeout=0.5) -> list[float]:
    """The due times published on the wake channel (until nothing more comes for ``timeout``)."""
    times = []
    while (message := pubsub.get_message(timeout=timeout)) is not None:
        times.append(float(message["data"]))
    return times


def read_events(r) -> int:
    return int(r.info("stats")["total_reads_processed"])


def test_a_scheduled_push_announces_its_due_time_in_the_same_round_trip(r, wake):
    Push.perform_in(60, "warm-up")  # (the pushing client's connection is set up by now)
    announced(wake)
    r.config_resetstat()
    before = read_events(r)
    at = time.time() + 300
    Push.perform_at(at, 1)
    assert read_events(r) - before == 2  # the push (ZADD + PUBLISH pipelined), and this INFO
    scores = [score for raw, score in r.zrange("cogworker:schedule", 0, -1, withscores=True) if '[1]' in raw]
    assert announced(wake) == scores == [pytest.approx(at, abs=1e-6)]
    calls = command_calls(r)
    assert (calls.get("zadd"), calls.get("publish")) == (1, 1)


def test_a_push_for_now_announces_nothing(r, wake):
    Push.perform_async(1)
    Push.perform_at(time.time() - 5, 2)  # due already: straight to its queue
    assert announced(wake) == []
    assert len(queued_payloads(r)) == 2


def test_a_bulk_push_announces_its_earliest_due_time_once(redis_url, r, wake):
    conn = redis.Redis.from_url(redis_url)
    try:
        client = Client(build_config({}, {}), conn)
        now = time.time()
        items = [{"jid": f"j{i}", "class": Push.name, "args": [i], "kwargs": {}, "queue": "default", "retry": True,
                  "at": now + delay} for i, delay in enumerate((30, 10, 20))]
        client.push_bulk(items, on_commit=False)
    finally:
        conn.close()
    assert announced(wake) == [pytest.approx(now + 10, abs=1e-6)]
    assert r.zcard("cogworker:schedule") == 3


@pytest.fixture
def channel_less_url(redis_url, r):
    """A Redis user that may use every key but no pub/sub channel (Redis 7's default for new ACL users)."""
    r.acl_setuser("nochannels", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"],
                  reset_channels=True)
    try:
        yield redis_url.replace("redis://", "redis://nochannels:pw@")
    finally:
        r.acl_deluser("nochannels")


def test_a_refused_announcement_does_not_fail_the_push(channel_less_url, r, caplog, monkeypatch):
    from django_cogworker.push.client import writes

    monkeypatch.setattr(writes, "_wake_warned", False)
    conn = redis.Redis.from_url(channel_less_url)
    try:
        client = Client(build_config({}, {}), conn)
        with caplog.at_level(logging.DEBUG, logger="django_cogworker.push.client"):
            jids = [client.push({"jid": f"j{i}", "class": Push.name, "args": [i], "kwargs": {}, "queue": "default",
                                 "retry": True}, at=time.time() + 60, on_commit=False) for i in range(3)]
    finally:
        conn.close()
    # Scheduled all the same (a push that raised would be pushed again by its caller: a duplicate).
    assert jids == ["j0", "j1", "j2"]
    assert r.zcard("cogworker:schedule") == 3
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not announced on cogworker:schedule:wake" in warnings[0].getMessage()


# -- what pushing imports ---------------------------------------------------------------------------

PUSH_ONLY = """
import sys, time
import redis
from django_cogworker import Job
from django_cogworker.push.client import Client
from django_cogworker.conf import build_config

class Once(Job):
    unique_for = 60

    def perform(self, n):
        pass

conn = redis.Redis.from_url(sys.argv[1])
client = Client(build_config({}, {"COGWORKER_REDIS_URL": sys.argv[1]}), conn)
assert client.push(Once.set().build([1], {}), on_commit=False)
assert client.push(Once.set().build([1], {}), on_commit=False) is None  # the unique lock held
assert client.push(Once.set().build([2], {}), at=time.time() + 60, on_commit=False)
print(sorted(m for m in sys.modules if m.startswith("django_cogworker.engine")))
"""


def test_pushing_imports_no_worker_code(redis_url, r):
    # A web process pushes jobs: a unique job's lock (locks.py) and the loops used to pull in
    # the engine, and with it everything the worker runs. Checked in a fresh interpreter: this
    # one has imported the engine long ago.
    done = subprocess.run([sys.executable, "-c", PUSH_ONLY, redis_url], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert r.llen("cogworker:queue:default") == 1 and r.zcard("cogworker:schedule") == 1
