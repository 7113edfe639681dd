"""Reading and clearing a queue's lanes at scale (api/lanes.py, broker/scripts/lane_sizes.py) and the
ring repair's walk (features/fairness/hook.py), on the suite's Redis.

A review measured 100,000 groups: the admin's page sent 100,007 commands (an LLEN a group from
Python), a scrape 400,058 (the lanes read four times), ``Queue.clear`` raised on a busy grouped
queue (its WATCH on the ring broke at every fetch) and the repair SCANned the keyspace once per
queue. These tests count what a client sends (MONITOR: the commands a script runs are Redis's own
work, not round trips) and run a fetcher beside a clear.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import uuid

import pytest
import redis
from engine_fixtures import make_config

from django_cogworker import api
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.broker.scripts.lane_sizes import BUDGET
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.features.fairness import hook
from django_cogworker.features.fairness.hook import Lanes
from django_cogworker.metrics.collect import collect

K = Keys()
Q = "fair-reads"
HANDSHAKE = ("PING", "HELLO", "CLIENT")  # (a connection's opening: no part of a read)
MANY = 5_000  # groups: more than BUDGET, so a read takes several script calls


def seed(rb, queue: str = Q, sizes: dict[str, int] | None = None, paused: tuple[str, ...] = ()) -> None:
    """Groups as the fetch leaves them: each group's list (its size in jobs), the ring with "", the
    paused groups out of the ring."""
    lanes = K.lanes(queue)
    new_ring = not rb.exists(lanes.ring)
    pipe = rb.pipeline(transaction=False)
    pipe.sadd(K.queues, queue)
    for group, size in (sizes or {}).items():
        pipe.rpush(lanes.group(group), *[json.dumps({"group": group, "jid": f"{group}-{i}", "class": "x",
                                                     "args": [], "queue": queue}) for i in range(size)])
        if group in paused:
            pipe.sadd(lanes.paused, group)
        else:
            pipe.lpush(lanes.ring, group)
    if new_ring:
        pipe.rpush(lanes.ring, "")
    pipe.execute()


@contextlib.contextmanager
def sent(redis_url):
    """The commands clients sent Redis while the block ran (the list yielded fills at its end)."""
    commands: list[str] = []
    watcher = redis.Redis.from_url(redis_url)
    marker = f"end-{uuid.uuid4().hex}"
    started = threading.Event()

    def watch():
        with watcher.monitor() as monitor:
            started.set()
            for command in monitor.listen():
                if command["command"] == f"ECHO {marker}":
                    return
                if command.get("client_type") != "lua" and not command["command"].startswith(HANDSHAKE):
                    commands.append(command["command"])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(5)
    yield commands
    redis.Redis.from_url(redis_url).echo(marker)
    thread.join(10)
    watcher.close()
    assert not thread.is_alive()


def sizes_of(n: int) -> dict[str, int]:
    """``n`` groups of 1 to 4 jobs (a reproducible mix), and "big" with 50."""
    rng = random.Random(7)
    return {**{f"t{i}": rng.randint(1, 4) for i in range(n)}, "big": 50}


def test_a_page_of_many_groups_is_a_few_script_calls_not_a_command_a_group(rb, redis_url):
    sizes = sizes_of(MANY)
    seed(rb, sizes=sizes, paused=("t1", "t2"))
    with sent(redis_url) as commands:
        found = api.Queue(Q).groups(2, 25)
    calls = [c for c in commands if c.upper().startswith(("EVAL", "EVALSHA"))]
    # One call per BUDGET members (a last one that finds the walk's end), and the ends of the queue list.
    # (and an EVAL after a NOSCRIPT, the first time).
    assert len(calls) <= MANY // BUDGET + 3 and len(commands) <= len(calls) + 2, [c[:40] + c[-20:] for c in commands]
    ranked = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0].encode()))
    assert [(g.id, g.waiting) for g in found.page.items] == ranked[25:50]
    assert (found.groups, found.grouped, found.page.total) == (MANY + 1, sum(sizes.values()), MANY + 1)
    first = api.Queue(Q).groups(1, 25).page.items
    assert first[0].id == "big" and {g.id for g in first}.isdisjoint(g.id for g in found.page.items)
    assert {g.id.decode(): g.paused for g in api.Queue(Q).lanes(busiest=MANY + 1).busiest} == {
        g: g in ("t1", "t2") for g in sizes}


def test_a_scrape_reads_each_queue_s_lanes_once_whatever_its_groups(rb, redis_url):
    seed(rb, sizes={"a": 1}, queue="small")
    seed(rb, sizes={"x": 1})
    collect()  # (the scripts loaded)
    with sent(redis_url) as few:
        collect()
    seed(rb, sizes=sizes_of(MANY))
    with sent(redis_url) as many:
        families = {f.name: f for f in collect()}
    # The big queue's lanes: one walk of MANY // BUDGET + 1 calls, not an LLEN a group nor a walk per reader.
    assert len(many) - len(few) <= MANY // BUDGET + 1, [c[:40] + c[-20:] for c in many]
    waiting = {(labels["queue"], labels["group"]): value
               for _, labels, value in families["cogworker_group_waiting"].samples}
    ranked = sorted({**sizes_of(MANY), "x": 1}.items(), key=lambda kv: (-kv[1], kv[0].encode()))[:100]
    assert waiting == {(Q, group): size for group, size in ranked}
    groups = {labels["queue"]: value for _, labels, value in families["cogworker_queue_groups"].samples}
    assert groups == {Q: MANY + 2, "small": 1}
    sizes = {labels["queue"]: value for _, labels, value in families["cogworker_queue_size"].samples}
    assert sizes == {Q: sum(sizes_of(MANY).values()) + 1, "small": 1}


def test_ties_among_the_busiest_go_to_the_smaller_id_byte_by_byte(rb):
    """(Lua compares strings in the server's locale; the listings sort bytes: "B" before "a".)"""
    seed(rb, sizes={"b": 2, "a": 2, "B": 2, "a-c": 2, "ab": 2, "_": 1})
    assert [g.id for g in api.Queue(Q).groups(1, 3).page.items] == ["B", "a", "a-c"]
    assert [g.id for g in api.Queue(Q).groups(2, 3).page.items] == ["ab", "b", "_"]


def test_a_clear_beside_a_fetcher_deletes_every_group_s_jobs_and_keeps_the_paused(rb, redis_url):
    """The clear WATCHed the ring, which every fetch turns: with a fetcher running it raised."""
    seed(rb, sizes={f"g{i}": 5 for i in range(1000)}, paused=("g7",))
    config = make_config(redis_url, QUEUES=[Q], REDIS_OPTIONS={})
    stop, taken = threading.Event(), []

    def fetch():
        client = make_redis(config)
        fetcher = ReliableFetch(config, client, K, "host:1:abc", rng=random.Random(1))
        while not stop.is_set():
            taken.extend(fetcher.retrieve(1))
        client.close()

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    try:
        for _ in range(1000):
            if len(taken) >= 20:
                break
            stop.wait(0.01)
        cleared = api.Queue(Q).clear()
    finally:
        stop.set()
        thread.join(10)
    assert len(taken) >= 20 and cleared + len(taken) == 5000  # (g7's 5 jobs cleared with the rest)
    assert api.Queue(Q).size() == 0 and api.Queue(Q).groups().groups == 1  # (g7, paused, its list gone)
    assert rb.smembers(K.lanes(Q).paused) == {b"g7"} and not rb.exists(K.lanes(Q).ring, K.lanes(Q).group("g0"))


def test_a_clear_of_lane_keys_of_the_wrong_type_deletes_them_never_raises(rb):
    seed(rb, sizes={"a": 2, "b": 1})
    lanes = K.lanes(Q)
    rb.delete(lanes.group("b"))
    rb.set(lanes.group("b"), "a string")
    rb.set(lanes.prio, "another")
    assert api.Queue(Q).clear() == 2
    assert not rb.exists(lanes.ring, lanes.prio, lanes.group("a"), lanes.group("b"))
    rb.set(lanes.ring, "a string ring")
    assert api.Queue(Q).clear() == 0 and not rb.exists(lanes.ring)


@pytest.mark.parametrize("queues", [1, 3])
def test_the_repair_walks_the_keyspace_once_for_all_queues_a_few_scans_a_round(rb, queues, monkeypatch):
    names = [f"q{i}" for i in range(queues)]
    for name in names:
        seed(rb, queue=name, sizes={"lost": 1})
        rb.delete(K.lanes(name).ring)
    pipe = rb.pipeline(transaction=False)
    for i in range(20_000):  # (others' keys: results, locks)
        pipe.set(f"cogworker:result:{i}", "x")
    pipe.execute()
    clock = [0.0]
    lanes = Lanes(rb, K, names, monotonic=lambda: clock[0])
    scans = []
    real_scan = rb.scan
    monkeypatch.setattr(rb, "scan", lambda *a, **kw: scans.append(kw) or real_scan(*a, **kw))
    assert lanes.repair_when_due() == 0 and scans == []  # (not before FIRST_REPAIR)
    clock[0] = hook.FIRST_REPAIR
    back, rounds = 0, 0
    while True:
        before = len(scans)
        back += lanes.repair_when_due()
        rounds += 1
        assert len(scans) - before <= hook.ROUND_SCANS
        if lanes._cursor is None:
            break
    assert back == queues and rounds >= 20_000 // (hook.ROUND_SCANS * hook.SCAN_COUNT)
    assert all(rb.lrange(K.lanes(n).ring, 0, -1) == [b"lost", b""] for n in names)
    assert len(scans) < 2 * 20_000 / hook.SCAN_COUNT + 10  # one walk for every queue, not one each
    count = len(scans)
    clock[0] += 1
    assert lanes.repair_when_due() == 0 and len(scans) == count  # (the next walk: REPAIR_EVERY later)
    clock[0] = hook.FIRST_REPAIR + hook.REPAIR_EVERY
    lanes.repair_when_due()
    assert len(scans) > count
