"""Batches under chaos (django_cogworker/features/batches/): real workers killed -9 and started again every
few seconds while hundreds of batches run, and Redis killed -9 and restarted once (AOF, fsync
always); then the same, smaller, on a three-primary cluster. A fault test, as test_faults.py is:
named for what it does to the whole, not after one module (the crash points inside a step, one
at a time, are test_steps.py's).

What must hold whatever is killed when (docs/batches.md): each batch's complete callback is
pushed exactly once; success exactly once for each batch whose jobs all succeeded, and never for
the others; death exactly once for each batch with a job that always fails, and never for the
others; no job lost.

Pushes are counted, not runs. A callback runs at least once (a kill mid-run runs it again), and
its jid is fixed when the batch is made (Batch.on), so a callback pushed twice would run twice
under one jid: counting the distinct jids of its runs could not see it. So the members run on a
queue of their own while the callbacks wait on theirs, unworked, until every member has settled
and nothing of them is left anywhere (queue, retry, in-progress lists): no push can come after.
The copies of each callback on its queue are counted then; only then are they run, each at
least once.

Each test prints a FIGURES line (run with -s; printed to stdout, so a CI log shows it on failure).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import redis
from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture  # noqa: F401 - fixtures
from helpers import FAST_ENV, RedisServer, Worker, wait_until

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import BatchCallbackJob, BatchMemberJob

EVENTS = ("complete", "success", "death")
MEMBERS = "members"  # the members' queue; the callbacks go to BatchCallbackJob's own:
CALLBACKS = "default"
# A killed process's jobs come back after ORPHAN_THRESHOLD; MAX_ORPHANINGS high, so that a job
# caught by several kills is still run again, not sent to dead (that is test_faults.py's).
CHAOS_ENV = {**FAST_ENV, "COGWORKER_ORPHAN_THRESHOLD": "2", "COGWORKER_MAX_ORPHANINGS": "100"}


class Plan(NamedTuple):
    """The batches pushed: each one's jids, those with a job that always fails, and how many runs
    their jobs take when nothing is killed."""

    jobs: dict[str, list[str]]
    dying: set[str]
    runs: int


def push_batches(count: int, size: int, seconds: float, rng: random.Random) -> Plan:
    """Push ``count`` batches of ``size`` BatchMemberJobs of ``seconds`` each, a callback on every event:
    about one job in ten fails once, and about one batch in five has a job that always fails
    (retried once, then dead). The others may fail five times (retry=5): one failing only for
    the Redis restart still succeeds."""
    jobs: dict[str, list[str]] = {}
    dying: set[str] = set()
    runs = 0
    for i in range(count):
        batch = Batch(f"chaos {i}")
        for event in EVENTS:
            batch.on(event, BatchCallbackJob, key="cb")
        dies = rng.random() < 0.2
        fails = [1 if rng.random() < 0.1 else 0 for _ in range(size - dies)]
        runs += size + sum(fails) + dies  # (the dying one: its run and its retry)
        with batch.jobs():
            jids = BatchMemberJob.set(queue=MEMBERS, retry=5).perform_bulk([["m", n, seconds] for n in fails])
            if dies:
                jids.insert(rng.randrange(len(jids) + 1),
                            BatchMemberJob.set(queue=MEMBERS, retry=1).perform_async("m", -1, seconds))
        assert batch.bid is not None and len(jids) == size
        jobs[batch.bid] = jids
        if dies:
            dying.add(batch.bid)
    return Plan(jobs, dying, runs)


class Fleet:
    """Worker processes on the members' queue; ``kill_one`` kills one -9 and starts another at once."""

    def __init__(self, tmp_path: Path, env: dict[str, str], prefix: str, size: int = 2):
        self.tmp_path, self.env, self.prefix = tmp_path, env, prefix
        self.started = 0
        self.gone: list[Worker] = []
        self.workers = [self._start() for _ in range(size)]

    def _start(self) -> Worker:
        self.started += 1
        return Worker("-q", MEMBERS, "-c", "5", env=self.env, log_path=self.tmp_path / f"w{self.started}.log",
                      prefix=self.prefix)

    @property
    def kills(self) -> int:
        return len(self.gone)

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.workers))
        victim = self.workers[i]
        victim.kill9()
        victim.wait(10)
        self.gone.append(victim)
        self.workers[i] = self._start()

    def recovered(self) -> int:
        """Jobs requeued from killed processes, as the survivors' logs say."""
        return sum(int(n) for w in [*self.gone, *self.workers]
                   for n in re.findall(r"recovered (\d+) job\(s\) from dead process", w.log()))

    def stop(self) -> None:
        for w in self.workers:
            assert w.alive, w.log()[-3000:]
            # (A worker started by the last kill may still be booting: a TERM before its handler is
            # installed ends it by the signal, -15, having taken nothing; the test is of what it runs.)
            w.wait_ready()
            w.term()
        for w in self.workers:
            assert w.wait(30) == 0, w.log()[-3000:]

    def cleanup(self) -> None:
        for w in [*self.gone, *self.workers]:
            w.__exit__(None, None, None)


def scan(client: Any, match: str) -> list[bytes]:
    if hasattr(client, "get_primaries"):  # (a cluster client: every primary)
        return list(client.scan_iter(match=match, target_nodes=client.PRIMARIES))
    return list(client.scan_iter(match=match))


def settled(client: Any, keys: Keys, plan: Plan) -> bool:
    """Every batch complete and either succeeded or died, its outbox delivered, and nothing of its
    jobs left to run: once so, no step can fire or deliver anything more.

    (On a cluster a due poller killed between its push of a retry and its ZREM leaves the entry
    leased, to come due again LEASE_SECONDS (60 s, broker/crossings.py) later and run twice: a
    run that meets it waits that long, as it must: that late run is one more step to count.)"""
    pipe = client.pipeline(transaction=False)
    for bid in plan.jobs:
        pipe.hmget(keys.batch(bid).meta, "done_complete", "done_success", "done_death")
        pipe.llen(keys.batch(bid).outbox)
    replies = pipe.execute()
    for (complete, success, death), outbox in zip(replies[::2], replies[1::2], strict=True):
        if complete is None or (success is None and death is None) or outbox:
            return False
    return (client.llen(keys.queue(MEMBERS)) == 0 and client.zcard(keys.retry) == 0
            and client.zcard(keys.schedule) == 0 and client.llen(keys.unsettled) == 0
            and not any(client.llen(key) for key in scan(client, keys.in_progress_match)))


def run_under_chaos(fleet: Fleet, client: Any, keys: Keys, plan: Plan, rng: random.Random,
                    redis_server: RedisServer | None = None, timeout: float = 150) -> dict[str, float]:
    """Kill a worker every 1 to 2 s while members wait on their queue (and kill -9 and restart Redis
    once, after the second kill), until :func:`settled`; return when each thing happened."""
    started = time.monotonic()
    next_kill = started + rng.uniform(1.0, 2.0)
    figures: dict[str, float] = {}
    while True:
        now = time.monotonic()
        assert now - started < timeout, f"not settled after {timeout}s ({fleet.kills} kills)"
        try:
            waiting = client.llen(keys.queue(MEMBERS))
            if not waiting and settled(client, keys, plan):
                figures["settled"] = time.monotonic() - started
                return figures
        except redis.RedisError:
            waiting = 1  # (Redis down for its restart)
        if waiting and now >= next_kill:
            fleet.kill_one(rng)
            next_kill = now + rng.uniform(1.0, 2.0)
        if redis_server is not None and "restarted" not in figures and fleet.kills >= 2:
            figures["waiting"] = waiting  # (members still on their queue at the kill)
            redis_server.kill()
            down = time.monotonic()
            time.sleep(0.5)
            redis_server.start()
            figures["restarted"] = time.monotonic() - started
            figures["down"] = time.monotonic() - down
        time.sleep(0.1)


def check_callbacks(client: Any, keys: Keys, plan: Plan) -> Counter[str]:
    """Count the copies of each callback on its queue against what each batch must have pushed
    (printed first: a failing run's log shows them); return the pushes per event."""
    pushed: Counter[tuple[str, str]] = Counter()
    jids: dict[tuple[str, str], set[str]] = {}
    for raw in client.lrange(keys.queue(CALLBACKS), 0, -1):
        payload = json.loads(raw)
        assert payload["class"] == BatchCallbackJob.name
        status = payload["args"][0]
        pushed[status["bid"], status["event"]] += 1
        jids.setdefault((status["bid"], status["event"]), set()).add(payload["jid"])
    wrong = {}
    for bid in [*plan.jobs, *({bid for bid, _ in pushed} - set(plan.jobs))]:
        dies = bid in plan.dying
        expected = {"complete": 1, "success": 0 if dies else 1, "death": 1 if dies else 0}
        got = {event: pushed[bid, event] for event in EVENTS}
        if got != expected or bid not in plan.jobs:
            wrong[bid] = f"{'dying' if dies else 'succeeding'}, pushed {got}"
    per_event = Counter(event for _, event in pushed.elements())
    print(f"\ncallbacks pushed: {dict(per_event)} for {len(plan.jobs)} batches ({len(plan.dying)} dying); "
          f"batches with a wrong count: {len(wrong)} {list(wrong.items())[:5]}")
    assert not wrong
    for bid in plan.jobs:
        callbacks = Batch.status(bid).callbacks
        for event in EVENTS:
            if pushed[bid, event]:
                assert jids[bid, event] == set(callbacks[event])  # (the batch's own callback, as made)
    return per_event


def check_members(client: Any, keys: Keys, plan: Plan) -> int:
    """No job lost: every job of a batch has succeeded but its always-failing one, which is dead;
    each batch's counts say so. Return the members' attempts (runs that got past their sleep)
    beyond those of a run without faults."""
    done = {jid.decode() for jid in client.hkeys("m:done")}
    dead = {json.loads(raw)["jid"] for raw in client.zrange(keys.dead, 0, -1)}
    attempts = {jid.decode(): int(n) for jid, n in client.hgetall("m:attempts").items()}
    for bid, jids in plan.jobs.items():
        failing = set(jids) - done
        status = Batch.status(bid)
        if bid in plan.dying:
            assert len(failing) == 1 and failing <= dead, f"batch {bid}: not done {sorted(failing)}"
            assert (status.pending, status.dead, status.complete, status.success) == (1, 1, True, False)
        else:
            assert not failing, f"batch {bid}: {len(failing)} job(s) lost or dead: {sorted(failing)}"
            assert (status.pending, status.dead, status.complete, status.success) == (0, 0, True, True)
    assert len(dead) == len(plan.dying)
    assert set(attempts) == {jid for jids in plan.jobs.values() for jid in jids}
    return sum(attempts.values()) - plan.runs


def run_callbacks(tmp_path: Path, env: dict[str, str], prefix: str, client: Any, expected: int) -> Counter:
    """Run the callbacks waiting on their queue; return the runs per (bid, event), once all ran."""
    def runs() -> Counter:
        return Counter((c["bid"], c["event"]) for c in map(json.loads, client.lrange("cb", 0, -1)))

    with Worker("-q", CALLBACKS, "-c", "5", env=env, log_path=tmp_path / "callbacks.log", prefix=prefix) as w:
        wait_until(lambda: len(runs()) == expected, timeout=60, interval=0.1, message="every callback ran")
        w.term()
        assert w.wait(30) == 0
    got = runs()
    assert all(n >= 1 for n in got.values())
    return got


def test_batches_under_kill_9_of_workers_and_a_redis_restart_push_each_callback_once(tmp_path, settings):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"\nchaos seed {seed} (the batches and the kills; not their timing)")
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    settings.COGWORKER = {**settings.COGWORKER, "REDIS_URL": srv.url}  # (this process's pushes)
    keys = Keys()
    client = srv.client(socket_timeout=5)
    env = {**CHAOS_ENV, "COGWORKER_REDIS_URL": srv.url}
    fleet = Fleet(tmp_path, env, keys.prefix)
    try:
        began = time.monotonic()
        plan = push_batches(200, 50, 0.01, rng)
        pushed_in = time.monotonic() - began
        figures = run_under_chaos(fleet, client, keys, plan, rng, redis_server=srv)
        assert fleet.kills >= 2 and figures["waiting"] > 0  # (Redis restarted mid-run)
        fleet.stop()
        pushes = check_callbacks(client, keys, plan)
        again = check_members(client, keys, plan)
        runs = run_callbacks(tmp_path, env, keys.prefix, client, sum(pushes.values()))
        took = time.monotonic() - began
    finally:
        fleet.cleanup()
        client.close()
        srv.cleanup()
    print(f"\nFIGURES batches under chaos (seed {seed}): 200 batches x 50 jobs ({len(plan.dying)} with a job that "
          f"always fails), 2 workers x 5, members pushed in {pushed_in:.1f}s; workers killed -9 {fleet.kills} times, "
          f"{fleet.recovered()} job(s) recovered from them; Redis killed -9 and restarted at "
          f"{figures['restarted']:.1f}s with {figures['waiting']:.0f} members on their queue (down "
          f"{figures['down']:.1f}s); members' attempts beyond a faultless run {again}; "
          f"callbacks pushed: complete {pushes['complete']}, success {pushes['success']}, death {pushes['death']} "
          f"(duplicates 0, missing 0); callback runs {sum(runs.values())} ({sum(n > 1 for n in runs.values())} "
          f"run twice); settled {figures['settled']:.1f}s after the pushes, {took:.1f}s in all")


def test_batches_under_kill_9_of_workers_on_a_cluster_push_each_callback_once_from_the_batch_s_slot(
        tmp_path, cluster, cr, on_cluster):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"\nchaos seed {seed} (the batches and the kills; not their timing)")
    keys = Keys("{cogworker}:", spread=True)
    env = {**CHAOS_ENV, "COGWORKER_REDIS_URL": cluster.url}
    fleet = Fleet(tmp_path, env, keys.prefix)
    try:
        began = time.monotonic()
        plan = push_batches(30, 20, 0.1, rng)
        figures = run_under_chaos(fleet, cr, keys, plan, rng)
        assert fleet.kills >= 2
        fleet.stop()
        pushes = check_callbacks(cr, keys, plan)
        again = check_members(cr, keys, plan)
        runs = run_callbacks(tmp_path, env, keys.prefix, cr, sum(pushes.values()))
        took = time.monotonic() - began
    finally:
        fleet.cleanup()
    # Every key of a batch in one slot, the batch's own (the delivery marks are in the callbacks'
    # queue's slot, named by the callback's jid, not the batch's).
    bid = next(iter(plan.dying or plan.jobs))
    batch_keys = keys.batch(bid)
    slots = {cr.keyslot(key) for key in batch_keys}
    found = [key.decode() for key in scan(cr, f"*{bid}*")]
    assert len(slots) == 1 and {cr.keyslot(key) for key in found} == slots
    kept = {batch_keys.meta, batch_keys.jobs} | ({batch_keys.pending, batch_keys.failed, batch_keys.dead}
                                                 if bid in plan.dying else set())
    assert kept <= set(found)
    assert slots != {cr.keyslot(keys.queues)}  # (its own slot, not the home slot)
    print(f"\nFIGURES batches under chaos on a 3-primary cluster (seed {seed}): 30 batches x 20 jobs "
          f"({len(plan.dying)} with a job that always fails), 2 workers x 5; workers killed -9 {fleet.kills} times, "
          f"{fleet.recovered()} job(s) recovered from them; members' attempts beyond a faultless run {again}; "
          f"callbacks pushed: complete {pushes['complete']}, success {pushes['success']}, death {pushes['death']} "
          f"(duplicates 0, missing 0); callback runs {sum(runs.values())}; settled {figures['settled']:.1f}s, "
          f"{took:.1f}s in all; batch {bid}'s {len(found)} keys all in slot {slots.pop()}")
