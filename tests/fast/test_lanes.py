"""A queue's lanes (broker/scripts/lanes.py): grouped jobs taking turns, prioritized jobs in order,
routed by the fetch scripts from wherever a job comes back, against a real Redis, with both fetches.

The payloads here are built as the push builds them (features/fairness/ puts ``group`` or
``priority`` first); the options that build them are tested in test_fairness.py.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from engine_fixtures import fetch_mode_fixture, make_config  # noqa: F401 - the fetch_mode fixture

from django_cogworker.broker import scripts
from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.broker.scripts.lanes import ROUTE_MAX
from django_cogworker.engine.fetch.basic import BasicFetch
from django_cogworker.engine.fetch.reliable import ReliableFetch
from django_cogworker.push import payload as payloads
from django_cogworker.push.client import Client

K = Keys()
MODES = {"reliable": ReliableFetch, "basic": BasicFetch}


@pytest.fixture
def bclient(redis_url):
    client = make_redis(make_config(redis_url, REDIS_OPTIONS={}))
    yield client
    client.close()


@pytest.fixture
def make_fetch(redis_url, bclient, fetch_mode):
    def build(**settings):
        config = make_config(redis_url, QUEUES=["default"], REDIS_OPTIONS={}, **settings)
        return MODES[fetch_mode](config, bclient, K, "host:1:abc", rng=random.Random(1))
    return build


def job(n, group=None, priority=None, at=None):
    head = {"group": group} if group else {"priority": priority} if priority else {}
    return payloads.encode({**head, "jid": f"j{n}", "class": "x.Job", "args": [n], "kwargs": {},
                            "queue": "default", "retry": True, "enqueued_at": at or time.time()})


def push(r, *raws):
    """As the push writes the queue list: the first given is the first fetched."""
    for raw in raws:
        r.lpush(K.queue("default"), raw)


def drain(fetch, n, batch=5):
    taken = []
    while len(taken) < n:
        units = fetch.retrieve(batch)
        if not units:
            break
        taken += [json.loads(u.raw) for u in units]
    return taken


def test_a_small_group_waits_for_the_busy_groups_turns_not_for_a_big_group_s_backlog(make_fetch, r):
    fetch = make_fetch()
    push(r, *(job(i, group="big") for i in range(600)))
    push(r, *(job(1000 + i, group="small") for i in range(10)))
    push(r, *(job(2000 + i) for i in range(10)))

    taken = drain(fetch, 40)

    # Three take turns (big, small, the ungrouped): small's ten are done within about 3 x 10 jobs.
    small = [i for i, p in enumerate(taken) if p.get("group") == "small"]
    assert len(small) == 10 and small[-1] < 33, small
    assert sum(p.get("group") == "big" for p in taken[:small[-1] + 1]) <= 12
    # Each group's jobs in the order they were pushed.
    assert [p["args"][0] for p in taken if p.get("group") == "big"] == sorted(
        p["args"][0] for p in taken if p.get("group") == "big")
    lanes = K.lanes("default")
    assert r.llen(lanes.group("big")) + sum(p.get("group") == "big" for p in taken) == 600


def test_the_lanes_go_when_their_last_job_is_taken_and_a_plain_queue_is_fetched_as_before(make_fetch, r):
    fetch = make_fetch()
    push(r, job(1, group="g"), job(2))

    assert sorted(p["args"][0] for p in drain(fetch, 10)) == [1, 2]

    lanes = K.lanes("default")
    assert not r.exists(lanes.ring, lanes.group("g"), lanes.prio)
    push(r, job(3), job(4))
    assert [p["args"][0] for p in drain(fetch, 10)] == [3, 4]


def test_a_paused_group_s_jobs_join_its_list_and_wait_while_the_others_run(make_fetch, r):
    fetch = make_fetch()
    lanes = K.lanes("default")
    r.sadd(lanes.paused, "held")
    push(r, *(job(i, group="held") for i in range(5)), job(10, group="free"), job(11))

    taken = drain(fetch, 10)

    assert sorted(p["args"][0] for p in taken) == [10, 11]
    assert r.llen(lanes.group("held")) == 5
    assert b"held" not in r.lrange(lanes.ring, 0, -1)


def test_a_job_that_comes_back_through_the_queue_list_rejoins_its_group(make_fetch, fetch_mode, r):
    """A retry due, a scheduled job, orphan recovery and a hand-back all write the queue list."""
    fetch = make_fetch()
    push(r, *(job(i, group="a") for i in range(3)))
    first = fetch.retrieve(1)
    assert json.loads(first[0].raw)["args"] == [0]

    fetch.hand_back(first)  # (back at the queue list's end: the fetch routes it again)

    taken = drain(fetch, 10)
    assert sorted(p["args"][0] for p in taken) == [0, 1, 2]
    if fetch_mode == "reliable":
        assert r.llen(fetch.in_progress) == 3  # (the three held, nothing else)


def test_prioritized_pushes_overtake_the_plain_jobs_waiting(make_fetch, redis_url, r):
    fetch = make_fetch()
    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    push(r, *(job(i, at=time.time() - 30) for i in range(20)))
    client.push_bulk([{"priority": 10, "jid": f"hi{i}", "class": "x.Job", "args": [100 + i], "kwargs": {},
                       "queue": "default", "retry": True} for i in range(3)])

    taken = drain(fetch, 6, batch=6)

    assert [p["args"][0] for p in taken] == [100, 101, 102, 0, 1, 2]
    assert r.sismember(K.queues, "default")


def test_a_low_priority_job_ages_past_newer_plain_ones_unless_aging_is_off(make_fetch, redis_url, r):
    now = time.time()
    for aging, expected in ((60.0, [0, 1]), (0, [1, 0])):
        fetch = make_fetch(PRIORITY_AGING=aging)
        client = Client(make_config(redis_url, QUEUES=["default"], PRIORITY_AGING=aging), r,
                        clock=lambda: now - 600)
        # Priority -5, ten minutes old: worth 5 steps at one a minute, so it ranks as a plain job
        # pushed five minutes ago, older than the plain one pushed now.
        client.push_bulk([{"priority": -5, "jid": "low", "class": "x.Job", "args": [0], "kwargs": {},
                           "queue": "default", "retry": True}])
        push(r, job(1, at=now))

        assert [p["args"][0] for p in drain(fetch, 2, batch=2)] == expected
        r.flushdb()


def test_a_priority_push_rings_the_doorbell_of_an_empty_queue_list_only(redis_url, r):
    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    prioritized = {"priority": 3, "class": "x.Job", "args": [], "kwargs": {}, "queue": "default", "retry": True}

    client.push_bulk([dict(prioritized, jid="a")])
    assert [json.loads(raw) for raw in r.lrange(K.queue("default"), 0, -1)] == [{"lane": "bell",
                                                                                 "queue": "default"}]
    client.push_bulk([dict(prioritized, jid="b")])
    assert r.llen(K.queue("default")) == 1 and r.zcard(K.lanes("default").prio) == 2


def test_a_blocking_wait_places_a_lane_entry_and_takes_the_job_in_turn_and_drops_a_doorbell(make_fetch,
                                                                                           fetch_mode, r):
    """Put back on the list instead, the entry went to the next fetcher blocked on it, and back, for
    seconds (a review's finding): the wait's own script places it and takes the next in turn."""
    fetch = make_fetch()
    lanes = K.lanes("default")
    r.lpush(lanes.group("busy"), job(0, group="busy"))
    r.rpush(lanes.ring, "")
    r.lpush(lanes.ring, "busy")
    push(r, job(1, group="new"))

    units = fetch.wait()

    # (busy's turn comes first: the new group joined the ring's far end)
    assert [json.loads(u.raw)["args"] for u in units] == [[0]]
    assert sorted(p["args"][0] for p in [json.loads(u.raw) for u in units] + drain(fetch, 5)) == [0, 1]
    if fetch_mode == "reliable":
        assert sorted(json.loads(raw)["args"][0] for raw in r.lrange(fetch.in_progress, 0, -1)) == [0, 1]

    r.lpush(K.queue("default"), payloads.encode({"lane": "bell", "queue": "default"}))
    assert fetch.wait() == []
    assert not r.exists(K.queue("default"))


def test_of_two_fetchers_blocked_on_a_queue_the_one_woken_by_a_grouped_job_runs_it(redis_url, fetch_mode, r):
    import threading

    fetches = [MODES[fetch_mode](make_config(redis_url, QUEUES=["default"], REDIS_OPTIONS={}),
                                 make_redis(make_config(redis_url, REDIS_OPTIONS={})), K, f"host:{i}:abc")
               for i in range(2)]
    got: list = []
    threads = [threading.Thread(target=lambda f=f: got.extend(f.wait())) for f in fetches]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # (both blocked)
    push(r, job(1, group="g"))
    for thread in threads:
        thread.join()

    assert [json.loads(u.raw)["args"] for u in got] == [[1]]
    assert not r.exists(K.queue("default"), *K.lanes("default")[:3])


def test_a_doorbell_in_the_queue_list_is_dropped_by_the_fetch(make_fetch, r):
    fetch = make_fetch()
    push(r, payloads.encode({"lane": "bell", "queue": "default"}), job(1))

    assert [json.loads(u.raw)["args"] for u in fetch.retrieve(5)] == [[1]]
    assert not r.exists(K.queue("default"))


def test_a_lane_key_of_the_wrong_type_costs_no_job(make_fetch, fetch_mode, r):
    fetch = make_fetch()
    lanes = K.lanes("default")
    r.set(lanes.group("g"), "not a list")
    push(r, job(1, group="g"), job(2))

    # The grouped job can't join its list: it stays an ordinary job, taken as one.
    assert sorted(p["args"][0] for p in drain(fetch, 5)) == [1, 2]
    assert r.get(lanes.group("g")) == "not a list"

    # A priority set of the wrong type: reported (the key guard moves it aside), and the queue
    # list's jobs still taken meanwhile, a grouped one as an ordinary job.
    r.set(lanes.prio, "not a zset")
    push(r, job(3), job(4, group="h"))
    assert sorted(json.loads(u.raw)["args"][0] for u in fetch.retrieve(5)) == [3, 4]
    assert fetch.unfetchable == {"default"}
    assert not r.exists(K.queue("default"))


def test_one_fetch_routes_at_most_route_max_entries(make_fetch, r):
    fetch = make_fetch()
    pipe = r.pipeline()
    for first in range(0, ROUTE_MAX + 500, 500):
        pipe.lpush(K.queue("default"), *(job(i, group="a") for i in range(first, first + 500)))
    pipe.execute()

    assert len(fetch.retrieve(1)) == 1

    assert r.llen(K.queue("default")) >= 499


def test_the_fetch_scripts_take_their_step_and_default_to_strict(r):
    """An ack-only call of FETCH_RELIABLE (ack_many) passes no step: no lane is touched anyway."""
    r.lpush(K.queue("default"), job(1))
    assert scripts.FETCH_RELIABLE(r, ["ip", K.queue("default")], [1, 0])[0] == 1


def test_a_prioritized_job_coming_due_takes_its_place_by_priority_not_behind_the_queue(make_fetch, redis_url,
                                                                                      bclient, r):
    """The due poller pushes it to the end the fetch takes next, which routes it into its lane at once;
    a grouped one comes back to its group the same way (the retry set's jobs go the same road)."""
    from poller_fixtures import NOW, make_poller

    poller = make_poller(redis_url, bclient)
    push(r, *(job(i, at=NOW - 100) for i in range(5)))
    r.zadd(K.schedule, {payloads.encode({"priority": 5, "jid": "soon", "class": "x.Job", "args": [50], "kwargs": {},
                                         "queue": "default", "retry": True}): NOW - 1})
    r.zadd(K.retry, {payloads.encode({"group": "g", "jid": "again", "class": "x.Job", "args": [60], "kwargs": {},
                                      "queue": "default", "retry": True, "retry_count": 0}): NOW - 1})

    assert poller.enqueue_due() == 2

    taken = [p["args"][0] for p in drain(make_fetch(), 7, batch=7)]
    assert taken[0] == 50  # (scored NOW - 5 x 60, older than the plain jobs' NOW - 100)
    assert sorted(taken) == [0, 1, 2, 3, 4, 50, 60]
    assert taken.index(60) <= 2  # (its group's turn comes within a round of the ring)


def test_a_grouped_push_joins_its_group_at_once_not_after_the_ungrouped_jobs_ahead(make_fetch, redis_url, r):
    """Routed only by the fetch, a new group's first job waited for every ungrouped job ahead of it
    to be fetched in the ungrouped turn, one turn in 21: 4,382 fetches here (a review's finding)."""
    client = Client(make_config(redis_url, QUEUES=["default"]), r)

    def grouped(group, n):
        return {"group": group, "jid": f"{group}-{n}", "class": "x.Job", "args": [n], "kwargs": {},
                "queue": "default", "retry": True}

    client.push_bulk([grouped(f"busy{g}", n) for g in range(20) for n in range(50)])
    push(r, *(job(2000 + i) for i in range(200)))
    client.push_bulk([grouped("new", 0)])
    lanes = K.lanes("default")
    assert r.llen(lanes.group("new")) == 1 and r.lrange(lanes.ring, 0, 0) == ["new"]

    fetch = make_fetch()
    taken = [json.loads(u.raw)["jid"] for _ in range(30) for u in fetch.retrieve(1)]

    assert "new-0" in taken[:22]  # (one round of the ring: 20 busy groups, the ungrouped, new)


def test_a_push_to_a_paused_group_waits_in_its_list_out_of_the_ring(redis_url, r):
    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    lanes = K.lanes("default")
    r.sadd(lanes.paused, "held")

    client.push_bulk([{"group": "held", "jid": "h", "class": "x.Job", "args": [], "kwargs": {},
                       "queue": "default", "retry": True}])

    assert r.llen(lanes.group("held")) == 1 and not r.exists(lanes.ring)
    assert r.lrange(K.queue("default"), 0, -1) == [payloads.encode({"lane": "bell", "queue": "default"})]


def test_a_queue_name_with_a_space_is_refused_at_every_push(redis_url, r):
    """``default lane:prio`` pushed as a queue made a list of queue default's priority set: default
    was stuck for good (a review's finding)."""
    from django_cogworker.errors import InvalidArgument
    from django_cogworker.features.batches import Batch

    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    with pytest.raises(TypeError, match="without spaces"):
        client.push({"jid": "x", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default lane:prio"})
    with pytest.raises(InvalidArgument, match="callback_queue"):
        Batch(callback_queue="default lane:ring")
    assert r.keys("*") == []


def test_a_lost_ring_is_repaired_so_its_groups_jobs_run_again(make_fetch, redis_url, bclient, r):
    """Without the repair, a group whose ring went (deleted, evicted, quarantined) never ran again: a
    push adds a group to the ring only as its list goes from empty to not (a review's finding)."""
    from django_cogworker.features.fairness.hook import Lanes

    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    lanes = K.lanes("default")
    client.push_bulk([{"group": g, "jid": f"{g}{n}", "class": "x.Job", "args": [n], "kwargs": {},
                       "queue": "default", "retry": True} for g in ("a", "b", "held") for n in range(2)])
    r.sadd(lanes.paused, "held")
    r.delete(lanes.ring, K.queue("default"))  # (lost; and the doorbell with it)
    fetch = make_fetch()
    assert fetch.retrieve(5) == []

    assert Lanes(bclient, K, ["default"]).repair() == 2

    assert sorted(json.loads(u.raw)["jid"] for u in fetch.retrieve(10)) == ["a0", "a1", "b0", "b1"]
    assert r.llen(lanes.group("held")) == 2
    assert Lanes(bclient, K, ["default"]).repair() == 0


def test_a_single_grouped_or_prioritized_push_takes_the_one_script_path_with_its_lane(redis_url, r):
    """(The single push's own call, cached per queue and group: what perform_async of one job uses.)"""
    now = 1_800_000_000.0
    client = Client(make_config(redis_url, QUEUES=["default"], PRIORITY_AGING=60), r, clock=lambda: now)
    lanes = K.lanes("default")

    for n, group in enumerate(("a", "a", "b")):
        client.push({"group": group, "jid": f"g{n}", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default"})
    client.push({"priority": 7, "jid": "p", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default"})
    client.push({"group": "no space allowed", "jid": "x", "class": "x.Job", "args": [], "kwargs": {},
                 "queue": "default"})

    assert r.llen(lanes.group("a")) == 2 and r.llen(lanes.group("b")) == 1
    assert r.lrange(lanes.ring, 0, -1) == ["b", "a", ""]
    assert r.zrange(lanes.prio, 0, -1, withscores=True)[0][1] == now - 7 * 60
    assert json.loads(r.zrange(lanes.prio, 0, -1)[0])["enqueued_at"] == now
    # An id the fetch couldn't read: an ordinary job (the feature refuses it before a push).
    assert [json.loads(raw).get("jid") for raw in r.lrange(K.queue("default"), 0, -1)] == ["x", None]  # (a bell)


def test_the_jobs_of_one_bulk_push_of_a_priority_run_in_the_order_pushed(make_fetch, redis_url, r):
    """Equal scores were ordered by the payloads' bytes (their random jids): a bench's finding."""
    for aging in (60, 0):
        client = Client(make_config(redis_url, QUEUES=["default"], PRIORITY_AGING=aging), r)
        client.push_bulk([{"priority": 3, "jid": f"{n:x}{'zyxw'[n % 4]}", "class": "x.Job", "args": [n],
                           "kwargs": {}, "queue": "default", "retry": True} for n in range(40)])

        assert [p["args"][0] for p in drain(make_fetch(PRIORITY_AGING=aging), 40, batch=10)] == list(range(40))
        r.flushdb()


def test_on_a_cluster_one_queue_s_lanes_are_written_in_one_call_so_a_resend_writes_nothing_twice(redis_url, r):
    """A call per lane shared the queue's receipt key, which holds one call's token: redis-py's resend
    of each after a lost reply found another's token and wrote its jobs twice (a review's finding).
    (A spread key layout on a lone Redis: the calls a cluster's client would make, by slot.)"""
    spread = Keys("{cog}:", spread=True)
    client = Client(make_config(redis_url, QUEUES=["default"]), r)
    client.keys = spread
    items = [{**({"group": g} if g else {}), "jid": f"j{g}{n}", "class": "x.Job", "args": [], "kwargs": {},
              "queue": "default", "retry": True, "enqueued_at": 1.0} for g in ("a", "b", None) for n in range(2)]
    groups = [client._laned("default", "g", g, [(dict(i), 0) for i in items if i.get("group") == g], 1.0, False)
              for g in ("a", "b")]
    groups.append(client._group(spread.queue("default"), "default", [i for i in items if "group" not in i],
                                [(payloads.encode(i), None, 0) for i in items if "group" not in i]))

    calls, _listed = client._calls(groups)
    assert len(calls) == 1
    for _ in range(2):  # (the first, then redis-py's resend of it)
        assert scripts.PUSH(r, calls[0].keys, calls[0].args) == 1
    lanes = spread.lanes("default")
    plain = [json.loads(raw).get("jid") for raw in r.lrange(spread.queue("default"), 0, -1)]
    assert (r.llen(lanes.group("a")), r.llen(lanes.group("b")), sorted(filter(None, plain))) == (2, 2, ["jNone0",
                                                                                                       "jNone1"])
