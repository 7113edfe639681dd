"""CPU_AFFINITY: the workers of ``--processes N`` each on a CPU of their own; a lone one on one CPU while GIL-bound.

What an operator relies on: the supervisor's workers spread over the CPUs the container allows,
one each (that is what makes N processes N times faster on a GIL-bound load); a lone worker never
pinned for good unless asked (several started by hand would share one CPU), but kept on one CPU
while it is bound by its GIL and freed once idle (never with "none": engine/process/confine.py); a
CPU that doesn't exist refused at startup, naming the setting.
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import FAST_ENV, Worker, pid_alive, wait_until

from django_cogworker.conf import build_config
from django_cogworker.engine.process import affinity
from django_cogworker.errors import ConfigError
from testproject.demo.jobs import SpinJob

ALLOWED = sorted(os.sched_getaffinity(0))


def allowed_cpus(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


def test_auto_deals_the_allowed_cpus_out_to_a_supervisors_workers_and_leaves_a_lone_process_free():
    assert affinity.cpus_for("auto", None, [0, 1, 2]) is None
    assert [affinity.cpus_for("auto", i, [5, 2, 7], processes=4) for i in range(4)] == [{2}, {5}, {7}, {2}]
    assert affinity.cpus_for("none", 0, [0, 1], processes=2) is None


def test_auto_leaves_workers_free_when_they_are_fewer_than_the_cpus():
    # A pod seeing a 32-CPU host, running --processes 2: every such pod pinned its first worker
    # to the same CPU.
    assert [affinity.cpus_for("auto", i, list(range(32)), processes=2) for i in range(2)] == [None, None]
    assert [affinity.cpus_for("auto", i, [0, 1], processes=2) for i in range(2)] == [{0}, {1}]


def test_a_list_pins_a_lone_process_to_all_of_it_and_deals_it_out_to_workers():
    assert affinity.cpus_for([3, 1], None, [0, 1, 2, 3]) == {1, 3}
    assert [affinity.cpus_for([3, 1], i, [0, 1, 2, 3]) for i in range(3)] == [{3}, {1}, {3}]


@pytest.mark.parametrize("value", ["all", "", [], [-1], [0, "1"], [True], 3, {"cpu": 0}])
def test_a_bad_value_is_refused_naming_the_setting(value):
    with pytest.raises(ConfigError) as caught:
        build_config({"CPU_AFFINITY": value})
    assert 'COGWORKER["CPU_AFFINITY"] must be "auto", "none" or a non-empty list of CPU numbers' in str(caught.value)


def test_good_values_are_accepted():
    assert build_config({}).cpu_affinity == "auto"
    assert build_config({"CPU_AFFINITY": "none"}).cpu_affinity == "none"
    assert build_config({"CPU_AFFINITY": [0, 1]}).cpu_affinity == (0, 1)


def test_a_cpu_this_process_cannot_run_on_is_refused_at_startup(tmp_path):
    missing = max(ALLOWED) + 1000
    with Worker(env={**FAST_ENV, "COGWORKER_CPU_AFFINITY": str(missing)}, log_path=tmp_path / "w.log") as w:
        code = w.wait(30)
    assert code != 0
    assert f'COGWORKER["CPU_AFFINITY"] lists CPU {missing}, which this process can\'t run on' in w.log()


def test_a_supervisors_workers_each_run_on_one_allowed_cpu_in_turn(tmp_path, r):
    # As many workers as CPUs: each gets its own (the supervisor started with CPUs 0 and 1 only,
    # whatever this machine has; a one-CPU machine puts both on it).
    mask = ALLOWED[:2]
    os.sched_setaffinity(0, mask)
    try:
        w = Worker("--processes", "2", "-c", "2", env=FAST_ENV, log_path=tmp_path / "sup.log")
    finally:
        os.sched_setaffinity(0, ALLOWED)
    with w:
        def children():
            found = {info["index"]: info["pid"] for info in w.children(r).values() if pid_alive(info["pid"])}
            return found if len(found) == 2 else None
        pids = wait_until(children, timeout=40, message="2 children registered")
        assert allowed_cpus(w.pid) == set(mask)  # (the supervisor itself stays free)
        assert [allowed_cpus(pids[i]) for i in (0, 1)] == [{mask[0]}, {mask[1 % len(mask)]}]
        assert "pinned to CPU" in w.log()


def test_a_lone_worker_is_left_free_unless_a_list_is_given(tmp_path, r):
    with Worker("-c", "1", env=FAST_ENV, log_path=tmp_path / "free.log") as w:
        w.wait_ready()
        assert allowed_cpus(w.pid) == set(ALLOWED)
    with Worker("-c", "1", env={**FAST_ENV, "COGWORKER_CPU_AFFINITY": str(ALLOWED[-1])},
                log_path=tmp_path / "pinned.log") as w:
        w.wait_ready()
        assert allowed_cpus(w.pid) == {ALLOWED[-1]}


def thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU masks of the threads of ``pid`` (one set: all alike)."""
    masks = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            masks.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return masks


@pytest.mark.serial  # (alone: on a machine other tests keep busy, a worker can't use a core of its own)
def test_a_lone_worker_bound_by_its_gil_is_kept_on_one_cpu_while_busy_then_freed(tmp_path, r):
    assert len(ALLOWED) >= 2, "this test needs a machine (or cpuset) of at least 2 CPUs"
    free = {frozenset(ALLOWED)}
    with Worker("-c", "4", env=FAST_ENV, log_path=tmp_path / "w.log") as w:
        w.wait_ready()
        assert thread_cpus(w.pid) == free
        # 600 jobs of 50 ms of Python, 4 at a time: about 7 s of a worker using one core.
        SpinJob.perform_bulk([(0.05, "spun:confined")] * 600)
        confined = wait_until(lambda: (lambda m: m if len(m) == 1 and len(next(iter(m))) == 1 else None)(
            thread_cpus(w.pid)), timeout=6, interval=0.1, message="its threads kept on one CPU while busy")
        assert int(r.get("spun:confined") or 0) < 600  # (premise: still busy when confined)
        assert next(iter(confined)) <= set(ALLOWED)
        wait_until(lambda: int(r.get("spun:confined") or 0) == 600, timeout=60, message="every job done")
        wait_until(lambda: thread_cpus(w.pid) == free, timeout=6, interval=0.1, message="freed once idle")


@pytest.mark.serial
def test_a_lone_worker_is_never_confined_with_cpu_affinity_none(tmp_path, r):
    with Worker("-c", "4", env={**FAST_ENV, "COGWORKER_CPU_AFFINITY": "none"}, log_path=tmp_path / "w.log") as w:
        w.wait_ready()
        SpinJob.perform_bulk([(0.05, "spun:none")] * 300)
        seen = set()
        while int(r.get("spun:none") or 0) < 300:
            seen |= thread_cpus(w.pid)
            time.sleep(0.1)
        assert seen == {frozenset(ALLOWED)}
