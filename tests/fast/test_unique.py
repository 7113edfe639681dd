"""Unique jobs: one push of the same job, arguments and queue at a time, with a lock that can't outlive its TTL.

Pushes go through the project's client (`perform_async`, on the suite's Redis); the lock's
release is watched through a processor called on the test's thread (``make_processor``) working
its own queue.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redis
from engine_fixtures import make_processor_fixture  # noqa: F401 - the make_processor fixture
from helpers import Proxy, RedisServer, refuse, serve_again

from django_cogworker import Job
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.errors import CogworkerError
from django_cogworker.push import payload as payloads
from django_cogworker.push import unique
from django_cogworker.push.client import Client
from django_cogworker.push.job import JobSetter

K = Keys()
QUEUE = "uniq"
EVENTS: dict[str, list] = collections.defaultdict(list)
# What an UntilStart job calls while it runs (once), to look at its lock from inside its run.
WHILE_RUNNING: dict[str, Callable[[], None]] = {}


class UniqueNote(Job):
    queue = QUEUE
    unique_for = 60

    def perform(self, token, *args, **kwargs):
        EVENTS[token].append(self.jid)


class OtherNote(Job):
    queue = QUEUE
    unique_for = 60

    def perform(self, token, *args, **kwargs):
        EVENTS[token].append(self.jid)


class UntilStart(Job):
    queue = QUEUE
    unique_for = 60
    unique_until = "start"

    def perform(self, token):
        EVENTS[token].append(("start", self.jid))
        WHILE_RUNNING.pop(token, lambda: None)()
        EVENTS[token].append(("end", self.jid))


class FailsThenRetries(Job):
    queue = QUEUE
    unique_for = 60
    retry = 3

    def perform(self, token):
        EVENTS[token].append(self.jid)
        raise RuntimeError("fails on purpose")


class FailsToDead(Job):
    queue = QUEUE
    unique_for = 60
    retry = False

    def perform(self, token):
        EVENTS[token].append(self.jid)
        raise RuntimeError("fails on purpose")


class Plain(Job):
    queue = QUEUE

    def perform(self, token):
        EVENTS[token].append(self.jid)


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex


def lock_key(job: type[Job], *args, **options) -> str:
    payload = JobSetter(job, options).build(list(args), {})
    return K.unique(payload["unique_digest"])


def waiting(r, queue: str = QUEUE) -> list[dict]:
    return [payloads.decode(raw) for raw in reversed(r.lrange(K.queue(queue), 0, -1))]


@pytest.fixture
def called(make_processor):
    """A processor working QUEUE, called on the test's thread."""
    return make_processor(QUEUES=[QUEUE])


# -- declaring -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, False, "60", 0.0])
def test_unique_for_must_be_a_positive_number(r, value):
    with pytest.raises(CogworkerError, match="unique_for must be a positive number of seconds"):
        type("BadUnique", (Job,), {"unique_for": value, "perform": lambda self: None})
    with pytest.raises(CogworkerError, match="unique_for must be a positive number of seconds"):
        Plain.set(unique_for=value).perform_async("t")
    assert waiting(r) == []


def test_unique_for_true_means_unique_lock_ttl(r, token):
    assert Plain.set(unique_for=True).perform_async(token) is not None
    assert Plain.set(unique_for=True).perform_async(token) is None
    assert 3590 <= r.ttl(lock_key(Plain, token, unique_for=True)) <= 3600  # UNIQUE_LOCK_TTL's default


def test_unique_until_must_be_success_or_start():
    with pytest.raises(CogworkerError, match='unique_until must be "success" or "start"'):
        type("BadUntil", (Job,), {"unique_for": 10, "unique_until": "finish", "perform": lambda self: None})
    with pytest.raises(CogworkerError, match='unique_until must be "success" or "start"'):
        UniqueNote.set(unique_until="end").perform_async("t")


# -- pushing ---------------------------------------------------------------------------------------


def test_a_duplicate_push_returns_none_and_logs_the_holder(r, token, caplog):
    first = UniqueNote.perform_async(token, 1)
    assert first is not None
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        assert UniqueNote.perform_async(token, 1) is None
    assert f"jid={first} holds the lock" in caplog.text and UniqueNote.name in caplog.text
    assert [p["jid"] for p in waiting(r)] == [first]
    assert r.get(lock_key(UniqueNote, token, 1)) == first


def test_the_digest_covers_job_args_kwargs_and_queue(r, token):
    pushed = [
        UniqueNote.perform_async(token, 1),
        UniqueNote.perform_async(token, 2),  # other args
        UniqueNote.perform_async(token, 1, flag=True),  # other kwargs
        UniqueNote.set(queue="elsewhere").perform_async(token, 1),  # other queue
        OtherNote.perform_async(token, 1),  # other job
    ]
    assert None not in pushed and len(set(pushed)) == 5
    assert UniqueNote.perform_async(token, 1) is None
    assert UniqueNote.perform_async(token, 1, flag=True) is None
    assert UniqueNote.perform_async(token, 1, b=2, a=1) is not None
    assert UniqueNote.perform_async(token, 1, a=1, b=2) is None  # kwargs order doesn't matter
    assert UniqueNote.set(queue="elsewhere").perform_async(token, 1) is None


def test_set_unique_for_makes_one_push_unique(r, token):
    assert Plain.set(unique_for=30).perform_async(token) is not None
    assert Plain.set(unique_for=30).perform_async(token) is None
    assert Plain.perform_async(token) is not None  # without it, not unique
    assert 0 < r.ttl(lock_key(Plain, token, unique_for=30)) <= 30


def test_concurrent_pushes_from_eight_threads_push_exactly_one(r, token):
    barrier = threading.Barrier(8)
    results: list = []

    def push():
        barrier.wait(10)
        results.append(UniqueNote.perform_async(token, "same"))

    threads = [threading.Thread(target=push) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 8
    winners = [jid for jid in results if jid is not None]
    assert len(winners) == 1
    assert [p["jid"] for p in waiting(r)] == winners


def test_the_lock_has_a_ttl_longer_for_a_scheduled_push(r, token):
    UniqueNote.perform_async(token, "now")
    assert 55 <= r.ttl(lock_key(UniqueNote, token, "now")) <= 60
    UniqueNote.perform_in(300, token, "later")
    assert 355 <= r.ttl(lock_key(UniqueNote, token, "later")) <= 360  # its delay, then unique_for
    assert UniqueNote.perform_in(300, token, "later") is None
    assert r.zcard(K.schedule) == 1


def test_bulk_pushes_leave_duplicates_out(r, token):
    UniqueNote.perform_async(token, 1)
    jids = UniqueNote.perform_bulk([[token, 1], [token, 2], [token, 2], [token, 3]])
    assert len(jids) == 2
    assert sorted(p["args"][1] for p in waiting(r)) == [1, 2, 3]


def test_a_push_that_fails_releases_its_lock(redis_url, r, token):
    client = redis.Redis.from_url(redis_url)
    try:
        config = build_config({}, {"COGWORKER_REDIS_URL": redis_url})
        push = Client(config, client).push
        r.set(K.queue(QUEUE), "wrong type")
        with pytest.raises(redis.ResponseError):
            push(JobSetter(UniqueNote, {}).build([token], {}))
        assert r.get(lock_key(UniqueNote, token)) is None  # a retry of the push isn't a "duplicate"
        r.delete(K.queue(QUEUE))
        assert push(JobSetter(UniqueNote, {}).build([token], {})) is not None
    finally:
        client.close()


def test_a_bulk_push_that_fails_releases_the_locks_of_what_it_did_not_write(redis_url, r, token):
    client = redis.Redis.from_url(redis_url)
    try:
        config = build_config({}, {"COGWORKER_REDIS_URL": redis_url})
        bulk = Client(config, client).push_bulk
        r.set(K.queue("broken"), "wrong type")
        items = [JobSetter(UniqueNote, {}).build([token, 1], {}),
                 JobSetter(UniqueNote, {"queue": "broken"}).build([token, 2], {}),
                 JobSetter(UniqueNote, {}).build([token, 3], {})]
        items[2]["at"] = 4_000_000_000.0  # scheduled: written by the ZADD
        with pytest.raises(redis.ResponseError):
            bulk(items)
        # The job written keeps its lock (a second push would be its duplicate); the one refused is free.
        assert r.get(lock_key(UniqueNote, token, 1)) == items[0]["jid"]
        assert r.get(lock_key(UniqueNote, token, 3)) == items[2]["jid"]
        assert r.get(lock_key(UniqueNote, token, 2, queue="broken")) is None
        assert [p["jid"] for p in waiting(r)] == [items[0]["jid"]]
        r.delete(K.queue("broken"))
        assert UniqueNote.set(queue="broken").perform_async(token, 2) is not None
    finally:
        client.close()


def test_a_lock_key_of_the_wrong_type_is_moved_aside_not_obeyed_for_ever(r, token, caplog):
    key = lock_key(UniqueNote, token)
    r.rpush(key, "garbage")
    jid = UniqueNote.perform_async(token)
    assert jid is not None and r.get(key) == jid
    assert [k for k in r.keys(K.quarantine_prefix + "*") if key in k]  # kept for a human to look at
    assert "is no lock (the wrong type)" in caplog.text


def test_a_lock_without_an_expiry_is_given_one(r, token, caplog):
    key = lock_key(UniqueNote, token)
    r.set(key, "written-by-hand")
    assert UniqueNote.perform_async(token) is None  # held: a duplicate, for now
    assert 0 < r.ttl(key) <= 60  # but it lapses at unique_for
    assert "held no expiry" in caplog.text


# -- releasing -------------------------------------------------------------------------------------


def test_the_lock_is_released_when_the_job_succeeds(called, r, token):
    jid = UniqueNote.perform_async(token)
    assert r.get(lock_key(UniqueNote, token)) == jid
    called.run_next()
    assert EVENTS[token] == [jid]
    assert r.get(lock_key(UniqueNote, token)) is None
    again = UniqueNote.perform_async(token)
    assert again not in (None, jid)
    called.run_next()
    assert EVENTS[token] == [jid, again]


def test_until_start_releases_the_lock_when_the_job_starts(called, r, token):
    jid = UntilStart.perform_async(token)
    assert UntilStart.perform_async(token) is None  # queued: still unique
    seen = []

    def while_running():  # running: released, and the same push is accepted
        seen.extend([r.get(lock_key(UntilStart, token)), UntilStart.perform_async(token)])

    WHILE_RUNNING[token] = while_running
    called.run_next()
    lock, second = seen
    assert lock is None and second is not None
    assert EVENTS[token] == [("start", jid), ("end", jid)]
    called.run_next()
    assert ("end", second) in EVENTS[token]


def test_the_lock_is_kept_while_the_job_waits_in_retry(called, r, token):
    jid = FailsThenRetries.perform_async(token)
    called.run_next()
    assert r.zcard(K.retry) == 1
    assert EVENTS[token] == [jid]
    assert r.get(lock_key(FailsThenRetries, token)) == jid
    assert FailsThenRetries.perform_async(token) is None


def test_the_lock_is_released_when_the_job_dies(called, r, token):
    jid = FailsToDead.perform_async(token)
    called.run_next()
    assert r.zcard(K.dead) == 1
    assert r.get(lock_key(FailsToDead, token)) is None
    assert EVENTS[token] == [jid]
    assert FailsToDead.perform_async(token) is not None


def test_a_lock_held_by_another_jid_is_not_released(redis_url, r, token):
    payload = JobSetter(UniqueNote, {}).build([token], {})
    key = K.unique(payload["unique_digest"])
    r.set(key, "someone-else", ex=60)
    client = redis.Redis.from_url(redis_url)
    try:
        unique.release_at(client, K, payload, "success")
    finally:
        client.close()
    assert r.get(key) == "someone-else"


@pytest.fixture
def lone(tmp_path):
    """A redis-server of this test's own (its writes refused, then served again) and a bytes client on it."""
    srv = RedisServer(tmp_path / "redis").start()
    client = srv.client()
    yield srv, client
    client.close()
    srv.cleanup()


def unique_push(client: Client, kind: str, token: str) -> list[str]:
    """Push UniqueNote(token) "now", "scheduled" or in "bulk" (beside a second job); return the jids written."""
    def build(*args):
        return JobSetter(UniqueNote, {}).build([token, *args], {})

    if kind == "bulk":
        return client.push_bulk([build(), build("second")], on_commit=False)
    jid = client.push(build(), at=time.time() + 300 if kind == "scheduled" else None, on_commit=False)
    return [jid] if jid else []


def written(client) -> list[str]:
    """The jids of the jobs in QUEUE and in the schedule."""
    raws = [*client.lrange(K.queue(QUEUE), 0, -1), *client.zrange(K.schedule, 0, -1)]
    return sorted(json.loads(raw)["jid"] for raw in raws)


@pytest.mark.parametrize("how", ["noreplicas", "oom", "readonly"])
@pytest.mark.parametrize("kind", ["now", "scheduled", "bulk"])
def test_a_push_redis_refuses_leaves_no_lock_and_goes_through_once_writes_are_taken(lone, token, how, kind):
    srv, r = lone
    client = Client(build_config({}, {"COGWORKER_REDIS_URL": srv.url}), r)
    refuse(r, how)
    with pytest.raises(redis.ResponseError):
        unique_push(client, kind, token)
    serve_again(r)
    assert r.keys("*") == []  # no lock, no job, no receipt: nothing at all was written
    jids = unique_push(client, kind, token)  # not a "duplicate" of the push refused
    assert len(jids) == (2 if kind == "bulk" else 1)
    assert r.get(lock_key(UniqueNote, token)) == jids[0].encode()
    assert written(r) == sorted(jids)


@pytest.mark.parametrize("kind", ["now", "scheduled", "bulk"])
def test_writes_refused_as_a_push_reaches_redis_never_leave_a_lock_without_its_job(lone, token, kind):
    """The Sentinel failover test's failure on one server: the replica leaves (min-replicas-to-write
    refuses every write from then on) right after the push's first command is applied. The lock and
    the job were two commands: the lock stayed with no job, its release refused as well, and every
    push of the job was refused as its duplicate for unique_for."""
    srv, r = lone
    proxy = Proxy(srv.port)
    conn = make_redis(build_config({}, {"COGWORKER_REDIS_URL": proxy.url()}))
    try:
        client = Client(build_config({}, {"COGWORKER_REDIS_URL": proxy.url()}), conn)
        # (Its connection made, and the scripts loaded: the push's first write arms the proxy.)
        client.push(JobSetter(Plain, {"queue": "warm-up"}).build([token], {}), on_commit=False)
        proxy.on_next_reply(lambda: refuse(r, "noreplicas"))
        try:
            jids = unique_push(client, kind, token)
        except redis.ResponseError:
            jids = []
        serve_again(r)
    finally:
        conn.close()
        proxy.close()
    holder = r.get(lock_key(UniqueNote, token))
    assert written(r) == sorted(jids)
    assert holder is None if not jids else holder.decode() in jids  # a lock only with its job
    if not jids:
        assert unique_push(Client(build_config({}, {"COGWORKER_REDIS_URL": srv.url}), r), kind, token)
