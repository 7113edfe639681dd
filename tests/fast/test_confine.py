"""engine/process/confine.py: a worker "auto" leaves free keeps its threads on one CPU while bound by its GIL.

What an operator relies on: a process using about one core (its GIL's worth) is kept on the
idlest CPU, and freed as soon as that stops paying: idle or waiting on I/O, crowded by other
work with nowhere better, using more than a core (C code in parallel), or, once in a while,
to look; "none", a pinned process and a one-CPU machine are never touched. A real thread
move is checked in a child process (the test's own threads stay where they are); the
worker-level check (a busy runcogworker confined, then freed) is in tests/workers/test_affinity.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from django_cogworker.engine.process import confine
from django_cogworker.engine.process.confine import PROBE_EVERY, Confiner, Reading, decide

TWO = {0: 0.5, 1: 0.6}


@pytest.mark.parametrize(("usage", "expected"), [(1.0, 1), (0.8, 1), (1.2, 1), (0.6, None), (1.6, None), (0.0, None)])
def test_a_free_process_is_kept_on_the_idlest_cpu_only_while_it_uses_about_one_core(usage, expected):
    assert decide(None, Reading(usage, TWO)) == expected


def test_ties_go_to_the_lowest_cpu_and_one_cpu_is_never_confined():
    assert decide(None, Reading(1.0, {3: 0.4, 1: 0.4, 2: 0.1})) == 1
    assert decide(None, Reading(1.0, {0: 0.0})) is None


def test_a_confined_process_stays_while_its_cpu_is_its_own():
    # On CPU 0 using 0.95 of it; 0.03 is other work's.
    assert decide(0, Reading(0.95, {0: 0.02, 1: 0.7})) == 0


@pytest.mark.parametrize("usage", [0.45, 0.1, 0.0])
def test_a_confined_process_idle_or_waiting_on_io_is_freed(usage):
    assert decide(0, Reading(usage, {0: 1 - usage, 1: 0.9})) is None


def test_a_crowded_cpu_is_left_for_the_idlest_other_with_room_else_the_process_is_freed():
    crowded = {0: 0.0, 1: 0.55, 2: 0.8}  # other work takes 0.4 of CPU 0
    assert decide(0, Reading(0.6, crowded)) == 2
    assert decide(0, Reading(0.6, {0: 0.0, 1: 0.3, 2: 0.2})) is None


def test_a_probe_frees_a_confined_process_for_a_window():
    assert decide(0, Reading(1.0, {0: 0.0, 1: 0.7}), probe_due=True) is None


def test_a_cpu_gone_from_the_reading_frees_the_process():
    assert decide(5, Reading(1.0, TWO)) is None


class Moves:
    def __init__(self, fail: bool = False):
        self.calls: list[frozenset[int]] = []
        self.fail = fail

    def __call__(self, cpus: frozenset[int]) -> None:
        if self.fail:
            raise PermissionError("not allowed")
        self.calls.append(cpus)


def test_the_confiner_moves_threads_keeps_new_ones_in_line_probes_and_frees():
    moves = Moves()
    c = Confiner([0, 1], move=moves)
    c.step(Reading(1.0, {0: 0.6, 1: 0.3}), now=100.0)
    assert (c.cpu, moves.calls) == (0, [frozenset({0})])
    c.step(Reading(0.97, {0: 0.01, 1: 0.7}), now=101.0)  # stays: its threads moved again (a new processor)
    assert (c.cpu, moves.calls[-1], len(moves.calls)) == (0, frozenset({0}), 2)
    c.step(Reading(0.97, {0: 0.01, 1: 0.7}), now=100.0 + PROBE_EVERY)
    assert (c.cpu, moves.calls[-1]) == (None, frozenset({0, 1}))  # a window free, to look
    c.step(Reading(1.7, {0: 0.1, 1: 0.1}), now=101.0 + PROBE_EVERY)  # more than a core free: stays free
    assert (c.cpu, len(moves.calls)) == (None, 3)
    c.step(Reading(1.0, {0: 0.2, 1: 0.5}), now=102.0 + PROBE_EVERY)
    c.step(Reading(0.1, {0: 0.9, 1: 0.9}), now=103.0 + PROBE_EVERY)  # idle: freed
    assert moves.calls[-2:] == [frozenset({1}), frozenset({0, 1})]
    assert c.cpu is None


def test_a_move_refused_leaves_the_process_where_it_is(caplog):
    c = Confiner([0, 1], move=Moves(fail=True))
    c.step(Reading(1.0, TWO), now=1.0)
    assert c.cpu is None
    assert "could not move this process's threads (CPU confinement): not allowed" in caplog.text


def test_the_watch_reads_its_own_cpu_time_and_each_cpus_idle_share():
    wall, cpu = iter([0.0, 1.0, 2.0]), iter([10.0, 10.8, 11.8])
    ticks = iter([{0: (100, 200), 1: (150, 200)}, {0: (105, 300), 1: (240, 300)},
                  {0: (106, 400), 1: (330, 400)}])
    c = Confiner([0, 1], window=0.01, clock=lambda: next(wall), process_time=lambda: next(cpu),
                 read_cpus=lambda cpus: next(ticks), move=Moves())
    seen: list[tuple[Reading, float]] = []

    def step(reading: Reading, now: float) -> None:
        seen.append((reading, now))
        if len(seen) == 2:
            c.stop_event.set()

    c.step = step  # type: ignore[method-assign]
    c.start()
    c._thread.join(5)
    assert [(round(r.usage, 6), r.idle, now) for r, now in seen] == [
        (0.8, {0: 0.05, 1: 0.9}, 1.0), (1.0, {0: 0.01, 1: 0.9}, 2.0)]


def test_cpu_times_reads_idle_and_iowait_against_every_tick_but_guests(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9 9 9\n"
                    "cpu0 10 0 5 80 5 0 0 0 7 0\n"
                    "cpu1 40 1 9 40 0 2 3 5 0 0\n"
                    "intr 1 2 3\n")
    assert confine.cpu_times([0, 1, 2], str(stat)) == {0: (85, 100), 1: (40, 100)}
    real = confine.cpu_times(sorted(os.sched_getaffinity(0)))
    assert set(real) == set(os.sched_getaffinity(0))
    assert all(0 <= idle <= total for idle, total in real.values())


def test_idle_shares_skip_a_cpu_whose_clock_did_not_move():
    assert confine.idle_shares({0: (10, 100), 1: (10, 100)}, {0: (60, 200), 1: (10, 100)}) == {0: 0.5}


def test_for_process_only_watches_a_process_auto_left_free_on_several_cpus():
    several = len(os.sched_getaffinity(0)) > 1
    assert isinstance(confine.for_process("auto", None), Confiner) is several
    assert confine.for_process("none", None) is None
    assert confine.for_process("auto", frozenset({0})) is None
    assert confine.for_process((0, 1), None) is None


def test_move_threads_moves_every_thread_of_the_process():
    # In a child process: the test's own threads stay where they are.
    cpus = sorted(os.sched_getaffinity(0))
    script = textwrap.dedent(f"""
        import os, threading
        from django_cogworker.engine.process.confine import move_threads
        stop = threading.Event()
        threads = [threading.Thread(target=stop.wait) for _ in range(3)]
        for t in threads:
            t.start()
        def masks():
            return {{tid: os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}}
        move_threads(frozenset({{{cpus[-1]}}}))
        one = masks()
        move_threads(frozenset({cpus!r}))
        back = masks()
        stop.set()
        print(len(one), sorted(set(map(frozenset, one.values())), key=sorted) == [{{{cpus[-1]}}}],
              all(m == set({cpus!r}) for m in back.values()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "True", "True"]
