"""Iterable jobs on real workers (django_cogworker/features/iteration/, issue 45): ``runcogworker``
processes TERMed and killed -9 in the middle of a walk, a throttle and max_iteration_runtime on
one thread, a cancel from outside, a retry.

The jobs (testproject/demo/long_jobs.py) write each item they finish, and each hook they run, to a
file, one O_APPEND write a line and no Redis, so what a killed worker did is read off the disk:
"every item done" and "how many twice" are counted there. Across a TERM no item may run twice;
across a kill -9 only the items since the last checkpoint (MarkedWalk saves its cursor every 50
items: at most 50). Each fault test prints a FIGURES line (run with -s to see them).
"""

from __future__ import annotations

import os

import pytest
from helpers import FAST_ENV, wait_until, worker

from django_cogworker import cancel
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import FETCH_MODES
from django_cogworker.features.iteration.state import ENDED_KEEP
from testproject.demo.jobs import FileMarkJob
from testproject.demo.long_jobs import FailOnceWalk, MarkedWalk, Marks, ThrottledWalk, TurnsWalk, read_marks

K = Keys()
THRESHOLD = float(FAST_ENV["COGWORKER_ORPHAN_THRESHOLD"])
WINDOW = MarkedWalk.checkpoint_every  # items a kill -9 may have done again, at most
N = 800  # items of a walk that is interrupted (3 ms each: about 2.5 s of work)
SECONDS = 0.003
SHUTDOWN_MISSED = "still running or unstarted at the shutdown deadline"


def marks_of(path, jid) -> Marks:
    return read_marks(path).get(jid) or Marks()


def done(path, jid) -> int:
    """Items written so far (repeats counted)."""
    return len(marks_of(path, jid).items)


def completed(path, jid) -> bool:
    return "complete" in marks_of(path, jid).hooks


def saved_cursor(r, jid) -> int | None:
    cursor = r.hget(K.iteration(jid), "cursor")
    return None if cursor is None else int(cursor)


def settled(r, jid) -> bool:
    """Nothing of the job left anywhere (no queue, schedule, retry, dead or in-progress entry) but its
    state, kept ENDED_KEEP more for an ack still on its way."""
    return (r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0 and r.zcard(K.schedule) == 0
            and r.llen(K.queue("default")) == 0 and 0 < r.ttl(K.iteration(jid)) <= ENDED_KEEP
            and not any(r.llen(key) for key in r.keys(K.in_progress("*"))))


def finish(w) -> None:
    """TERM ``w`` and expect a clean exit, its jobs done within SHUTDOWN_TIMEOUT."""
    w.term()
    assert w.wait(30) == 0
    assert SHUTDOWN_MISSED not in w.log()


# -- a TERM, a kill -9, and both again and again ---------------------------------------------------


@pytest.mark.parametrize("fetch", FETCH_MODES)
def test_a_term_mid_walk_hands_the_job_back_and_the_next_worker_does_each_item_once(tmp_path, r, fetch):
    path, env = str(tmp_path / "marks"), {"COGWORKER_FETCH": fetch}
    with worker(tmp_path, name="first", env=env) as first:
        first.wait_ready()
        jid = MarkedWalk.perform_async(path, N, SECONDS)
        wait_until(lambda: done(path, jid) >= N // 4, timeout=20, message="a quarter of the walk done")
        finish(first)  # (ends the run after its item: within SHUTDOWN_TIMEOUT, nothing handed back cut short)
    before = marks_of(path, jid).items
    assert 0 < len(before) < N and before == list(range(len(before)))
    assert saved_cursor(r, jid) == before[-1]  # (saved at the TERM, not at the last checkpoint)
    assert f"the worker is stopping jid={jid} class={MarkedWalk.name} after {len(before)} item(s)" in first.log()

    with worker(tmp_path, name="second", env=env) as second:
        second.wait_ready()
        wait_until(lambda: completed(path, jid), timeout=30, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        finish(second)
    walk = marks_of(path, jid)
    assert walk.items == list(range(N))  # every item, once: no repeat across the TERM
    assert walk.hooks == ["start", "stop", f"resume@{before[-1]}", "stop", "complete"]
    print(f"\nFIGURES TERM ({fetch} fetch): {N} items, {len(before)} before the TERM, repeats {walk.repeats}")


def test_a_kill9_mid_walk_resumes_from_its_last_checkpoint_after_orphan_recovery(tmp_path, r):
    path = str(tmp_path / "marks")
    with worker(tmp_path, name="victim") as victim:
        victim_id = victim.wait_ready()
        jid = MarkedWalk.perform_async(path, N, SECONDS)
        wait_until(lambda: done(path, jid) >= 3 * WINDOW + 25, timeout=20, message="three checkpoints passed")
        victim.kill9()
        assert victim.wait(10) == -9
    before = marks_of(path, jid).items
    cursor = saved_cursor(r, jid)
    assert before == list(range(len(before))) and len(before) < N
    assert cursor is not None and 0 <= before[-1] - cursor <= WINDOW

    with worker(tmp_path, name="survivor") as survivor:
        survivor.wait_ready()
        wait_until(lambda: completed(path, jid), timeout=THRESHOLD + 30, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        assert f"recovered 1 job(s) from dead process {victim_id}" in survivor.log()
        finish(survivor)
    walk = marks_of(path, jid)
    # Every item; again only those after the last checkpoint before the kill (none before it).
    assert walk.items == before + list(range(cursor + 1, N))
    assert walk.repeats == before[-1] - cursor <= WINDOW
    assert walk.hooks == ["start", f"resume@{cursor}", "stop", "complete"]
    print(f"\nFIGURES kill -9: {N} items, {len(before)} before the kill, cursor saved at {cursor}, "
          f"repeats {walk.repeats} (bound {WINDOW})")


def test_terms_and_kill9s_in_a_row_end_with_every_item_done_and_repeats_only_after_kills(tmp_path, r):
    path, n, step = str(tmp_path / "marks"), 1200, 120
    jid = MarkedWalk.perform_async(path, n, SECONDS)
    repeats, cursors = [], []  # per interruption: the items done again after it; the cursor it left
    for i, how in enumerate(["term", "kill9", "term", "kill9"]):
        reached = done(path, jid) + step
        with worker(tmp_path, name=f"worker{i}") as w:
            w.wait_ready()
            wait_until(lambda reached=reached: done(path, jid) >= reached, timeout=THRESHOLD + 30,
                       message=f"{step} more items before the {how}")
            if how == "term":
                finish(w)
            else:
                w.kill9()
                assert w.wait(10) == -9
        last, cursor = marks_of(path, jid).items[-1], saved_cursor(r, jid)
        assert last < n - 1 and cursor is not None
        repeats.append(last - cursor)  # (what the next run does again: after the cursor, up to the last)
        cursors.append(cursor)
    with worker(tmp_path, name="last") as w:
        w.wait_ready()
        wait_until(lambda: completed(path, jid), timeout=THRESHOLD + 30, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        finish(w)
    walk = marks_of(path, jid)
    assert sorted(set(walk.items)) == list(range(n))
    assert repeats[0] == repeats[2] == 0 and max(repeats[1], repeats[3]) <= WINDOW
    assert walk.repeats == sum(repeats)
    resumed = [f"resume@{cursor}" for cursor in cursors]
    # (on_stop at each TERM and at the end, none at a kill -9)
    assert walk.hooks == ["start", "stop", resumed[0], resumed[1], "stop", resumed[2], resumed[3], "stop", "complete"]
    print(f"\nFIGURES chaos (TERM, kill -9, TERM, kill -9): {n} items, repeats per interruption {repeats} "
          f"(bound 0 at a TERM, {WINDOW} at a kill -9)")


# -- giving the thread back ------------------------------------------------------------------------


def test_a_throttled_job_gives_its_thread_back_and_a_job_pushed_after_it_runs_meanwhile(tmp_path, r):
    path, plain = str(tmp_path / "marks"), tmp_path / "plain"
    hold = path + ".hold"
    with worker(tmp_path, "-c", "1") as w:
        w.wait_ready()
        jid = ThrottledWalk.perform_async(path, 40, 0.005, 10)  # (holds from item 10 on)
        wait_until(lambda: os.path.exists(hold), timeout=20, message="the throttle holds")
        other = FileMarkJob.perform_async(str(plain), 0)
        # One thread: the plain job runs only if the throttled walk gave it back.
        wait_until(lambda: f"end {other}" in (plain.read_text() if plain.exists() else ""), timeout=20,
                   message="the plain job done while the walk is throttled")
        assert marks_of(path, jid).items == list(range(11)) and not completed(path, jid)
        os.remove(hold)
        wait_until(lambda: completed(path, jid), timeout=20, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        finish(w)
    walk = marks_of(path, jid)
    assert walk.items == list(range(40))
    assert walk.hooks[:3] == ["start", "stop", "resume@10"] and walk.hooks[-1] == "complete"
    assert f"throttled jid={jid} class={ThrottledWalk.name} after 11 item(s) this run" in w.log()


def test_max_iteration_runtime_has_a_long_job_take_turns_with_short_ones_on_one_thread(tmp_path, r):
    path, n = str(tmp_path / "marks"), 60
    # Pushed before the worker starts, in this order (a queue is first in, first out): the walk
    # (about 1.2 s of items, 0.2 s a turn) first, then three short jobs behind it.
    jid = TurnsWalk.perform_async(path, n, 0.02)
    shorts = FileMarkJob.perform_bulk([[path, 0]] * 3)
    with worker(tmp_path, "-c", "1") as w:
        w.wait_ready()
        wait_until(lambda: completed(path, jid), timeout=30, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        finish(w)
    lines = (tmp_path / "marks").read_text().splitlines()
    first_item = lines.index(f"{jid} 0")
    ends = [next(i for i, line in enumerate(lines) if line.startswith(f"end {short} ")) for short in shorts]
    last_item = lines.index(f"{jid} {n - 1}")
    assert first_item < min(ends) and max(ends) < last_item  # (the short ones ran in the walk's middle)
    walk = marks_of(path, jid)
    assert walk.items == list(range(n))
    assert sum(hook.startswith("resume@") for hook in walk.hooks) >= 2
    assert f"max_iteration_runtime reached jid={jid}" in w.log()


# -- cancelled, retried ----------------------------------------------------------------------------


def test_a_cancel_from_outside_stops_the_walk_at_its_next_item_and_ends_it_as_a_cancelled_run(tmp_path, r):
    path, n = str(tmp_path / "marks"), 5000  # (15 s if nobody stops it)
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = MarkedWalk.perform_async(path, n, SECONDS)
        wait_until(lambda: done(path, jid) >= 20, timeout=20, message="the walk under way")
        assert cancel(jid) == "signalled"
        wait_until(lambda: "cancel" in marks_of(path, jid).hooks, timeout=10, message="on_cancel ran")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        assert r.get(K.stat_cancelled) == "1"
        finish(w)  # (nothing of it runs after this: a retry or a reschedule would have shown in settled)
    walk = marks_of(path, jid)
    assert walk.items == list(range(len(walk.items))) and len(walk.items) < n
    assert walk.hooks == ["start", "stop", "cancel"]  # (the last lines: nothing ran after on_cancel)
    assert (tmp_path / "marks").read_text().splitlines()[-1] == f"{jid} cancel"
    assert f"cancelled jid={jid} class={MarkedWalk.name} after" in w.log()


def test_a_retry_resumes_from_the_cursor_of_the_failed_run_and_no_earlier_item_runs_twice(tmp_path, r):
    path, n, fail_at = str(tmp_path / "marks"), 200, 120  # (its last checkpoint before 120: 99)
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = FailOnceWalk.perform_async(path, n, 0.002, fail_at)
        wait_until(lambda: completed(path, jid), timeout=30, message="the walk completed")
        wait_until(lambda: settled(r, jid), timeout=10, message="acknowledged; its state kept ENDED_KEEP only")
        finish(w)
    walk = marks_of(path, jid)
    assert os.path.exists(path + ".failed")
    assert walk.items == list(range(n))  # 120 failed before it was done: done once, by the retry
    assert walk.hooks == ["start", f"resume@{fail_at - 1}", "stop", "complete"]  # (no on_stop for a failure)
    assert r.get(K.stat_failed) == "1"
    assert f"item {fail_at} fails once" in w.log()
