"""Shared pieces of the in-process engine tests: fast configs, clients, test jobs, a processor
called on the test's thread, a running Launcher.

    from engine_fixtures import make_processor_fixture  # noqa: F401 - the make_processor fixture

    def test_x(make_processor, r):
        called = make_processor(FETCH="basic")
        run = called.run(Note, token, 1)  # (pushed, taken, run and settled: nothing to wait for)
        assert run.decision.outcome is Outcome.SUCCESS and called.clear()

A test of the job's path calls a processor (``make_processor``); one of threads, of the fetcher
or of the whole process starts a Launcher (``launcher_factory``) and polls with ``wait_until``.

Everything talks to a real Redis (the suite's, or a RedisServer a fault test starts). The jobs
here keep what they see in this process's memory, keyed by a per-test token, so a test can use a
Redis of its own without the jobs writing to the suite's one.
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import redis
from helpers import wait_until

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import FETCH_MODES, Config, build_config
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.ledger import Ledger
from django_cogworker.engine.fetch.registry import make_fetch
from django_cogworker.engine.loop.runner import run_job_async
from django_cogworker.engine.process.launcher import Launcher, new_identity, run_job
from django_cogworker.engine.run.factories import FeatureFactory, build_features, load_features, requeue_hook
from django_cogworker.engine.run.hooks import FetchHooks, JobRun, Plans, WorkerParts
from django_cogworker.engine.run.interrupts import TaskInterrupt
from django_cogworker.engine.run.processor import Processor
from django_cogworker.engine.schedule.due import DueSweep
from django_cogworker.engine.settle.queue import SettlementQueue
from django_cogworker.engine.settle.retry import Filing, RetryPolicy
from django_cogworker.engine.settle.settlement import Settlement
from django_cogworker.engine.settle.settling import Settler
from django_cogworker.engine.settle.stats import Stats
from django_cogworker.push.client import Client
from django_cogworker.push.job import Job, JobSetter
from django_cogworker.push.middleware import build_async_chain, build_chain

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


def make_config(redis_url: str, *layers: Mapping[str, Any], **settings: Any) -> Config:
    """A validated Config: FAST, then each of ``layers`` (a test module's own settings), then
    ``settings`` (COGWORKER names, each layer's too), on ``redis_url``."""
    merged = dict(FAST)
    for layer in layers:
        merged.update(layer)
    return build_config({**merged, **settings}, {"COGWORKER_REDIS_URL": redis_url})


@pytest.fixture(name="fetch_mode", params=FETCH_MODES)
def fetch_mode_fixture(request: pytest.FixtureRequest) -> str:
    """The ``fetch_mode`` fixture: a test that takes it runs once per fetch strategy (STYLE.md 14:
    contract tests run against both). Import ``fetch_mode_fixture``, as ``launcher_factory_fixture``."""
    return str(request.param)


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


# -- a processor called on the test's thread ---------------------------------------------------------


class Recording(Settler):
    """The worker's Settler, which also keeps each settlement it is asked for, in order (``asked``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.asked: list[tuple[bytes, Settlement]] = []

    def settle(self, raw: bytes, how: Settlement) -> None:
        self.asked.append((raw, how))
        super().settle(raw, how)


class Called:
    """A Processor built from its parts as a worker builds it, and called on the test's thread.

    Its parts are a worker's (the config's fetch on a real Redis, the retry policy, the features'
    Plans, the server middleware around ``run_job``), but no Manager, fetcher or thread: a test
    pushes a job, ``run_next`` takes it with the real fetch (reliable: onto this process's
    in-progress list) and hands it to ``processor.process``, which runs it through every phase
    and settles it before returning. Nothing to wait for: when ``run_next`` returns, Redis holds
    the settlement (the in-progress list, the retry and dead sets) and ``settled`` what the
    Settler was asked for. ``processor.process`` returns, rather than raises, whatever a job,
    a hook or a handler did: a raise there is what kills a worker's processor thread.
    """

    def __init__(self, config: Config, client: redis.Redis, *, features: Sequence[FeatureFactory] | None,
                 server_middleware: Sequence[Callable], death_handlers: Sequence[Callable]):
        self.config = config
        self.redis = client
        self.keys = Keys(config.key_prefix)
        self.identity = new_identity()
        self.client = Client(config, client)
        self.retry = RetryPolicy(config, death_handlers)
        self.fetch = make_fetch(config, client, self.keys, self.identity)
        self.stats = Stats(self.keys)
        parts = WorkerParts(config, client, self.keys, self.identity, self.retry)
        made = build_features(load_features(config) if features is None else features, parts)
        self.settler = Recording(self.fetch, self.retry, requeue_hook(made),
                                 runners={kind: runner for f in made for kind, runner in f.step_runners().items()})
        # The worker's stopping event, as the Manager's: set by a test, a running iterable job stops at its next item.
        self.stopping = threading.Event()
        chain_async, _lacking = build_async_chain(server_middleware, run_job_async)
        self.processor = Processor(0, ledger=Ledger(), settlements=SettlementQueue(self.settler), retry=self.retry,
                                   stats=self.stats,
                                   server_chain=build_chain(server_middleware, run_job),
                                   plans=Plans(made, async_chain=chain_async is not None),
                                   stopping=self.stopping, server_chain_async=chain_async)
        self.features = made
        self.fetch_hooks = FetchHooks(made)  # (what the fetcher calls with what it fetched: a limit's takes)

    @property
    def in_progress(self) -> str:
        """This process's in-progress list (with basic fetch a key never written)."""
        return self.fetch.in_progress

    @property
    def settled(self) -> list[tuple[bytes, Settlement]]:
        """(raw, settlement) for each settlement the processor made, in order."""
        return self.settler.asked

    def ends(self) -> list[str]:
        """Where each settlement made left its job, in order: "ack", or the set it was filed in
        ("retry", "dead"); the features' steps before it left out."""
        return [_end(how) for _raw, how in self.settled]

    def push(self, job: type[Job], *args: Any, **options: Any) -> dict[str, Any]:
        return push(self.client, job, *args, **options)

    def take(self) -> Unit:
        """The next job waiting in the queues, fetched as the fetcher would (a test pushed it first)."""
        units = self.fetch.retrieve(1)
        assert units, "no job waiting in the queues"
        self.fetch_hooks.fetched(units)
        return units[0]

    def run_next(self) -> JobRun | None:
        """Take the next job and process it: its JobRun (None: a payload it couldn't read, buried)."""
        return self.processor.process(self.take())

    def run_next_async(self) -> JobRun | None:
        """``run_next`` through ``process_async``, on an event loop of its own as the worker's loop
        runner does (an interrupt for the job's task: a timeout or a cancel cancels it)."""
        unit = self.take()

        async def main() -> JobRun | None:
            return await self.processor.process_async(unit, TaskInterrupt(asyncio.get_running_loop()),
                                                      "cogworker-loop-0")

        return asyncio.run(main())

    def arun(self, job: type[Job], *args: Any, **options: Any) -> JobRun:
        """``run`` through ``process_async``."""
        pushed = self.push(job, *args, **options)
        run = self.run_next_async()
        assert run is not None and run.payload["jid"] == pushed["jid"], "another job was waiting"
        return run

    def run(self, job: type[Job], *args: Any, **options: Any) -> JobRun:
        """Push one job, take it and process it; its JobRun."""
        pushed = self.push(job, *args, **options)
        run = self.run_next()
        assert run is not None and run.payload["jid"] == pushed["jid"], "another job was waiting"
        return run

    def waiting(self) -> int:
        return sum(self.redis.llen(self.keys.queue(name)) for name in self.config.queue_names)

    def drain(self) -> list[JobRun | None]:
        """Process every job waiting, in the order the fetch takes them."""
        return [self.run_next() for _ in iter(self.waiting, 0)]

    def clear(self) -> bool:
        """Nothing running, nothing pending, nothing left on the in-progress list."""
        return (not self.processor.ledger.busy and not self.settler.pending_settlements()
                and self.redis.llen(self.in_progress) == 0)

    def flush_stats(self) -> None:
        """Write the counts to Redis, as each heartbeat does."""
        self.stats.flush(self.redis)

    def sweep(self) -> int:
        """Move the due entries of the schedule and retry sets to their queues, as the poller's
        rounds do; return how many moved."""
        return DueSweep(self.redis, self.keys, self.retry, random.Random(), time.time, threading.Event()).enqueue_due()


def _end(how: Settlement) -> str:
    return how.end.target if isinstance(how.end, Filing) else "ack"


@pytest.fixture(name="make_processor")
def make_processor_fixture(redis_url: str) -> Iterator[Callable[..., Called]]:
    """The ``make_processor`` fixture: ``factory(url=None, features=None, server_middleware=(),
    death_handlers=(), **settings)`` returns a :class:`Called` processor on a fresh config (FAST,
    then ``settings``), its Plans from ``features`` (factories) or the configured ones (the
    package's and ``FEATURES``). Import ``make_processor_fixture``, as ``launcher_factory_fixture``.
    """
    clients: list[redis.Redis] = []

    def factory(*, url: str | None = None, features: Sequence[FeatureFactory] | None = None,
                server_middleware: Sequence[Callable] = (), death_handlers: Sequence[Callable] = (),
                **settings: Any) -> Called:
        config = make_config(url or redis_url, **settings)
        client = make_redis(config)
        clients.append(client)
        return Called(config, client, features=features, server_middleware=server_middleware,
                      death_handlers=death_handlers)

    yield factory
    for client in clients:
        client.close()


def fail_acks(fetch: Any, should_fail: Any, monkeypatch: Any = None) -> None:
    """Make acknowledging the raws ``should_fail(raw)`` picks fail as if Redis were away.

    Acks travel three ways: alone, through the Settler (``ack_many``: one that can't wait, those held
    past the cap or while the fetcher waits, pending ones), riding on a fetch (the acks of the
    ``outgoing`` given to ``retrieve``), and with their steps past the cap (``send``); all fail, the
    last two before Redis sees anything, as a connection cut before the round trip would.
    """
    real_many, real_retrieve, real_send = fetch.ack_many, fetch.retrieve, fetch.send

    def send(outgoing):  # (settlements past the cap, their steps riding with their acks)
        if any(should_fail(raw) for raw in outgoing.acks):
            raise redis.ConnectionError("Redis went away (injected)")
        real_send(outgoing)

    def ack_many(raws):
        if any(should_fail(raw) for raw in raws):
            raise redis.ConnectionError("Redis went away (injected)")
        real_many(raws)

    def retrieve(n, paused=frozenset(), outgoing=None):
        if outgoing is not None and any(should_fail(raw) for raw in outgoing.acks):
            raise redis.ConnectionError("Redis went away (injected)")
        return real_retrieve(n, paused, outgoing)

    for name, fn in (("ack_many", ack_many), ("retrieve", retrieve), ("send", send)):
        if monkeypatch is not None:
            monkeypatch.setattr(fetch, name, fn)
        else:
            setattr(fetch, name, fn)
