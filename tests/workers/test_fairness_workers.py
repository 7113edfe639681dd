"""Fair shares through real workers (issue 48; docs/fairness.md): groups that take turns, priorities
that age, a kill -9 in a drain of grouped jobs, and a per-group concurrency limit across processes.

The jobs (testproject/demo/fair_jobs.py) record in Redis when they start and end; the tests read the
order from there. Each says, in a comment, what it would see without a queue's lanes
(broker/scripts/lanes.py): a queue list run first in, first out.
"""

from __future__ import annotations

import json
import time

from helpers import FAST_ENV, supervisor, wait_until, worker

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from django_cogworker.push import runtime
from testproject.demo.fair_jobs import PairedJob, RankJob, TurnJob

K = Keys()
LANES = K.lanes("default")
THRESHOLD = float(FAST_ENV["COGWORKER_ORPHAN_THRESHOLD"])


def group_jids(r, group: str) -> list[str]:
    """The jids waiting in ``group``'s list of the default queue."""
    return [json.loads(raw)["jid"] for raw in r.lrange(LANES.group(group), 0, -1)]


def test_a_small_group_pushed_behind_a_big_one_finishes_while_most_of_the_big_one_still_waits(tmp_path, r):
    # Without lanes the queue is first in, first out: the 50 would start after all 5,000 (at
    # position 5,000 and on). With them, "big" and "small" take turns: about one big job per small
    # one (150 leaves room for the jobs taken before the small group's first turn and taken ahead).
    TurnJob.perform_bulk([("big", n, "order") for n in range(5000)])
    TurnJob.set(group="small").perform_bulk([("small", n, "order") for n in range(50)])  # (set() wins)
    with worker(tmp_path, env={"COGWORKER_CONCURRENCY": "5"}) as w:
        w.wait_ready()
        wait_until(lambda: r.llen("order:ends") >= 1, timeout=20, message="jobs running")

        def small_done() -> bool:
            return sum(tag.startswith("small:") for tag in r.lrange("order", 0, -1)) == 50

        wait_until(small_done, timeout=40, interval=0.02, message="the 50 small jobs started")
        big_waiting = r.llen(LANES.group("big")) + r.llen(K.queue("default"))
    order = r.lrange("order", 0, -1)
    last_small = max(i for i, tag in enumerate(order) if tag.startswith("small:"))
    big_before = sum(tag.startswith("big:") for tag in order[:last_small])
    assert big_before <= 150, f"{big_before} big jobs started before the last small one"
    assert big_waiting >= 4000, big_waiting  # most of the 5,000 still waited when the 50 were done
    assert sorted(int(t.split(":")[1]) for t in order if t.startswith("small:")) == list(range(50))
    print(f"\nFIGURES groups: 5,000 big then 50 small; big jobs started before the last small one: {big_before}; "
          f"big jobs still waiting then: {big_waiting}")


def test_ten_urgent_jobs_pushed_behind_a_thousand_run_among_the_first_twenty(tmp_path, r):
    # One processor (-c 1): jobs start in the order the fetch takes them. With more, several run at
    # once and the start order interleaves across threads, which says less about the fetch's order.
    # Without lanes the ten would start last (positions 1,001-1,010), and the -10s would be mixed
    # with the 0s in push order.
    RankJob.set(priority=-10).perform_bulk([("ran", f"low:{n}") for n in range(500)])
    RankJob.perform_bulk([("ran", f"normal:{n}") for n in range(500)])
    RankJob.set(priority=10).perform_bulk([("ran", f"high:{n}") for n in range(10)])
    with worker(tmp_path, env={"COGWORKER_CONCURRENCY": "1"}) as w:
        w.wait_ready()
        wait_until(lambda: r.llen("ran") == 1010, timeout=50, message="all 1,010 ran")
    ran = r.lrange("ran", 0, -1)
    high = [i for i, tag in enumerate(ran) if tag.startswith("high:")]
    assert max(high) < 20, high
    # (Not in push order among themselves: one bulk push gives its jobs one score, and a sorted
    # set orders equal scores by the payload's bytes.)
    assert sorted(ran[i] for i in high) == sorted(f"high:{n}" for n in range(10))
    # Within PRIORITY_AGING's default (60 s a step), ten steps down is ten minutes younger: a -10 job
    # pushed a second before the plain ones runs after them all.
    kinds = [tag.split(":")[0] for tag in ran if not tag.startswith("high:")]
    assert kinds == ["normal"] * 500 + ["low"] * 500


def test_a_low_priority_job_that_waited_long_enough_runs_before_fresh_plain_ones(tmp_path, r, settings):
    # PRIORITY_AGING 0.05: a job 0.05 s older ranks as one a step higher. A -2 job pushed 0.5 s
    # before twenty plain ones has made up its two steps (0.1 s) and more: it runs first. A -100 job
    # pushed with it is 100 steps (5 s) behind and has not: it runs last. Strict priorities (no
    # aging) would run the -2 job after the twenty; priorities ignored would run the -100 job first.
    aging = 0.05
    settings.COGWORKER = {**settings.COGWORKER, "PRIORITY_AGING": aging}  # (the push scores with it)
    runtime.reset()
    try:
        RankJob.set(priority=-2).perform_async("ran", "aged")
        RankJob.set(priority=-100).perform_async("ran", "far")
        first = json.loads(r.zrange(LANES.prio, 0, 0)[0])["enqueued_at"]
        wait_until(lambda: time.time() > first + 0.5, timeout=5, interval=0.01)
        RankJob.perform_bulk([("ran", f"fresh:{n}") for n in range(20)])
        fresh = [p["enqueued_at"] for p in map(json.loads, r.lrange(K.queue("default"), 0, -1))
                 if "jid" in p]  # (not the doorbell the prioritized push rang into the empty list)
        assert len(fresh) == 20
        # The premise: the -2 job waited more than its two steps, the -100 one fewer than its 100.
        assert min(fresh) - first > 2 * aging and max(fresh) - first < 100 * aging
        with worker(tmp_path, env={"COGWORKER_CONCURRENCY": "1", "COGWORKER_PRIORITY_AGING": str(aging)}) as w:
            w.wait_ready()
            wait_until(lambda: r.llen("ran") == 22, timeout=30, message="all 22 ran")
    finally:
        runtime.reset()
    ran = r.lrange("ran", 0, -1)
    assert ran[0] == "aged" and ran[-1] == "far", ran
    assert ran[1:-1] == [f"fresh:{n}" for n in range(20)]


def test_kill9_in_a_drain_of_grouped_jobs_loses_none_reruns_only_what_it_held_and_each_returns_to_its_group(
        tmp_path, r):
    # Reliable fetch's bound (docs/delivery.md): a job on the dead process's in-progress list (running,
    # taken ahead, or finished but not yet acknowledged) may run again; nothing else runs twice. The
    # recovered jobs go back through the queue list, and the fetch files each in its group's list by
    # its payload: all groups are paused before the survivor starts, so they stay there to be read.
    # Without lanes they would run in the queue's order, in no group (no group list would hold them).
    groups = ("acme", "globex", "initech")
    jids = {g: TurnJob.perform_bulk([(g, n, "runs", 0.05) for n in range(100)]) for g in groups}
    group_of = {jid: g for g, js in jids.items() for jid in js}
    with worker(tmp_path, name="victim", env={"COGWORKER_CONCURRENCY": "4"}) as victim:
        victim_id = victim.wait_ready()
        wait_until(lambda: r.llen("runs:ends") >= 40 and r.llen(K.in_progress(victim_id)) >= 4, timeout=30,
                   message="a drain under way")
        victim.kill9()
        assert victim.wait(10) == -9
    held = [json.loads(raw) for raw in r.lrange(K.in_progress(victim_id), 0, -1)]
    assert held and all(p["group"] == group_of[p["jid"]] for p in held)
    queue = api.Queue("default")
    for g in groups:
        queue.pause_group(g)
    with worker(tmp_path, name="survivor", env={"COGWORKER_CONCURRENCY": "4"}) as survivor:
        survivor.wait_ready()
        wait_until(lambda: not r.exists(K.in_progress(victim_id)) and not r.llen(K.queue("default")),
                   timeout=THRESHOLD + 20, message="the dead process's jobs requeued and routed")
        waiting = {g: group_jids(r, g) for g in groups}
        for p in held:
            assert p["jid"] in waiting[p["group"]], f"{p['jid']} of {p['group']} not back in its group"
        assert all(group_of[jid] == g for g, js in waiting.items() for jid in js)
        assert "recovered" in survivor.log()
        for g in groups:
            queue.resume_group(g)
        wait_until(lambda: set(r.lrange("runs:ends", 0, -1)) == set(group_of), timeout=40,
                   message="every job ran to its end")
    starts = {jid: int(n) for jid, n in r.hgetall("runs:starts").items()}
    ends: dict[str, int] = {}
    for jid in r.lrange("runs:ends", 0, -1):
        ends[jid] = ends.get(jid, 0) + 1
    held_jids = {p["jid"] for p in held}
    assert set(ends) == set(group_of)  # none lost
    twice = {jid for jid, n in starts.items() if n > 1} | {jid for jid, n in ends.items() if n > 1}
    assert twice <= held_jids, twice - held_jids  # only what the dead process held ran again
    assert max(starts.values()) <= 2
    assert r.zcard(K.dead) == 0
    print(f"\nFIGURES kill -9 of grouped jobs: 300 jobs, lost 0, held by the victim {len(held_jids)}, "
          f"run again {len(twice)}")


def test_a_group_limit_of_two_holds_across_four_processes_while_other_groups_run(tmp_path, r):
    # group_limits = [Limiter.concurrent("fair-pairs", 2)]: each group its own two places, fleet-wide.
    # Without it 20 processors would run up to 20 of a group at once; with one limiter for all
    # groups (a class's plain ``limits``), at most 2 jobs would run at once in all (the ``all`` count).
    groups = ("acme", "globex", "initech")
    with supervisor(tmp_path, processes=4, env={"COGWORKER_CONCURRENCY": "5"}) as sup:
        wait_until(lambda: len(sup.children(r)) == 4, timeout=40, message="four worker processes")
        for g in groups:
            PairedJob.perform_bulk([(g, "pairs", 0.1)] * 20)
        wait_until(lambda: r.llen("pairs:seen:all") == 60, timeout=50, message="all 60 ran")
    seen = {g: [int(x) for x in r.lrange(f"pairs:seen:{g}", 0, -1)] for g in groups}
    everyone = [int(x) for x in r.lrange("pairs:seen:all", 0, -1)]
    assert all(len(v) == 20 for v in seen.values())
    assert r.scard("pairs:pids") >= 2  # (the premise: more than one process ran them)
    assert max(max(v) for v in seen.values()) <= 2, {g: max(v) for g, v in seen.items()}
    assert all(max(v) == 2 for v in seen.values())  # (the premise: each group did fill its two places)
    assert max(everyone) >= 3  # other groups ran beside a full one
    print(f"\nFIGURES group limit 2 over 4 processes: most at once per group "
          f"{ {g: max(v) for g, v in seen.items()} }, in all {max(everyone)}")
