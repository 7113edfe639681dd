"""The fetcher thread (engine/fetch/fetcher.py) through a real in-process Launcher: never more jobs than idle
processors."""

from __future__ import annotations

import threading
import time

import redis
from engine_fixtures import (
    GATES,
    RUNS,
    Hold,
    Note,
    fetch_mode_fixture,  # noqa: F401 - the fetch_mode fixture
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    new_token,
    runs,
)
from helpers import wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.recovery.orphans import OrphanRecovery
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.engine.settle.settlement import ACK, Settlement
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import Job

K = Keys()


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
    running.manager.settlements.put(raw, Settlement(ACK))  # as a processor finishing it does
    assert running.manager.settlements.held() == [raw]

    running.manager.make_quiet()

    wait_until(lambda: raw.decode() not in r.lrange(running.in_progress, 0, -1), timeout=5,
               message="the held ack sent when the fetcher ended")
    assert running.manager.settlements.held() == [] and running.manager.pending_settlements() == {}
    GATES[token].set()


def _short_then_held(running, token: str, holds: int) -> list[str]:
    """Run 100 short jobs (the fetcher learns they run short), then push ``holds`` Hold jobs in
    order; return their jids once the first two have started."""
    for i in range(100):
        running.push(Note, token, i)
    wait_until(lambda: len(runs(token)) == 100, message="the short jobs ran")
    jids = [running.push(Hold, token)["jid"] for _ in range(holds)]
    # (The first two pushed, in either order: two processors take them, and either may log first.)
    wait_until(lambda: sorted(e[1] for e in runs(token) if e[0] == "start") == sorted(jids[:2]),
               message="two held jobs started")
    return jids


def _jids(raws) -> list[str]:
    return [payloads.decode(raw)["jid"] for raw in raws]


def test_while_jobs_run_short_a_reliable_process_takes_jobs_ahead_and_no_more_than_prefetch_says(
        launcher_factory, r):
    token = new_token()
    # PREFETCH 1 per processor, counted for at least AHEAD_MIN (8) processors: with 2, 8 ahead at
    # most (the fetcher tops them up when half are gone).
    running = launcher_factory(CONCURRENCY=2)
    jids = _short_then_held(running, token, holds=12)
    wait_until(lambda: r.llen(running.in_progress) >= 2 + 4, message="jobs taken ahead")
    held = []
    for _ in range(30):
        held.append(r.llen(running.in_progress))
        time.sleep(0.01)
    assert max(held) <= 2 + 8, held
    # On the in-progress list, like the running ones; the rest left in the queue, in order.
    listed = _jids(r.lrange(running.in_progress, 0, -1))
    assert sorted(listed) == sorted(jids[:len(listed)])
    assert _jids(r.lrange(K.queue("default"), 0, -1)) == jids[len(listed):][::-1]
    GATES[token].set()
    wait_until(lambda: len([e for e in runs(token) if e[0] == "end"]) == 12, message="all twelve ran")


def test_at_quiet_jobs_taken_ahead_go_back_to_the_head_of_their_queue_unstarted(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=2)
    jids = _short_then_held(running, token, holds=12)
    wait_until(lambda: r.llen(running.in_progress) >= 2 + 4, message="jobs taken ahead")

    running.manager.make_quiet()

    # Those taken ahead are back where they were, first to be fetched (the queue's head is its
    # right end) in the order they were fetched; the two running stay on the in-progress list.
    wait_until(lambda: r.llen(K.queue("default")) == 10, message="the jobs taken ahead handed back")
    assert _jids(r.lrange(K.queue("default"), 0, -1)) == jids[2:][::-1]
    assert sorted(_jids(r.lrange(running.in_progress, 0, -1))) == sorted(jids[:2])
    GATES[token].set()
    wait_until(lambda: len([e for e in runs(token) if e[0] == "end"]) == 2, message="the two running ended")
    time.sleep(0.3)
    assert sorted(e[1] for e in runs(token) if e[0] == "start") == sorted(jids[:2])


def test_jobs_taken_ahead_by_a_process_silent_past_the_threshold_and_requeued_meanwhile_are_not_started(
        launcher_factory, r, rb, monkeypatch, caplog):
    # A process silent past ORPHAN_THRESHOLD (its heartbeat stopped here; a frozen VM, SIGSTOP, a
    # partition in life) is taken for dead, and another requeues its in-progress list. The jobs it
    # had taken ahead ran as requeued, and again here once it beat again: only the ones it was
    # running may run twice (docs/guarantees.md).
    token = new_token()
    running = launcher_factory(CONCURRENCY=2)
    jids = _short_then_held(running, token, holds=12)
    wait_until(lambda: r.llen(running.in_progress) >= 2 + 4, message="jobs taken ahead")
    monkeypatch.setattr(running.launcher.heartbeat, "beat", lambda: None)  # silent from now
    live = OrphanRecovery(running.config, rb, K, "live:2:bbbbbb", RetryPolicy(running.config))
    recovered = wait_until(lambda: live.recover(running.launcher.identity, 2.0), timeout=15,
                           message="its list recovered once its beat was older than the threshold")
    assert recovered >= 2 + 4 and not r.llen(running.in_progress)
    monkeypatch.undo()  # it beats again

    GATES[token].set()

    wait_until(lambda: len([e for e in runs(token) if e[0] == "end"]) >= 12 + 2, message="all twelve ran, two twice")
    time.sleep(0.3)
    # The two running when it went silent ran again as requeued; every other job once.
    assert sorted(e[1] for e in runs(token) if e[0] == "start") == sorted(jids + jids[:2])
    assert caplog.text.count("taken back by orphan recovery") == recovered - 2


def test_with_prefetch_0_a_process_takes_no_more_than_its_idle_processors_even_while_jobs_run_short(
        launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=2, PREFETCH=0)
    _short_then_held(running, token, holds=12)
    time.sleep(0.3)
    assert r.llen(running.in_progress) == 2 and r.llen(K.queue("default")) == 10
    GATES[token].set()  # (the held jobs end: the launcher stops at once, not at its shutdown timeout)


def test_basic_fetch_never_takes_ahead_even_while_jobs_run_short(launcher_factory, r):
    # What basic fetch took lives only in the process's memory: taken ahead, it would be lost too at
    # a kill -9.
    token = new_token()
    running = launcher_factory(CONCURRENCY=2, FETCH="basic")
    _short_then_held(running, token, holds=12)
    time.sleep(0.3)
    assert r.llen(K.queue("default")) == 10
    GATES[token].set()  # (the held jobs end: the launcher stops at once, not at its shutdown timeout)
