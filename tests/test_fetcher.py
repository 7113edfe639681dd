"""The fetcher thread (engine/fetch/fetcher.py) through a real in-process Launcher: never more jobs than idle
processors."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from engine_fixtures import (
    GATES,
    RUNS,
    Hold,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    new_token,
    runs,
)
from helpers import wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import Job

K = Keys()


@pytest.fixture(params=["reliable", "basic"])
def fetch_mode(request):
    return request.param


def test_never_more_jobs_taken_than_idle_processors(launcher_factory, fetch_mode, r, redis_url):
    token = new_token()
    # All ten wait before the process starts: its very first fetch could take them all.
    r.lpush(K.queue("default"), *(payloads.encode({"jid": f"slow-{i}", "class": SlowNote.name, "args": [token, i],
                                                   "kwargs": {}, "queue": "default"}) for i in range(10)))
    taken_but_unfinished: list[int] = []
    in_progress_lengths: list[int] = []
    identities: list[str] = []
    done = threading.Event()

    def sample():
        client = redis.Redis.from_url(redis_url)
        try:
            while not done.is_set() and len(runs(token)) < 10:
                waiting = client.llen(K.queue("default"))  # read first, finished second: never undercounts
                finished = len(runs(token))
                taken_but_unfinished.append(10 - waiting - finished)
                if identities:
                    in_progress_lengths.append(client.llen(K.in_progress(identities[0])))
                time.sleep(0.002)
        finally:
            client.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=2)
        identities.append(running.launcher.identity)
        wait_until(lambda: len(runs(token)) == 10, message="all ten ran")
    finally:
        done.set()
        sampler.join()

    assert max(taken_but_unfinished) <= 2, taken_but_unfinished
    assert max(taken_but_unfinished) == 2  # and both processors were kept busy
    if fetch_mode == "reliable":
        assert in_progress_lengths and max(in_progress_lengths) <= 2


class SlowNote(Job):
    def perform(self, token, i):
        time.sleep(0.05)
        RUNS[token].append((self.jid, [i]))


def test_acks_held_when_the_fetcher_ends_at_quiet_go_out_then_not_at_the_stop(launcher_factory, r):
    # Quiet (TSTP before a deploy) may last long: an ack held for a fetch that won't come kept its
    # finished job on the in-progress list all that time, and a kill -9 meanwhile ran it again.
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)
    held = running.push(Hold, token)  # the one processor busy: the fetcher waits for it, not on Redis
    wait_until(lambda: runs(token) == [("start", held["jid"])])
    raw = payloads.encode({"jid": "finished", "class": Hold.name, "args": [], "kwargs": {},
                           "queue": "default"}).encode()
    r.lpush(running.in_progress, raw)
    running.manager.acks.add(raw)  # as a processor finishing it does
    assert running.manager.acks.held() == [raw]

    running.manager.make_quiet()

    wait_until(lambda: raw.decode() not in r.lrange(running.in_progress, 0, -1), timeout=5,
               message="the held ack sent when the fetcher ended")
    assert running.manager.acks.held() == [] and running.manager.pending_settlements() == {}
    GATES[token].set()
