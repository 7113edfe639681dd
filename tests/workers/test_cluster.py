"""Redis Cluster end to end: a real three-primary cluster (cluster_fixtures.py), real `runcogworker` workers.

The prefix becomes ``{cogworker}:`` (the home slot) and each queue's keys go to the queue's own
slot (``{cogworker:q:<q>}:``; test_cluster_spread.py has two queues on two primaries): pushes of
every kind run, a failure is retried by the poller, unique and periodic locks hold, a kill -9
is recovered by another worker, the admin answers, and every key of ours is either in the home
slot or in the queue's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import redis
from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture, texts, worker_env  # noqa: F401 - fixtures
from django.contrib.auth.models import User
from django.test import Client
from helpers import FAST_ENV, Cluster, Worker, client_for, wait_until

from django_cogworker import api
from django_cogworker.broker.cluster import parse_cluster_url, scan_page, stacked_commands, tagged_prefix
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.engine.loops import redis_time
from django_cogworker.engine.recovery.key_guard import KeyGuard
from django_cogworker.engine.schedule.wakeups import Wakeups
from django_cogworker.errors import ConfigError
from django_cogworker.push import runtime
from testproject.demo.jobs import FailJob, FlakyJob, RecordJob, SleepJob

# Failovers timed on a loaded machine: run alone, after the parallel pass (pyproject's markers).
pytestmark = pytest.mark.serial

PREFIX = "{cogworker}:"
K = Keys(PREFIX, spread=True)
SLOT0 = 1_800_000_000  # a minute boundary (the periodic entry's test clock)
ENTRY = {"name": "cl-every-minute", "cron": "* * * * *", "job": "testproject.demo.jobs.RecordJob",
         "args": ["cl:periodic", "tick"]}
BASE = "/admin/django_cogworker/"


# -- config ------------------------------------------------------------------------


def test_a_cluster_url_tags_the_prefix_and_refuses_other_databases():
    config = build_config({"REDIS_URL": "redis+cluster://:s3cret@h1:7000,h2:7001"})
    assert config.key_prefix == "{cogworker}:"
    assert "s3cret" not in repr(config)
    assert build_config({"REDIS_URL": "rediss+cluster://h1:7000/0", "KEY_PREFIX": "app:{jobs}:"}).key_prefix \
        == "app:{jobs}:"
    assert build_config({"REDIS_URL": "redis://h1:6380/0"}).key_prefix == "cogworker:"  # (a lone Redis: as given)
    assert tagged_prefix("jobs") == "{jobs}" and tagged_prefix("{x}") == "{x}"
    with pytest.raises(ConfigError) as refused:
        build_config({"REDIS_URL": "redis+cluster://h1:7000,h2:7001/2"})
    assert 'COGWORKER["REDIS_URL"]' in str(refused.value) and "one database" in str(refused.value)
    with pytest.raises(ConfigError, match=r'COGWORKER\["REDIS_OPTIONS"\].*one database'):
        build_config({"REDIS_URL": "redis+cluster://h1:7000", "REDIS_OPTIONS": {"db": 3}})
    with pytest.raises(ConfigError, match=r'COGWORKER\["REDIS_OPTIONS"\].*replicas'):
        build_config({"REDIS_URL": "redis+cluster://h1:7000", "REDIS_OPTIONS": {"read_from_replicas": True}})
    assert build_config({"REDIS_URL": "redis+cluster://h1:7000",
                         "REDIS_OPTIONS": {"require_full_coverage": False, "socket_timeout": 5}})
    with pytest.raises(ConfigError, match=r'COGWORKER\["REDIS_URL"\].*host:port'):
        build_config({"REDIS_URL": "redis+cluster://h1,h2:7001"})
    # IPv6 seeds, in brackets or not (the port is required: the last colon starts it)
    assert parse_cluster_url("redis+cluster://u:p@ss/w%3Ard@[::1]:7000,fe80::2:7001/0") == {
        "seeds": [("::1", 7000), ("fe80::2", 7001)], "username": "u", "password": "p@ss/w:rd", "ssl": False, "db": 0}
    assert build_config({"REDIS_URL": "redis+cluster://[::1]:7000"}).redis_url == "redis+cluster://[::1]:7000"
    with pytest.raises(ConfigError, match=r'COGWORKER\["REDIS_URL"\].*REDIS_OPTIONS'):
        build_config({"REDIS_URL": "redis+cluster://h1:7000?ssl_cert_reqs=none"})
    with pytest.raises(ConfigError, match=r'COGWORKER\["KEY_PREFIX"\]'):
        build_config({"REDIS_URL": "redis+cluster://h1:7000", "KEY_PREFIX": "{open:"})
    with pytest.raises(ConfigError, match=r'COGWORKER\["KEY_PREFIX"\]'):  # ("{}" is no tag to Redis)
        build_config({"REDIS_URL": "redis+cluster://h1:7000", "KEY_PREFIX": "{}jobs}:"})


# -- the engine on a cluster ---------------------------------------------------------


def test_jobs_pushed_every_way_run_retry_and_keep_to_the_home_and_the_queues_slots(cluster, cr, on_cluster):
    client = runtime.get_redis()
    assert type(client).__name__ == "RedisCluster"
    cr.set("testclock", SLOT0 + 30)
    env = worker_env(cluster, COGWORKER_CLOCK="testproject.clock.redis_clock",
                     COGWORKER_PERIODIC_TICK_INTERVAL="0.1", COGWORKER_PERIODIC=json.dumps([ENTRY]))
    with Worker(env=env, prefix=PREFIX) as worker:
        worker.wait_ready()
        RecordJob.perform_async("cl:ran", "async")
        RecordJob.perform_in(0.5, "cl:ran", "in")
        RecordJob.perform_bulk([["cl:ran", "bulk-1"], ["cl:ran", "bulk-2"]])
        first = RecordJob.set(unique_for=60).perform_async("cl:unique", "u")
        assert first is not None
        assert RecordJob.set(unique_for=60).perform_async("cl:unique", "u") is None  # the lock holds
        flaky = FlakyJob.perform_async(fails=1)
        FailJob.set(retry=0).perform_async("cl: to dead")
        wait_until(lambda: sorted(texts(cr.lrange("cl:ran", 0, -1))) == ["async", "bulk-1", "bulk-2", "in"],
                   timeout=15, message="every push ran")
        wait_until(lambda: texts(cr.lrange("cl:unique", 0, -1)) == ["u"], timeout=10)
        wait_until(lambda: cr.zcard(K.dead) == 1, timeout=10, message="the failing job dead")
        # Failed once, filed in retry, moved back by the poller (3 s later), then done.
        wait_until(lambda: f"FlakyJob {flaky}: succeeded on attempt 2" in worker.log(), timeout=20,
                   message="the flaky job retried by the poller")
        assert cr.zcard(K.retry) == 0
        # The periodic entry: primed at slot 0, then the clock moves a minute and it runs once.
        wait_until(lambda: cr.get(K.periodic_last_slot("cl-every-minute")) == str(SLOT0).encode(), timeout=15)
        cr.set("testclock", SLOT0 + 90)
        wait_until(lambda: texts(cr.lrange("cl:periodic", 0, -1)) == ["tick"], timeout=15, message="periodic ran")
        worker.term()
        assert worker.wait(30) == 0, worker.log()
    # Every key of ours in the home slot, but the queue's: in the queue's slot.
    home = cluster.node_of(K.queues)
    ours = [k for k in texts(cr.scan_iter(match="{cogworker*", target_nodes=cr.PRIMARIES))]
    slots = {cr.keyslot(k) for k in ours}
    print(f"\ncluster: home slot {cr.keyslot(K.queues)} on 127.0.0.1:{home.port}, "
          f"{len(ours)} keys in slots {sorted(slots)}")
    assert K.stat_processed in ours and slots <= {cr.keyslot(K.queues), cr.keyslot(K.queue("default"))}


def test_a_worker_killed_under_load_has_its_jobs_recovered_by_another(cluster, cr, on_cluster):
    env = worker_env(cluster)
    with Worker(env=env, prefix=PREFIX) as doomed:
        doomed.wait_ready()
        SleepJob.perform_bulk([[3, "cl:sleep"] for _ in range(8)])
        wait_until(lambda: len(cr.lrange("cl:sleep", 0, -1)) >= 4, timeout=10, message="jobs running")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
    started = {e.split(":", 1)[1] for e in texts(cr.lrange("cl:sleep", 0, -1)) if e.startswith("start:")}
    # The rescuer forks two workers (--processes 2): each builds its cluster client after the fork.
    with Worker("--processes", "2", env=env, prefix=PREFIX) as rescuer:
        wait_until(lambda: len(rescuer.children(cr)) == 2, timeout=20, message="two forked workers registered")

        def ended() -> set[str]:
            return {e.split(":", 1)[1] for e in texts(cr.lrange("cl:sleep", 0, -1)) if e.startswith("end:")}

        wait_until(lambda: len(ended()) == 8, timeout=40, message="all eight jobs finished after the kill")
        assert started <= ended()
        assert "orphan" in rescuer.log()
        assert cr.llen(K.queue("default")) == 0 and not list(scan_page(cr, 0, K.in_progress_match, 1000)[1])
        rescuer.term()
        assert rescuer.wait(30) == 0


@pytest.mark.parametrize("queues", [["-q", "default"], ["-q", "default,mail"]], ids=["one-queue", "two-queues"])
def test_basic_fetch_runs_jobs_on_a_cluster(cluster, cr, on_cluster, queues):
    """Basic fetch's BRPOP (one queue) and its pop script (several), the stats flush, the clean exit."""
    with Worker("--fetch", "basic", *queues, env=worker_env(cluster), prefix=PREFIX) as worker:
        identity = worker.wait_ready()
        RecordJob.perform_bulk([["cl:basic", i] for i in range(20)])
        wait_until(lambda: cr.llen("cl:basic") == 20, timeout=15, message="twenty jobs ran")
        worker.term()
        assert worker.wait(30) == 0
    assert int(cr.get(K.stat_processed)) == 20
    # Its clean exit left the registry (one multi-key DEL in a cluster pipeline).
    assert not cr.sismember(K.processes, identity)
    assert cr.exists(K.process(identity), K.workers(identity), K.signals(identity)) == 0


def test_a_worker_started_before_its_cluster_waits_for_it(tmp_path):
    """Building the cluster client connects (it reads the slot map): no seed answering must not end the worker."""
    seeds = Cluster(tmp_path)  # (its ports chosen, nothing listening on them yet)
    with Worker(env={**FAST_ENV, "COGWORKER_REDIS_URL": seeds.url}, prefix=PREFIX) as worker:
        wait_until(lambda: "Redis not reachable" in worker.log(), timeout=15, message="the wait logged")
        time.sleep(2)
        assert worker.alive, worker.log()
        assert worker.log().count("Redis not reachable") == 1  # (logged once, not per attempt)
        seeds.start()
        try:
            worker.wait_ready(timeout=30)
            assert "Redis reachable after" in worker.log()
            worker.term()
            assert worker.wait(30) == 0, worker.log()
        finally:
            seeds.cleanup()


# -- what the cluster client does differently -------------------------------------------


def test_a_push_pipeline_publishes_the_due_time_to_the_pollers_subscription(cluster, cr, on_cluster):
    """PUBLISH through the cluster pipeline reaches the poller's cluster pub/sub subscription."""
    heard: list[float] = []
    wakeups = Wakeups(cr, K, heard.append, time.time, threading.Event(), lambda: 5.0)

    def listen(done) -> bool:
        """Read the subscription (a slice at a time) until ``done()``, for 5 s at most."""
        deadline = time.monotonic() + 5
        while not done() and time.monotonic() < deadline:
            until = time.monotonic() + 0.05
            wakeups.wait(lambda until=until: until)
        return bool(done())

    assert listen(lambda: wakeups.subscribed)
    heard.clear()  # (a confirmed subscription sweeps at once: "now" is expected)
    at = time.time() + 60
    RecordJob.perform_at(at, "cl:later", "x")
    assert listen(lambda: heard), "the wake-up message"
    assert heard == [pytest.approx(at)]
    wakeups.after_round()  # a PING on the subscription, answered by a pong
    assert listen(lambda: wakeups._ping_waited is None)
    assert wakeups.subscribed
    wakeups.close()
    pipe = cr.pipeline(transaction=False)
    pipe.get(K.retry)
    pipe.execute_command("PUBLISH", K.schedule_wake, "1")
    assert stacked_commands(pipe) == [("GET", K.retry), ("PUBLISH", K.schedule_wake, "1")]
    pipe.reset()


def test_admin_pages_answer_on_a_cluster(cluster, cr, on_cluster, transactional_db):
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="pw"))
    RecordJob.perform_async("cl:never", "queued")  # (no worker on "mail": stays queued)
    RecordJob.set(queue="mail").perform_async("cl:never", "queued-mail")
    RecordJob.perform_in(3600, "cl:never", "scheduled")
    cr.zadd(K.retry, {json.dumps({"jid": "r" * 24, "class": "testproject.demo.jobs.FailJob", "args": ["x"],
                                  "queue": "default", "error_class": "RuntimeError", "error_message": "retry-me",
                                  "retry_count": 1, "failed_at": time.time()}): time.time() + 600})
    cr.zadd(K.dead, {json.dumps({"jid": "d" * 24, "class": "testproject.demo.jobs.FailJob", "args": ["y"],
                                 "queue": "default", "error_class": "RuntimeError", "error_message": "dead-one",
                                 "failed_at": time.time()}): time.time()})
    env = worker_env(cluster, COGWORKER_PERIODIC=json.dumps([{**ENTRY, "cron": "0 3 * * *"}]))
    with Worker("-q", "busy", env=env, prefix=PREFIX) as worker:
        identity = worker.wait_ready()
        SleepJob.set(queue="busy").perform_async(30, "cl:busy")
        wait_until(lambda: cr.hlen(K.workers(identity)), timeout=10, message="the busy job beaten in")
        wait_until(lambda: cr.hexists(K.periodic_schedule, "cl-every-minute"), timeout=10)
        pages = {p: admin.get(BASE + p) for p in ("dashboard/", "queue/", "retry/", "dead/", "scheduled/",
                                                 "busy/", "periodic/", "quarantine/", "queue/default/")}
        worker.kill9()
    assert {p: r.status_code for p, r in pages.items()} == dict.fromkeys(pages, 200)
    content = {p: r.content.decode() for p, r in pages.items()}
    home = cluster.node_of(K.queues)
    assert f"127.0.0.1:{home.port}" in content["dashboard/"] and "Connected clients" in content["dashboard/"]
    assert "mail" in content["queue/"] and "default" in content["queue/"]
    assert "retry-me" in content["retry/"] and "dead-one" in content["dead/"]
    assert "scheduled" in content["scheduled/"] and "RecordJob" in content["scheduled/"]
    assert identity in content["busy/"] and "SleepJob" in content["busy/"]
    assert "cl-every-minute" in content["periodic/"] and "0 3 * * *" in content["periodic/"]
    assert "queued" in content["queue/default/"]


def test_scripts_transactions_the_key_guard_and_quarantine_work_in_their_slots(cluster, cr, on_cluster):
    """What runs outside the worker test: NOSCRIPT reload on the slot's node, MULTI pipelines
    (the admin's clear and retry-all), RENAME to a quarantine key, SCAN over every primary."""
    RecordJob.perform_async("cl:x", 1)
    for node in cluster.nodes:  # (a failover to a replica that never saw the script: the same)
        c = node.client()
        c.script_flush()
        c.close()
    RecordJob.perform_async("cl:x", 2)  # EVALSHA -> NOSCRIPT -> EVAL, on the node owning the slot
    assert cr.llen(K.queue("default")) == 2
    assert api.Queue("default", redis=cr, keys=K).clear() == 2  # a MULTI/EXEC pipeline
    cr.zadd(K.retry, {json.dumps({"jid": "r" * 24, "class": "testproject.demo.jobs.RecordJob",
                                  "args": ["cl:x"], "queue": "default"}): time.time() + 600})
    assert api.RetrySet(redis=cr, keys=K).retry_all() == 1
    assert cr.llen(K.queue("default")) == 1 and cr.zcard(K.retry) == 0
    assert abs(redis_time(cr) - time.time()) < 5  # TIME from a node (the home node, for make_redis's client)

    cr.set(K.dead, "not a zset")  # the key guard moves it aside: RENAME within the slot
    assert KeyGuard(cr, K, ["default"]).check() == [K.dead]
    (moved,) = api.QuarantinedKey.all(redis=cr, keys=K)
    assert moved.original == K.dead and moved.type == "string"
    assert cluster.node_of(moved.key) is cluster.node_of(K.queues)
    assert moved.restore() and cr.get(K.dead) == b"not a zset"


def test_a_unique_push_writes_its_lock_and_its_job_together_in_the_home_slot(cluster, cr, on_cluster):
    """The lock (home slot) and the queue (its own slot) can't share a script: a unique job for now
    is scheduled due now, beside its lock, in one call, and the pollers move it to its queue. Writes
    the home node refuses leave no lock, and the job goes through once they are taken."""
    home = cluster.node_of(K.queues)
    node = home.client()
    try:
        node.config_set("min-replicas-to-write", 1)  # (no replica: every write refused)
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            RecordJob.set(unique_for=60).perform_async("cl:unique", "u")
        node.config_set("min-replicas-to-write", 0)
        assert not node.keys("*")  # no lock, no job, no receipt
        for n in cluster.nodes:  # (the scripts forgotten: every call of the next pipeline reloads its own)
            c = n.client()
            c.script_flush()
            c.close()
        jids = RecordJob.perform_bulk([["cl:bulk", 1], ["cl:bulk", 2]])
        mail = RecordJob.set(queue="mail").perform_async("cl:bulk", 3)
        unique = RecordJob.set(unique_for=60).perform_async("cl:unique", "u")
        assert unique is not None and RecordJob.set(unique_for=60).perform_async("cl:unique", "u") is None
    finally:
        node.close()
    (lock,) = texts(cr.scan_iter(match=K.unique("*"), target_nodes=cr.PRIMARIES))
    assert cr.get(lock) == unique.encode()
    ((raw, score),) = cr.zrange(K.schedule, 0, -1, withscores=True)
    assert json.loads(raw)["jid"] == unique and score <= time.time()
    assert sorted(json.loads(raw)["jid"] for raw in cr.lrange(K.queue("default"), 0, -1)) == sorted(jids)
    assert [json.loads(raw)["jid"] for raw in cr.lrange(K.queue("mail"), 0, -1)] == [mail]
    assert set(texts(cr.smembers(K.queues))) == {"default", "mail"}


def test_a_failover_of_the_slots_primary_under_load(tmp_path, settings):
    """kill -9 of the home slot's primary: its replica takes over; the worker and the pushers carry on.

    Every job pushed before the kill was replicated first (WAIT), so none may be lost; one may run
    twice (at-least-once: an ack the old primary took but didn't pass on). Pushes refused during
    the failover are retried by the test, as a caller would; the counts are printed.
    """
    with Cluster(tmp_path) as ha:
        home = ha.node_of(K.queues)
        replica = ha.add_replica(home)
        settings.COGWORKER = {**settings.COGWORKER, "REDIS_URL": ha.url}
        cr = client_for(ha.url)
        try:
            with Worker("-c", "4", env=worker_env(ha), prefix=PREFIX) as worker:
                worker.wait_ready()
                pushed = [f"before-{i}" for i in range(200)]
                RecordJob.perform_bulk([["cl:fo", v] for v in pushed])
                primary = home.client()
                assert primary.execute_command("WAIT", 1, 5000) == 1  # (replicated before the kill)
                primary.close()
                wait_until(lambda: cr.llen("cl:fo") >= 20, timeout=10, message="jobs running")
                home.kill()
                failed_pushes = 0
                for i in range(50):  # pushes go on through the failover: each refused one retried
                    while True:
                        try:
                            RecordJob.perform_async("cl:fo", f"after-{i}")
                            break
                        except Exception:  # noqa: BLE001 - the primary is gone until the replica is promoted
                            failed_pushes += 1
                            time.sleep(0.2)
                    pushed.append(f"after-{i}")

                def ran() -> list[str]:
                    return texts(cr.lrange("cl:fo", 0, -1))

                wait_until(lambda: set(pushed) <= set(ran()), timeout=60, message="every job pushed ran")
                runs = ran()
                twice = len(runs) - len(set(runs))
                print(f"\ncluster failover: {len(pushed)} pushed, {len(set(runs))} ran, {twice} ran twice, "
                      f"{failed_pushes} push attempts refused during the failover (retried)")
                assert worker.alive, worker.log()
                assert twice <= 4  # (at most the acks in flight: one per processor)
                new_home = client_for(ha.url)
                assert new_home.get_node_from_key(K.queues).port == replica.port
                new_home.close()
                worker.term()
                assert worker.wait(30) == 0, worker.log()
        finally:
            cr.close()
            runtime.reset()
