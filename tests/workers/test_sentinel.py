"""Redis Sentinel: redis+sentinel:// URLs, and a failover under load with real servers.

The failover test starts a primary, a replica and three sentinels on loopback (tests/helpers.py
``Sentinels``), a real ``runcogworker --processes 2`` and two pushing threads, then kills the
primary -9. What ran is recorded in a file (``TimedMarkJob``), outside Redis, so the record
survives the failover.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path

import pytest
import redis
from helpers import FAST_ENV, Sentinels, Worker, connect, poll, replication_info, wait_until

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.broker.sentinel import CHECK_INTERVAL, SentinelRedis, parse
from django_cogworker.conf import build_config
from django_cogworker.errors import ConfigError
from django_cogworker.push.client import Client
from testproject.demo.jobs import TimedMarkJob

# Failovers timed on a loaded machine: run alone, after the parallel pass (pyproject's markers).
pytestmark = pytest.mark.serial

# The replication window the docs name (docs/deployment.md, "Redis Sentinel"): a write
# acknowledged by the primary this long before it died may be missing from the replica.
# On loopback it is a few milliseconds; a second is the bound asserted.
REPLICATION_WINDOW = 1.0


# -- URLs --------------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    target = parse("rediss+sentinel://worker:p%40ss@s1:26380,s2,[::1]:26381/mymaster/2"
                   "?sentinel_password=sentry&sentinel_username=watch")
    assert target.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (target.service, target.db, target.tls) == ("mymaster", 2, True)
    assert (target.username, target.password) == ("worker", "p@ss")
    assert (target.sentinel_username, target.sentinel_password) == ("watch", "sentry")
    assert parse("redis+sentinel://s1/mymaster").db == 0


def test_the_client_is_built_for_the_primary_with_the_sentinels_credentials_apart():
    config = build_config({"REDIS_URL": "redis+sentinel://:primary-pw@127.0.0.1:1,127.0.0.1:2/svc/3"
                                        "?sentinel_password=sentinel-pw",
                           "REDIS_OPTIONS": {"socket_timeout": 4.0}})
    client = make_redis(config)
    try:
        assert isinstance(client, SentinelRedis)
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["password"], kwargs["db"], kwargs["socket_timeout"]) == ("primary-pw", 3, 4.0)
        assert client.connection_pool.service_name == "svc"
        assert client.sentinels is not None
        assert [s.connection_pool.connection_kwargs["password"] for s in client.sentinels.sentinels] == \
            ["sentinel-pw", "sentinel-pw"]
    finally:
        client.close()


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel://s1:port/mymaster/0", "a numeric port for each sentinel (not 's1:port')"),
    ("redis+sentinel://s1:26379", "a URL naming the service after the hosts"),
    ("redis+sentinel://s1,,s2/mymaster", "a list of sentinels"),
    ("redis+sentinel://[::1/mymaster", "a list of sentinels, host:port separated by commas (not '[::1')"),
    ("redis+sentinel://s1:26379#x/mymaster", "a URL without a #fragment"),
    ("redis+sentinel://s1/mymaster/zero", "a database number after the service (not 'zero')"),
    ("redis+sentinel://s1/mymaster/0?db=1", "a URL whose query has only sentinel_password or sentinel_username"),
    ("sentinel://s1/mymaster", "a redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://, "
                               "redis+cluster:// or rediss+cluster:// URL"),
])
def test_a_bad_sentinel_url_fails_at_startup_naming_the_setting(url, says):
    with pytest.raises(ConfigError) as info:
        build_config({"REDIS_URL": url.replace("://", "://:hunter2@", 1)})
    message = str(info.value)
    assert message.startswith('COGWORKER["REDIS_URL"] must be ')
    assert says in message
    assert "hunter2" not in message and ":***@" in message


def test_the_sentinel_password_in_the_query_is_masked():
    config = build_config({"REDIS_URL": "redis+sentinel://:pw@s1/m?sentinel_password=hunter2"})
    assert config.redacted_url == "redis+sentinel://:***@s1/m?sentinel_password=***"
    assert "hunter2" not in repr(config)


@pytest.mark.parametrize(("options", "says"), [
    ({"sentinel_kwargs": {"bogus": 1}}, "sentinel_kwargs"),
    ({"sentinel_check_interval": 0}, "sentinel_check_interval must be a positive number of seconds, got 0"),
])
def test_an_option_the_sentinel_client_refuses_fails_at_startup(options, says):
    with pytest.raises(ConfigError) as info:
        build_config({"REDIS_URL": "redis+sentinel://s1/m", "REDIS_OPTIONS": options})
    assert str(info.value).startswith('COGWORKER["REDIS_OPTIONS"]') and says in str(info.value)


def test_the_sentinels_get_short_timeouts_unless_told_otherwise():
    config = build_config({"REDIS_URL": "redis+sentinel://s1/m", "REDIS_OPTIONS": {"socket_keepalive": True}})
    client = make_redis(config)
    try:
        kwargs = client.sentinels.sentinels[0].connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["socket_keepalive"]) == \
            (1.0, 1.0, True)
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 10.0  # (the data connections')
    finally:
        client.close()


# -- failover ----------------------------------------------------------------------------


def read_marks(path: Path) -> list[tuple[str, str, float, str, str]]:
    """(kind, jid, time, tag, slot) of each TimedMarkJob line."""
    if not path.exists():
        return []
    rows = []
    # (The last line may be a write still under way, read in part: only whole lines count.)
    for line in path.read_text().split("\n")[:-1]:
        kind, jid, at, tag, slot = line.split()
        rows.append((kind, jid, float(at), tag, slot))
    return rows


class Pusher(threading.Thread):
    """Pushes TimedMarkJob as an application would: a push that fails is tried again (a new jid,
    the same arguments); every third job is unique (``unique_for`` an hour, one tag per job)."""

    def __init__(self, name: str, client: Client, path: Path):
        super().__init__(name=name, daemon=True)
        self.client, self.path = client, path
        self.stopping = threading.Event()
        self.acknowledged: dict[str, tuple[float, str]] = {}  # jid -> (time acknowledged, tag)
        self.failed = 0  # pushes that raised (Redis away): tried again
        self.refused: list[str] = []  # tags of unique pushes refused as duplicates

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            tag = f"{self.name}-{n}"
            unique = n % 3 == 0
            while not self.stopping.is_set():
                setter = TimedMarkJob.set(unique_for=3600) if unique else TimedMarkJob.set()
                payload = setter.build([str(self.path), 0.01, tag], {})
                try:
                    jid = self.client.push(payload, on_commit=False)
                except redis.RedisError:
                    self.failed += 1
                    time.sleep(0.05)
                    continue
                if jid is None:
                    self.refused.append(tag)
                else:
                    self.acknowledged[jid] = (time.time(), tag)
                break
            time.sleep(0.004)


@pytest.mark.parametrize("how", ["kill", "demote", "demote-min-replicas"])
def test_a_failover_under_load_loses_or_repeats_only_what_replication_had_not_copied(tmp_path, how):
    """``kill``: the primary is killed -9 and the sentinels elect the replica. ``demote``: an operator's
    ``SENTINEL FAILOVER`` (or a partition): the old primary stays up, still a primary to the clients
    connected to it, until the sentinels make it a replica (it then drops their connections).
    ``demote-min-replicas``: the same, the primary set with ``min-replicas-to-write 1`` as the docs
    advise: it refuses writes (NOREPLICAS, retried) once its replica has left."""
    path = tmp_path / "marks.txt"
    primary_args = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "2") if how.endswith("replicas") else ()
    sentinels = Sentinels(tmp_path / "servers", primary_args=primary_args).start()
    periodic = {"name": "every-second", "cron": "* * * * * *", "job": "testproject.demo.jobs.TimedMarkJob",
                "args": [str(path), 0.0, "periodic"], "until_executed": True}
    env = {**FAST_ENV, "COGWORKER_REDIS_URL": sentinels.url, "COGWORKER_CONCURRENCY": "4",
           # Longer than the failover and the reconnects: this test is about the failover, not about
           # live processes taken for dead after it (test_faults covers that).
           "COGWORKER_ORPHAN_THRESHOLD": "15", "COGWORKER_PERIODIC": json.dumps([periodic]),
           "COGWORKER_PERIODIC_TICK_INTERVAL": "0.2"}
    config = build_config({}, {"COGWORKER_REDIS_URL": sentinels.url})
    app_redis = make_redis(config)  # one client for both pushers, as in a web process
    pushers = [Pusher(f"pusher{i}", Client(config, app_redis), path) for i in range(2)]
    keys = Keys(config.key_prefix)
    worker = Worker("--processes", "2", env=env, log_path=tmp_path / "worker.log")
    watcher = connect(sentinels.url, socket_timeout=2)
    try:
        wait_until(lambda: len(worker.children(watcher)) == 2, timeout=30, message="two worker processes ready")
        for pusher in pushers:
            pusher.start()
        wait_until(lambda: len(read_marks(path)) > 200, timeout=30, message="jobs running")
        wait_until(lambda: sum(1 for kind, *_, tag, _ in read_marks(path) if kind == "end" and tag == "periodic") >= 2,
                   timeout=30, message="the periodic entry running")
        if how == "kill":
            sentinels.primary.kill()
        else:
            with sentinels.sentinel_client() as sentinel:
                sentinel.sentinel_failover(sentinels.service)
        killed_at = time.time()
        failover_took = sentinels.wait_failover()
        demoted_after = 0.0
        if how != "kill":  # (the sentinels turn the old primary into a replica seconds later)
            wait_until(lambda: replication_info(sentinels.primary).get("role") == "slave", timeout=30,
                       message="the old primary demoted")
            demoted_after = time.time() - killed_at
        done_before = sum(1 for kind, *_ in read_marks(path) if kind == "end")
        # Workers and pushers carry on against the new primary.
        wait_until(lambda: sum(1 for kind, *_ in read_marks(path) if kind == "end") > done_before + 100,
                   timeout=30, interval=0.1, message="jobs completing after the failover")
        resumed_after = time.time() - killed_at
        acked_before = sum(len(p.acknowledged) for p in pushers)
        wait_until(lambda: sum(len(p.acknowledged) for p in pushers) > acked_before + 100, timeout=15,
                   message="pushes acknowledged by the new primary")
        time.sleep(2.0)
        for pusher in pushers:
            pusher.stopping.set()
        for pusher in pushers:
            pusher.join(10)
        acknowledged = {jid: seen for p in pushers for jid, seen in p.acknowledged.items()}
        ended = lambda: {jid for kind, jid, *_ in read_marks(path) if kind == "end"}  # noqa: E731
        # (What is still missing then is counted below: lost, or still held by the new primary.)
        poll(lambda: not (set(acknowledged) - ended()), timeout=10, interval=0.2)
        # Held but not running: a fetch whose reply died with the old primary, after the replica
        # had copied it. Not lost: the worker's reconcile hands it back (two sightings, 30 s apart).
        stranded = {jid for jid in set(acknowledged) - ended() if _held(watcher, keys, jid)}
        assert worker.alive
        assert len(worker.children(watcher)) == 2  # no worker process died or was restarted
        # The periodic entry still fires (its locks are not stuck on the new primary).
        periodic_runs = [at for kind, _, at, tag, _ in read_marks(path) if kind == "end" and tag == "periodic"]
        assert [at for at in periodic_runs if at > killed_at + failover_took + 2], "periodic entry stopped"
        worker.term()
        assert worker.wait(30) == 0
        # No unique lock outlives its job: every unique job done (or lost) holds none.
        left_locks = {k: watcher.get(k) for k in watcher.scan_iter(match=keys.unique("*"))}
        log = worker.log()
    finally:
        for pusher in pushers:
            pusher.stopping.set()
        worker.__exit__(None, None, None)
        watcher.close()
        app_redis.close()
        sentinels.cleanup()

    marks = read_marks(path)
    end_times = collections.defaultdict(list)
    for kind, jid, at, tag, _ in marks:
        if kind == "end" and tag != "periodic":
            end_times[jid].append(at)
    lost = {jid: seen for jid, seen in acknowledged.items() if jid not in end_times and jid not in stranded}
    lost_at = [at - killed_at for at, _ in lost.values()]
    duplicated = {jid: sorted(times) for jid, times in end_times.items() if len(times) > 1}
    slots = collections.Counter(slot for kind, _, _, tag, slot in marks if kind == "end" and tag == "periodic")
    slots_twice = sorted(slot for slot, count in slots.items() if count > 1)
    refused = [tag for p in pushers for tag in p.refused]
    ran_tags = {tag for kind, _, _, tag, _ in marks if kind == "end"}
    what = {"kill": "primary kill -9", "demote": "SENTINEL FAILOVER",
            "demote-min-replicas": "SENTINEL FAILOVER, min-replicas-to-write 1"}[how]
    print(f"\nFIGURES Sentinel failover under load ({what}; 1 replica, 3 sentinels, down-after 1 s; "
          f"runcogworker --processes 2 -c 4; 2 pushers): pushed {len(acknowledged)}, completed "
          f"{len(set(acknowledged) & set(end_times))}, lost {len(lost)}, duplicated {len(duplicated)}, held for the "
          f"reconcile {len(stranded)}, unique locks left {len(left_locks)}"
          + (f" (lost acknowledged {min(lost_at):+.2f}s to {max(lost_at):+.2f}s from the kill)" if lost_at else "")
          + "; "
          f"pushes refused while no primary {sum(p.failed for p in pushers)}, unique refused {len(refused)}; "
          f"periodic slots run {len(slots)} (around the kill: "
          f"{', '.join(f'{at - killed_at:+.1f}s' for at in periodic_runs if abs(at - killed_at) < 8)}), "
          f"twice {len(slots_twice)}; sentinels promoted the replica "
          f"{failover_took:.1f}s after the kill"
          + (f", demoted the old one {demoted_after:.1f}s after it" if demoted_after else "")
          + f", jobs completing again {resumed_after:.1f}s after it")

    # Lost: only pushes acknowledged in the replication window before the kill; after a SENTINEL
    # FAILOVER, also those the old primary took until the clients asked the sentinels again.
    window_end = killed_at + REPLICATION_WINDOW
    if how == "demote":
        window_end += failover_took + CHECK_INTERVAL
    elif how == "demote-min-replicas":  # (refused from the moment its replica left: at the promotion)
        window_end += failover_took
    assert all(killed_at - REPLICATION_WINDOW <= at <= window_end for at, _ in lost.values()), \
        {jid: round(at - killed_at, 3) for jid, (at, _) in lost.items()}
    # Run twice: only jobs whose first run ended in that window (its ack not copied) or after the kill
    # (its fetch not copied, so it was still queued on the replica).
    assert all(times[0] >= killed_at - REPLICATION_WINDOW for times in duplicated.values()), \
        {jid: [round(t - killed_at, 3) for t in times] for jid, times in duplicated.items()}
    # A unique push refused as a duplicate only of an attempt of the same job that went through.
    assert set(refused) <= ran_tags | {tag for _, tag in lost.values()}, set(refused) - ran_tags
    # No unique lock outlives its job, but one whose release was among the writes lost (a lock the
    # new primary still holds for its unique_for, though its job ran): only a job that ended in the window.
    first_end = {jid: times[0] for jid, times in end_times.items()}
    for key, holder in left_locks.items():
        ended_at = first_end.get(holder.decode() if holder else "")
        assert ended_at is not None and killed_at - REPLICATION_WINDOW <= ended_at <= window_end, \
            (key, holder, ended_at and round(ended_at - killed_at, 3))
    # No thread or process died; outages were logged as such.
    for bad in ("Traceback", "died", "Exception in thread", "restarting it"):
        assert bad not in log, bad
    if how == "kill":  # (a SENTINEL FAILOVER is followed without an outage: connections move one by one)
        assert "Redis is back after" in log


def _held(client: redis.Redis, keys: Keys, jid: str) -> bool:
    """Whether the job ``jid`` is in a queue or an in-progress list of the primary."""
    needle = f'"jid":"{jid}"'.encode()
    lists = [keys.queue("default"), *client.scan_iter(match=keys.in_progress("*"))]
    return any(needle in raw.replace(b" ", b"") for key in lists for raw in client.lrange(key, 0, -1))
