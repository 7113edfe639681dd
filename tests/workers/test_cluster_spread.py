"""Redis Cluster, queues spread across shards: each queue's keys in its own slot (broker/keys/).

A real three-primary cluster (cluster_fixtures.py: one for the session, shared with
test_cluster.py). Two queues picked to land on different primaries: a worker drains both, a
kill -9 leaves per-queue in-progress lists that another worker recovers, two due pollers move
each entry once (and a poller dead between its lease and its push leaves the entry to come due
again), a failure is filed in retry across slots, a queue key is quarantined within its slot,
and the admin's pruning crosses slots.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pytest
import redis as redis_lib
from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture, texts, worker_env  # noqa: F401 - fixtures
from helpers import Worker, client_for, wait_until

from django_cogworker import api
from django_cogworker.broker import crossings, scripts
from django_cogworker.broker.crossings import LEASE_SECONDS
from django_cogworker.broker.keys import Keys, for_config
from django_cogworker.conf import build_config
from django_cogworker.engine.fetch.registry import make_fetch
from django_cogworker.engine.recovery.key_guard import KeyGuard
from django_cogworker.engine.recovery.orphans import OrphanRecovery
from django_cogworker.engine.schedule.due import DueSweep
from django_cogworker.engine.settle.retry import RetryPolicy
from testproject.demo.flow_jobs import PairJob, PartnerCallJob
from testproject.demo.jobs import FailJob, FlakyJob, RecordJob, SleepJob

PREFIX = "{cogworker}:"
K = Keys(PREFIX, spread=True)


@pytest.fixture(scope="module")
def two_queues(cluster) -> list[str]:
    """Two queue names whose slots two different primaries serve."""
    names, ports = [], set()
    for i in range(200):
        port = cluster.node_of(K.queue(f"q{i}")).port
        if port not in ports:
            names.append(f"q{i}")
            ports.add(port)
        if len(names) == 2:
            return names
    raise AssertionError("no two queues on two primaries")


def entry(jid: str, queue: str) -> str:
    return json.dumps({"jid": jid, "class": "testproject.demo.jobs.RecordJob", "args": ["sp:due", jid],
                       "queue": queue, "created_at": 1.0})


def sweeper(cluster, clock=time.time) -> DueSweep:
    config = build_config({"REDIS_URL": cluster.url})
    return DueSweep(client_for(cluster.url), for_config(config), RetryPolicy(config), random.Random(1), clock,
                    threading.Event())


def test_the_key_names_on_a_cluster_and_off_it():
    assert for_config(build_config({"REDIS_URL": "redis+cluster://h1:7000"})).spread
    plain = for_config(build_config({"REDIS_URL": "redis://h1:6380/0"}))
    assert not plain.spread and plain.queue("mail") == "cogworker:queue:mail"  # (a lone Redis: unchanged)
    assert plain.in_progress("h:1", "mail") == "cogworker:in_progress:h:1"
    assert K.queue("mail") == "{cogworker:q:mail}:queue" and K.queue_name(K.queue("a}b")) == "a}b"
    assert K.in_progress("h:1", "mail") == "{cogworker:q:mail}:in_progress:h:1"
    assert K.in_progress_parts(K.in_progress("h:1", "mail").encode()) == ("h:1", b"mail")
    assert K.schedule == "{cogworker}:schedule"  # (the home slot)
    user = Keys("app:{jobs}:", spread=True)  # a tag of the user's own: the queue goes inside it
    assert user.queue("mail") == "app:{jobs:q:mail}:queue"


def test_two_queues_on_two_primaries_are_drained_by_one_worker(cluster, cr, on_cluster, two_queues):
    a, b = two_queues
    assert cluster.node_of(K.queue(a)) is not cluster.node_of(K.queue(b))
    assert cr.keyslot(K.queue(a)) != cr.keyslot(K.queues)
    with Worker("-q", f"{a},{b}", env=worker_env(cluster), prefix=PREFIX) as worker:
        identity = worker.wait_ready()
        RecordJob.set(queue=a).perform_async("sp:ran", "async-a")
        RecordJob.set(queue=b).perform_async("sp:ran", "async-b")
        RecordJob.set(queue=b).perform_in(0.5, "sp:ran", "in-b")
        RecordJob.set(queue=a).perform_bulk([["sp:ran", "bulk-1"], ["sp:ran", "bulk-2"]])
        flaky = FlakyJob.set(queue=b).perform_async(fails=1)
        FailJob.set(queue=a, retry=0).perform_async("sp: to dead")
        wait_until(lambda: sorted(texts(cr.lrange("sp:ran", 0, -1))) ==
                   ["async-a", "async-b", "bulk-1", "bulk-2", "in-b"], timeout=15, message="every push ran")
        wait_until(lambda: cr.zcard(K.dead) == 1, timeout=10, message="the failing job filed in dead")
        wait_until(lambda: f"FlakyJob {flaky}: succeeded on attempt 2" in worker.log(), timeout=20,
                   message="the flaky job filed in retry, moved back by the poller, run again")
        # Held while it runs: the in-progress list of that queue, on the queue's primary.
        SleepJob.set(queue=b).perform_async(30, "sp:sleep")
        wait_until(lambda: cr.llen(K.in_progress(identity, b)) == 1, timeout=10, message="b's in-progress list")
        assert cluster.node_of(K.in_progress(identity, b)) is cluster.node_of(K.queue(b))
        worker.term()
        assert worker.wait(30) == 0, worker.log()
    assert int(cr.get(K.stat_processed)) >= 7
    assert cr.llen(K.queue(b)) == 1  # the sleeping job, handed back to its queue at shutdown
    assert not cr.sismember(K.in_progress_identities, identity)  # every list empty: forgotten
    assert {m.decode() for m in cr.smembers(K.queues)} >= {a, b}


def test_a_worker_killed_mid_job_has_each_queues_list_recovered(cluster, cr, on_cluster, two_queues):
    a, b = two_queues
    env = worker_env(cluster)
    with Worker("-q", f"{a},{b}", env=env, prefix=PREFIX) as doomed:
        identity = doomed.wait_ready()
        SleepJob.set(queue=a).perform_bulk([[3, "sp:sleep"] for _ in range(2)])
        SleepJob.set(queue=b).perform_bulk([[3, "sp:sleep"] for _ in range(2)])
        wait_until(lambda: cr.llen(K.in_progress(identity, a)) and cr.llen(K.in_progress(identity, b)),
                   timeout=10, message="jobs of both queues running")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
    with Worker("-q", f"{a},{b}", env=env, prefix=PREFIX) as rescuer:
        rescuer.wait_ready()

        def ended() -> set[str]:
            return {e.split(":", 1)[1] for e in texts(cr.lrange("sp:sleep", 0, -1)) if e.startswith("end:")}

        wait_until(lambda: len(ended()) == 4, timeout=40, message="all four jobs finished after the kill")
        assert "recovered" in rescuer.log()
        wait_until(lambda: not cr.sismember(K.in_progress_identities, identity), timeout=10)
        assert cr.exists(K.in_progress(identity, a), K.in_progress(identity, b)) == 0
        rescuer.term()
        assert rescuer.wait(30) == 0


def test_two_due_pollers_move_each_entry_once(cluster, cr, two_queues):
    a, b = two_queues
    now = time.time()
    cr.zadd(K.schedule, {entry(f"j{i}", a if i % 2 else b): now - 1 - i / 1000 for i in range(60)})
    sweeps = [sweeper(cluster), sweeper(cluster)]
    moved: list[int] = []
    threads = [threading.Thread(target=lambda s=s: moved.append(s.sweep())) for s in sweeps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(moved) == 60 and cr.zcard(K.schedule) == 0
    pushed = [json.loads(raw)["jid"] for q in (a, b) for raw in cr.lrange(K.queue(q), 0, -1)]
    assert sorted(pushed) == sorted(f"j{i}" for i in range(60))  # each once
    assert cr.llen(K.queue(a)) == 30 and {m.decode() for m in cr.smembers(K.queues)} == {a, b}


def test_a_poller_dead_between_lease_and_push_leaves_the_entry_to_come_due_again(cluster, cr, two_queues):
    a = two_queues[0]
    now = time.time()
    raw = entry("leased", a)
    cr.zadd(K.schedule, {raw: now - 1})
    # The first step of a move, as a poller that dies right after it leaves it: leased a minute ahead.
    assert scripts.LEASE(cr, [K.schedule], [raw, repr(now - 1), repr(now + LEASE_SECONDS)]) == [1]
    assert scripts.LEASE(cr, [K.schedule], [raw, repr(now - 1), repr(now + 99)]) == [0]  # (another: refused)
    assert sweeper(cluster, clock=lambda: now).sweep() == 0  # not due again yet: nobody pushes it twice
    assert cr.llen(K.queue(a)) == 0 and cr.zscore(K.schedule, raw) == pytest.approx(now + LEASE_SECONDS)
    assert sweeper(cluster, clock=lambda: now + LEASE_SECONDS + 1).sweep() == 1  # due again: moved
    assert cr.zcard(K.schedule) == 0 and json.loads(cr.lrange(K.queue(a), 0, -1)[0])["jid"] == "leased"


def test_a_queue_key_is_quarantined_in_its_slot_and_the_admin_moves_across_slots(cluster, cr, on_cluster,
                                                                                   two_queues):
    a, b = two_queues
    cr.set(K.queue(a), "not a list")
    assert KeyGuard(cr, K, [a]).check() == [K.queue(a)]  # RENAME within a's slot
    (moved,) = api.QuarantinedKey.all(redis=cr, keys=K)
    assert moved.original == K.queue(a) and moved.type == "string"
    assert cluster.node_of(moved.key) is cluster.node_of(K.queue(a))
    assert moved.restore() and cr.get(K.queue(a)) == b"not a list"
    cr.delete(K.queue(a))
    # The admin's "retry all" and "run now": leased, pushed to each queue's slot, removed.
    for i, q in enumerate((a, b, b)):
        cr.zadd(K.retry, {entry(f"r{i}", q): time.time() + 600 + i})
    assert api.RetrySet(redis=cr, keys=K).retry_all() == 3
    assert (cr.llen(K.queue(a)), cr.llen(K.queue(b)), cr.zcard(K.retry)) == (1, 2, 0)
    cr.zadd(K.schedule, {entry("s", a): time.time() + 600})
    (scheduled,) = api.ScheduledSet(redis=cr, keys=K).page().items
    assert scheduled.enqueue_now() and not scheduled.enqueue_now()  # (twice: moved once)
    assert cr.llen(K.queue(a)) == 2
    # Pruning crosses slots too: an empty queue's name goes, a queue with jobs stays.
    cr.sadd(K.queues, "empty")
    assert api.Queue.prune(redis=cr, keys=K) == 1
    assert {m.decode() for m in cr.smembers(K.queues)} == {a, b}


def test_a_batch_s_and_a_limiter_key_s_keys_of_the_wrong_type_are_quarantined_in_their_own_slots(cluster, cr):
    # (Named in the home slot, their quarantine was a RENAME across slots: CROSSSLOT, never moved.)
    from django_cogworker import Limiter
    from django_cogworker.features.batches import steps

    bk = K.batch("b1")
    cr.hset(bk.meta, mapping={"created_at": "1", "committed": "1"})
    cr.sadd(bk.jobs, "j1")
    cr.set(bk.pending, "not a set")
    steps.settle(cr, K, "b1", "j1", "success", "", 60)
    with Limiter.concurrent("cluster:poisoned", 1, lease=60).within(redis=cr, keys=K):
        cr.set(K.limit("cluster:poisoned").holders, "not a zset")
    moved = {q.original: q for q in api.QuarantinedKey.all(redis=cr, keys=K)}
    assert set(moved) == {bk.pending, K.limit("cluster:poisoned").holders}
    for original, quarantined in moved.items():
        assert cluster.node_of(quarantined.key) is cluster.node_of(original) and quarantined.type == "string"
    assert cr.hexists(bk.meta, "lost:pending") and cr.hexists(K.limit("cluster:poisoned").stats, "lost:holders")


def test_a_run_now_whose_push_fails_leaves_the_entry_where_it_was(cluster, cr, two_queues):
    a = two_queues[0]
    cr.set(K.queue(a), "not a list")  # its queue's push is refused (WRONGTYPE), in the queue's slot
    at = time.time() + 600
    for key, kind in ((K.schedule, api.ScheduledSet), (K.retry, api.RetrySet)):
        raw = entry(f"{kind.name}-1", a)
        cr.zadd(key, {raw: at})
        (shown,) = kind(redis=cr, keys=K).page().items
        with pytest.raises(redis_lib.exceptions.ResponseError, match="WRONGTYPE"):
            shown.enqueue_now()
        # Still due at its own time, not a lease's minute from now.
        assert cr.zscore(key, raw) == at, kind.name
    cr.delete(K.queue(a))
    (shown,) = api.ScheduledSet(redis=cr, keys=K).page().items  # (its token is still good: same score)
    assert shown.enqueue_now() and cr.zcard(K.schedule) == 0 and cr.llen(K.queue(a)) == 1


def test_retry_all_moves_every_entry_while_others_leave_and_join_the_set(cluster, cr, two_queues, monkeypatch):
    a, b = two_queues
    cr.set(K.queue(b), "not a list")  # b's entries can't move: they stay where they are, behind the walk
    at = time.time() + 600
    # 1,800 movable entries (four batches), seven to a score (a bulk pushed for one time), and
    # one stuck entry after every hundred.
    movable = {entry(f"r{i}", a): at + i // 7 for i in range(1_800)}
    stuck = {entry(f"s{j}", b): at + j * 100 / 7 + 0.5 for j in range(18)}
    cr.zadd(K.retry, {**movable, **stuck})
    real = crossings.zset_to_queues
    joined = []

    def with_others_at_work(redis, keys, source, moves, now):
        """Each batch's move, then what others do meanwhile: two of the entries left behind are
        deleted (from another admin page), one joins in front and one at the end."""
        outcomes = real(redis, keys, source, moves, now)
        left = [raw for (raw, _score, queue, _payload) in moves if queue == b]
        if left:
            cr.zrem(K.retry, *left[:2])
        n = len(joined)
        joined.extend([f"early{n}", f"late{n}"])
        cr.zadd(K.retry, {entry(f"early{n}", a): time.time() - 1, entry(f"late{n}", a): at + 10_000})
        return outcomes

    monkeypatch.setattr(crossings, "zset_to_queues", with_others_at_work)
    done = api.RetrySet(redis=cr, keys=K).retry_all()
    pushed = [json.loads(raw)["jid"] for raw in cr.lrange(K.queue(a), 0, -1)]
    assert len(pushed) == len(set(pushed))  # each once
    missed = sorted({f"r{i}" for i in range(1_800)} - set(pushed))
    assert not missed, f"{len(missed)} entries skipped, such as {missed[:5]}"
    assert done == len(pushed) and set(pushed) - {f"r{i}" for i in range(1_800)} <= set(joined)
    # The stuck entries nobody deleted are still there, each at its own score.
    kept = {raw: score for raw, score in stuck.items() if cr.zscore(K.retry, raw) is not None}
    assert kept and all(cr.zscore(K.retry, raw) == score for raw, score in kept.items())


@pytest.mark.parametrize("name", [b"\xff\xfe-not-utf-8", b"x}:in_progress:y"], ids=["not-utf-8", "holding-the-marker"])
def test_a_dead_process_list_found_by_its_key_goes_back_to_its_own_queue_whatever_its_name(cluster, cr, name):
    # The layout broker/keys/ documents, written by hand: {cogworker:q:<queue>}:in_progress:<identity>.
    dead = "host:1:abc"
    list_key = b"{cogworker:q:" + name + b"}:in_progress:" + dead.encode()
    queue_key = b"{cogworker:q:" + name + b"}:queue"
    cr.rpush(list_key, entry("orphan", "default"))
    cr.hset(K.last_beat, dead, repr(time.time() - 3_600))  # silent for an hour; listed nowhere else
    config = build_config({"REDIS_URL": cluster.url})
    recovery = OrphanRecovery(config, cr, for_config(config), "rescuer:2:def", RetryPolicy(config))
    assert recovery.check() == 1  # (discovery's SCAN found the list, and the process it belongs to)
    (requeued,) = cr.lrange(queue_key, 0, -1)
    assert json.loads(requeued)["jid"] == "orphan" and json.loads(requeued)["orphaned_from"] == dead
    assert not cr.exists(list_key) and cr.sismember(K.queues, name)
    assert cr.smembers(K.in_progress_identities) == set()  # forgotten once its list was empty; no other made up


def test_a_job_taken_before_a_stall_is_asked_about_in_its_own_queue_s_slot(cluster, cr, two_queues):
    # (test_fetch.py has the lone Redis's.) The stamp in the home slot, then the list in the queue's.
    config = build_config({"REDIS_URL": cluster.url, "QUEUES": two_queues})
    fetch = make_fetch(config, cr, for_config(config), "host:1:abc")
    for queue in two_queues:
        cr.lpush(K.queue(queue), entry(f"in-{queue}", queue))
    kept, requeued = sorted(fetch.retrieve(2), key=lambda unit: unit.queue)
    cr.lrem(fetch.list_of(requeued.queue), 1, requeued.raw)  # as orphan recovery does

    assert fetch.still_ours(kept) and not fetch.still_ours(requeued)

    assert cr.hexists(K.last_beat, "host:1:abc") and cr.sismember(K.in_progress_identities, "host:1:abc")
    cr.set(K.orphan_lock("host:1:abc"), "live:2:def")  # another process recovering the lists now
    assert not fetch.still_ours(kept)
    assert cr.lrange(fetch.list_of(kept.queue), 0, -1) == [kept.raw]  # (asking moves nothing)


def test_limits_hold_on_a_cluster_each_key_in_its_own_slot(cluster, cr, on_cluster):
    """A limiter key's keys share one slot of their own; a job with two limits in two slots takes them
    one slot at a time, giving the first back when the second refuses; a place given back wakes a
    waiting job across slots (docs/flow-control.md)."""
    pair, mail = K.limit("demo:pair"), K.limit("demo:mail")
    assert len({cluster.node_of(key).port for key in pair}) == 1  # (all six in one slot)
    assert pair.holders.startswith("{cogworker:l:demo:pair}:")
    env = worker_env(cluster, COGWORKER_CONCURRENCY="6", DEMO_LIMIT_LEASE="2")
    # (The jobs' own records: "{cl:pair}:now" and "{cl:pair}:max" in one slot, for their script.)
    jids = set(PairJob.perform_bulk([["{cl:pair}", 0.02]] * 20)) | set(
        PartnerCallJob.perform_bulk([["{cl:p}", 0.02]] * 20))
    with Worker(env=env, prefix=PREFIX) as worker:
        worker.wait_ready()
        wait_until(lambda: cr.llen("{cl:pair}:done") + cr.llen("{cl:p}:done") == 40, timeout=60,
                   message="limited jobs not all done on the cluster")
    assert set(texts(cr.lrange("{cl:pair}:done", 0, -1) + cr.lrange("{cl:p}:done", 0, -1))) == jids
    assert int(cr.get("{cl:pair}:max")) == 1 and int(cr.get("{cl:p}:max")) <= 3
    assert cr.zcard(pair.holders) == 0 and cr.zcard(pair.waiting) == 0 and cr.hlen(pair.parked) == 0
    # Every start of a PairJob counted once in its bucket: none left counted by a take undone.
    assert int(cr.hget(mail.stats, "granted")) == 20


def test_a_queue_s_groups_and_priorities_live_in_its_slot_and_run(cluster, cr, on_cluster, two_queues):
    """A queue's lanes are named inside the fetch and push scripts from its key (broker/scripts/
    lanes.py): on a cluster they must share its slot, or every script touching them fails."""
    a, _b = two_queues
    lanes = K.lanes(a)
    RecordJob.set(queue=a, group="acme").perform_bulk([["sp:lanes", f"acme-{i}"] for i in range(3)])
    RecordJob.set(queue=a, group="zeta").perform_async("sp:lanes", "zeta-0")
    RecordJob.set(queue=a, priority=5).perform_async("sp:lanes", "urgent")
    RecordJob.set(queue=a).perform_in(0.2, "sp:lanes", "later")
    RecordJob.set(queue=a, group="acme").perform_in(0.2, "sp:lanes", "acme-later")
    slot = cr.keyslot(K.queue(a))
    assert {cr.keyslot(key) for key in (lanes.ring, lanes.prio, lanes.group("acme"))} == {slot}
    assert cr.llen(lanes.group("acme")) == 3 and cr.zcard(lanes.prio) == 1
    time.sleep(0.5)  # (the scheduled ones due)
    with Worker("-q", a, "-c", "1", env=worker_env(cluster), prefix=PREFIX) as worker:
        worker.wait_ready()
        wait_until(lambda: cr.llen("sp:lanes") == 7, timeout=15, message="every grouped and prioritized job ran")
        ran = texts(cr.lrange("sp:lanes", 0, -1))
        worker.term()
        assert worker.wait(30) == 0, worker.log()
    assert ran[0] == "urgent"  # (a single processor: the priority first, then the groups in turns)
    assert ran.index("zeta-0") < ran.index("acme-2")
    assert not cr.exists(lanes.ring, lanes.prio, lanes.group("acme"))


def test_pushes_that_collapse_on_a_cluster_go_through_the_schedule_and_run_once(cluster, cr, on_cluster, two_queues):
    """A collapse state is in the home slot, a queue in its own: a keep_last follow-up is written
    through the schedule (features/collapse/hook.py RunEnded), and a debounced bulk runs once."""
    from testproject.demo.collapse_jobs import DebouncedJob, KeepLastJob

    a, _b = two_queues
    key, bulk = "sp:keep_last", "sp:debounced"
    with Worker("-q", a, "-c", "2", env=worker_env(cluster), prefix=PREFIX) as worker:
        worker.wait_ready()
        first = KeepLastJob.set(queue=a).push(key, 0, True)
        wait_until(lambda: texts(cr.lrange(key, 0, -1)) == ["0"], timeout=15, message="the first run began")
        outcomes = [KeepLastJob.set(queue=a).push(key, n) for n in (1, 2)]
        assert [o.status for o in outcomes] == ["pushed", "replaced"] and outcomes[0].other == first.jid
        jids = DebouncedJob.set(queue=a, dedup_key="sp").perform_bulk([[bulk, n] for n in range(5)])
        assert len(set(jids)) == 1
        cr.set(f"{key}:go", 1)
        wait_until(lambda: cr.llen(key) == 2 and cr.llen(bulk) == 1, timeout=20,
                   message="the follow-up and the debounced job ran")
        worker.term()
        assert worker.wait(30) == 0, worker.log()
    assert texts(cr.lrange(key, 0, -1)) == ["0", "2"] and texts(cr.lrange(bulk, 0, -1)) == ["4"]
