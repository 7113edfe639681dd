"""Shared pieces of the in-process engine tests: fast configs, clients, test jobs, a running Launcher.

    from engine_fixtures import launcher_factory_fixture  # noqa: F401 - the launcher_factory fixture

    def test_x(launcher_factory, r):
        running = launcher_factory(FETCH="basic")
        running.push(Note, token, 1)
        wait_until(lambda: runs(token))

Everything talks to a real Redis (the suite's, or a RedisServer a fault test starts). The jobs
here keep what they see in this process's memory, keyed by a per-test token, so a test can use a
Redis of its own without the jobs writing to the suite's one.
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import wait_until

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import Config, build_config
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.push.client import Client
from django_cogworker.push.job import Job, JobSetter

# Tiny intervals keep the engine tests fast. The socket timeout caps a blocking fetch at 0.25 s
# (half a second under it), so a stop never waits long for the fetcher.
FAST: dict[str, Any] = {
    "HEARTBEAT_INTERVAL": 0.2,
    "POLL_INTERVAL_AVERAGE": 0.1,
    "ORPHAN_THRESHOLD": 1,
    "FETCH_IDLE_MAX_INTERVAL": 0.1,
    "SHUTDOWN_TIMEOUT": 1,
    "REDIS_OPTIONS": {"socket_timeout": 0.75},
}

# -- test jobs -------------------------------------------------------------------------------------

RUNS: dict[str, list[Any]] = collections.defaultdict(list)
GATES: dict[str, threading.Event] = collections.defaultdict(threading.Event)


def new_token() -> str:
    return uuid.uuid4().hex


def runs(token: str) -> list[Any]:
    return list(RUNS[token])


class Note(Job):
    """Append (jid, args) to RUNS[token]."""

    def perform(self, token: str, *args: Any) -> None:
        RUNS[token].append((self.jid, list(args)))


class Hold(Job):
    """Append ("start", jid), wait for GATES[token] (30 s at most), append ("end", jid)."""

    def perform(self, token: str) -> None:
        RUNS[token].append(("start", self.jid))
        GATES[token].wait(30)
        RUNS[token].append(("end", self.jid))


class Boom(Job):
    """Append jid to RUNS[token], then raise RuntimeError(message)."""

    retry = 3

    def perform(self, token: str, message: str = "boom") -> None:
        RUNS[token].append(self.jid)
        raise RuntimeError(message)


# -- configs, clients, pushing ---------------------------------------------------------------------


def make_config(redis_url: str, **settings: Any) -> Config:
    """A validated Config: FAST, then ``settings`` (COGWORKER names), on ``redis_url``."""
    return build_config({**FAST, **settings}, {"COGWORKER_REDIS_URL": redis_url})


def push(client: Client, job: type[Job], *args: Any, **options: Any) -> dict[str, Any]:
    """Push one job now through the real client; return the payload as pushed."""
    payload = JobSetter(job, options).build(args, {})
    client.push(payload)
    return payload


class Running:
    """A Launcher running on its own thread, as ``runcogworker`` runs one on the main thread."""

    def __init__(self, config: Config, client: redis.Redis, **kwargs: Any):
        self.config = config
        self.redis = client
        self.keys = Keys(config.key_prefix)
        self.launcher = Launcher(config, client, **kwargs)
        self.client = Client(config, client)
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, name="test-launcher", daemon=True)

    def _run(self) -> None:
        self.exit_code = self.launcher.run(install_signals=False)

    @property
    def manager(self):
        return self.launcher.manager

    @property
    def in_progress(self) -> str:
        return self.keys.in_progress(self.launcher.identity)

    def start(self) -> Running:
        self.thread.start()
        # The poller starts last; its first round done means everything runs.
        wait_until(lambda: self.launcher.poller.first_orphan_check_done.is_set() or not self.thread.is_alive(),
                   timeout=15, message="launcher ready")
        assert self.thread.is_alive(), "launcher exited during startup"
        return self

    def push(self, job: type[Job], *args: Any, **options: Any) -> dict[str, Any]:
        return push(self.client, job, *args, **options)

    def stop(self, timeout: float = 15) -> int | None:
        if self.thread.is_alive():
            self.launcher.stop()
            self.thread.join(timeout)
            assert not self.thread.is_alive(), "launcher did not stop"
        return self.exit_code


@pytest.fixture(name="launcher_factory")
def launcher_factory_fixture(redis_url: str) -> Iterator[Any]:
    """The ``launcher_factory`` fixture: ``factory(url=None, server_middleware=(), death_handlers=(), **settings)``.

    Starts a Launcher and returns it Running; every one started is stopped at teardown. Import
    ``launcher_factory_fixture`` (not the fixture's name, which test parameters would shadow).
    """
    started: list[Running] = []
    clients: list[redis.Redis] = []

    def factory(*, url: str | None = None, server_middleware=(), death_handlers=(), **settings: Any) -> Running:
        config = make_config(url or redis_url, **settings)
        client = make_redis(config)
        clients.append(client)
        running = Running(config, client, server_middleware=server_middleware, death_handlers=death_handlers)
        started.append(running)
        return running.start()

    yield factory
    try:
        for running in started:
            running.stop()
    finally:
        for gate in GATES.values():
            gate.set()  # let held jobs end so their threads don't outlive the test by long
        for running in started:
            for p in running.manager.processors:
                p.thread.join(5)
        for client in clients:
            client.close()


launcher_factory = launcher_factory_fixture  # the first name it had (tests/test_fetch_reconcile.py imports it)


def fail_acks(fetch: Any, should_fail: Any, monkeypatch: Any = None) -> None:
    """Make acknowledging the raws ``should_fail(raw)`` picks fail as if Redis were away.

    Acks travel on three paths: alone (``ack``), in a pipeline while the fetcher blocks
    (``ack_many``), and riding on the next fetch (``retrieve(..., acks)``); all three fail, the
    last one before Redis sees anything, as a connection cut before the round trip would.
    """
    real_ack, real_many, real_retrieve = fetch.ack, fetch.ack_many, fetch.retrieve

    def ack(raw):
        if should_fail(raw):
            raise redis.ConnectionError("Redis went away (injected)")
        real_ack(raw)

    def ack_many(raws):
        if any(should_fail(raw) for raw in raws):
            raise redis.ConnectionError("Redis went away (injected)")
        real_many(raws)

    def retrieve(n, paused=frozenset(), acks=(), before_block=None, *ride):
        if any(should_fail(raw) for raw in acks):
            raise redis.ConnectionError("Redis went away (injected)")
        return real_retrieve(n, paused, acks, before_block, *ride)

    for name, fn in (("ack", ack), ("ack_many", ack_many), ("retrieve", retrieve)):
        if monkeypatch is not None:
            monkeypatch.setattr(fetch, name, fn)
        else:
            setattr(fetch, name, fn)
