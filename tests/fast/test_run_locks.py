"""The run hook's locks: a release Redis refuses during an outage is made once it is back."""

from __future__ import annotations

import logging

import redis
from helpers import RedisServer
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.broker import locks
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run.run_locks import RunLocks

K = Keys()


def payload(jid: str, **extra) -> dict:
    return {"class": "x.Job", "jid": jid, "queue": "default", "args": [], "unique_digest": f"digest-{jid}",
            "unique_for": 3600, "unique_until": "success", **extra}


def test_a_release_refused_while_redis_is_away_is_made_with_a_later_beat(tmp_path, caplog):
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    client = redis.Redis.from_url(srv.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        run_locks = RunLocks(client, K)
        jobs = [payload("a", periodic_pjid="p1"), payload("b")]
        for job in jobs:
            assert locks.take(client, K, K.unique(job["unique_digest"]), job["jid"], 3600)[0]
        assert locks.take(client, K, K.periodic_running("p1"), "a", 3600)[0]
        srv.kill()
        with caplog.at_level(logging.WARNING):
            for job in jobs:
                run_locks(job, "success")  # (no exception: the processor would log a traceback)
        assert run_locks.pending == 2
        assert "kept, and tried again with each heartbeat" in caplog.text
        srv.start()
        assert client.exists(K.unique("digest-a"), K.unique("digest-b"), K.periodic_running("p1")) == 3
        run_locks.retry_pending(client)
        assert run_locks.pending == 0
        assert client.exists(K.unique("digest-a"), K.unique("digest-b"), K.periodic_running("p1")) == 0
    finally:
        client.close()
        srv.cleanup()


def test_a_late_release_never_frees_a_lock_another_run_took_since(tmp_path):
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    client = redis.Redis.from_url(srv.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        run_locks = RunLocks(client, K)
        first = payload("a")
        assert locks.take(client, K, K.unique(first["unique_digest"]), first["jid"], 3600)[0]
        srv.kill()
        run_locks(first, "success")
        srv.start()
        client.delete(K.unique("digest-a"))  # (it lapsed) and another push of the job took it:
        client.set(K.unique("digest-a"), "b", ex=3600)
        run_locks.retry_pending(client)
        assert client.get(K.unique("digest-a")) == b"b"
    finally:
        client.close()
        srv.cleanup()
