"""What the poller's tests share (test_scheduled, test_due, test_wakeups, test_housekeeping):
pollers made and started, entries written, jobs that stamp when they start.

The live tests set the timed rounds far apart (POLL_INTERVAL_AVERAGE LONG: a round every 15-45 s),
so a job that starts within a second of its due time was woken for, not polled for.
"""

from __future__ import annotations

import random
import time

import pytest
from engine_fixtures import (
    RUNS,
    make_config,
    runs,
)
from helpers import wait_until

from django_cogworker import Job
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.recovery.key_guard import KeyGuard
from django_cogworker.engine.recovery.orphans import OrphanRecovery
from django_cogworker.engine.schedule.poller import Poller
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.push import payload as payloads

K = Keys()


NOW = 1_700_000_000.0


@pytest.fixture(name="bclient")
def bclient_fixture(redis_url):
    client = make_redis(make_config(redis_url))
    yield client
    client.close()


class Failing:
    """A key guard or orphan recovery with a bug: every call raises."""

    def __init__(self):
        self.calls = 0

    def check(self):
        self.calls += 1
        raise RuntimeError("a bug in this step")


def make_poller(redis_url, client, *, process_count=lambda: 1, rng=None, key_guard=None, orphans=None,
                clock=lambda: NOW, **settings):
    config = make_config(redis_url, **settings)
    retry = RetryPolicy(config, clock=clock)
    return Poller(config, client, K, retry, key_guard or KeyGuard(client, K, config.queue_names),
                  orphans or OrphanRecovery(config, client, K, "poller:1:me", retry),
                  process_count=process_count, rng=rng, clock=clock)


@pytest.fixture(name="poller")
def poller_fixture(redis_url, bclient):
    return make_poller(redis_url, bclient)


def entry(jid, queue="default", args=(), **extra):
    return payloads.encode({"jid": jid, "class": "x.Job", "args": list(args), "kwargs": {}, "queue": queue,
                            "retry": True, **extra})


class Extremes(random.Random):
    """uniform() returns its low or high bound."""

    def __init__(self, high):
        super().__init__(0)
        self.high = high

    def uniform(self, a, b):
        return b if self.high else a


LONG = 30


class Stamp(Job):
    """Append the time it started to RUNS[token]."""

    def perform(self, token):
        RUNS[token].append(time.time())


class FailsOnceRetriesInASecond(Job):
    """Append the time it started to RUNS[token]; the first run raises, its retry is due 1 s later."""

    retry = 1

    def retry_in(self, count, exc):
        return 1.0

    def perform(self, token):
        RUNS[token].append(time.time())
        if len(RUNS[token]) == 1:
            raise RuntimeError("first run fails")


def stamp_entry(token):
    return payloads.encode(Stamp.set().build([token], {}))


def started(token, timeout=10):
    """When the first run of the job recording to ``token`` started (waits for it)."""
    return wait_until(lambda: runs(token), timeout=timeout, message="the job ran")[0]


# A job woken for starts at its due time; one polled for waits for the next timed round, 15 s or
# more after the last (LONG). Within this many seconds of its due time it was woken for, however
# slow the machine: a second once failed on a loaded vCPU.
WOKEN_WITHIN = 5.0
assert LONG * 0.5 > 2 + WOKEN_WITHIN + 2  # (the premise: the due times the tests set, 1-2 s ahead, and the bound)


def woken_for(token, due: float) -> float:
    """When the job recording to ``token`` started: at ``due`` or after, and woken for (see WOKEN_WITHIN)."""
    at = started(token, timeout=due - time.time() + WOKEN_WITHIN + 5)
    assert due <= at <= due + WOKEN_WITHIN, f"started {at - due:.2f}s after its due time"
    return at


def subscribed_and_settled(poller):
    wait_until(lambda: poller.subscribed, message="poller subscribed")
    time.sleep(0.5)  # past the sweep that follows the subscription: the next round is 15 s away or more


def calls(r):
    """Commands run so far (refused ones included), by name."""
    return {name.removeprefix("cmdstat_"): stat["calls"] + stat.get("rejected_calls", 0)
            for name, stat in r.info("commandstats").items()}


@pytest.fixture(name="live_poller")
def live_poller_fixture(redis_url):
    """``live_poller(**settings)``: a Poller on the real clock, started; stopped at teardown."""
    started_pollers, clients = [], []

    def start(url=None, **settings):
        client = make_redis(make_config(url or redis_url))
        clients.append(client)
        poller = make_poller(url or redis_url, client, clock=time.time, **settings)
        started_pollers.append(poller)
        poller.start()
        return poller

    yield start
    for poller in started_pollers:
        poller.stop()
    for client in clients:
        client.close()

