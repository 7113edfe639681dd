"""Pushes that collapse (features/collapse/) through real workers: 100 debounced pushes in a second
run once with the last arguments, 100 throttled ones once with the first, keep_last_if_active's one
follow-up with the last arguments, and a debounced job waiting while its worker is killed -9 runs
once on the next worker. The in-process tests are in tests/fast/test_collapse.py."""

from __future__ import annotations

import uuid

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import DebouncedJob, KeepLastJob, ThrottledJob

K = Keys()
ARGS = ("-q", "default", "-c", "5")


def settled(r, worker: Worker) -> bool:
    """Nothing left that could run again: the queue, the schedule and the in-progress lists empty."""
    lists = [k for k in r.keys(K.prefix + "in_progress:*") if r.type(k) == "list"]
    return r.llen(K.queue("default")) == 0 and r.zcard(K.schedule) == 0 and not any(r.llen(k) for k in lists)


def test_100_debounced_pushes_in_a_second_run_once_with_the_last_arguments(tmp_path, r):
    key = f"ran:{uuid.uuid4().hex}"
    with Worker(*ARGS, env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        statuses = [DebouncedJob.set(dedup_key=key).push(key, n).status for n in range(100)]
        assert statuses == ["pushed"] + ["replaced"] * 99  # (the premise: all within one debounce)
        wait_until(lambda: r.llen(key) >= 1 and settled(r, w), timeout=20, message="the debounced job ran")
        assert r.lrange(key, 0, -1) == ["99"]


def test_100_throttled_pushes_run_once_with_the_first(tmp_path, r):
    key = f"ran:{uuid.uuid4().hex}"
    with Worker(*ARGS, env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        jids = {ThrottledJob.set(dedup_key=key).perform_async(key, n) for n in range(100)}
        assert len(jids) == 1
        wait_until(lambda: r.llen(key) >= 1 and settled(r, w), timeout=20, message="the throttled job ran")
        assert r.lrange(key, 0, -1) == ["0"]


def test_keep_last_if_active_runs_exactly_one_follow_up_with_the_last_arguments(tmp_path, r):
    key = f"ran:{uuid.uuid4().hex}"
    with Worker(*ARGS, env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        first = KeepLastJob.set().push(key, 0, True)
        wait_until(lambda: r.lrange(key, 0, -1) == ["0"], timeout=20, message="the first run began")
        outcomes = [KeepLastJob.set().push(key, n) for n in range(1, 21)]
        assert [o.status for o in outcomes] == ["pushed"] + ["replaced"] * 19 and outcomes[0].other == first.jid
        r.set(f"{key}:go", 1)
        wait_until(lambda: r.llen(key) >= 2 and settled(r, w), timeout=20, message="the follow-up ran")
        assert r.lrange(key, 0, -1) == ["0", "20"]


def test_a_debounced_job_waiting_when_its_worker_is_killed_runs_once_on_the_next(tmp_path, r):
    key = f"ran:{uuid.uuid4().hex}"
    w = Worker(*ARGS, env=FAST_ENV, log_path=tmp_path / "worker1.log")
    w.wait_ready()
    for n in range(10):
        DebouncedJob.set(dedup_key=key).push(key, n)
    w.kill9()
    w.wait()
    assert r.zcard(K.schedule) == 1 and r.llen(key) == 0  # (the premise: killed while it waited)
    with Worker(*ARGS, env=FAST_ENV, log_path=tmp_path / "worker2.log") as w2:
        w2.wait_ready()
        wait_until(lambda: r.llen(key) >= 1 and settled(r, w2), timeout=20, message="the debounced job ran")
        assert r.lrange(key, 0, -1) == ["9"]
