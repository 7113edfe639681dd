"""`runcogworker --processes N` end to end: a real supervisor forking real worker processes.

What an operator relies on: N registered processes grouped under one supervisor, signals passed
on, a worker killed -9 restarted with nothing lost, and no worker left behind when the supervisor
itself is killed -9.
"""

from __future__ import annotations

import json
import os
import signal
import time

from helpers import FAST_ENV, pid_alive, supervisor, wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.process.caps import REPLACE_EXIT
from django_cogworker.engine.process.children import Child
from django_cogworker.engine.process.supervisor import Supervisor, describe_exit
from testproject.demo.jobs import RecordJob, SleepJob

K = Keys()
THRESHOLD = float(FAST_ENV["COGWORKER_ORPHAN_THRESHOLD"])


def wait_children(w, r, count, timeout=40, message="") -> dict[str, dict]:
    """The identity -> info of ``count`` live children (a dead one's entry may linger: ask by pid)."""
    def live():
        found = {i: info for i, info in w.children(r).items() if pid_alive(info["pid"])}
        return found if len(found) == count else None
    return wait_until(live, timeout=timeout, interval=0.1, message=message or f"{count} children registered")


def gone(r, identity: str) -> bool:
    return not (r.sismember(K.processes, identity) or r.exists(K.process(identity))
                or r.exists(K.in_progress(identity)))


def test_two_processes_run_jobs_take_signals_and_stop_on_term(tmp_path, r):
    with supervisor(tmp_path, "-c", "2") as w:
        children = wait_children(w, r, 2)
        infos = list(children.values())
        assert sorted(info["index"] for info in infos) == [0, 1]
        assert len({info["supervisor"] for info in infos}) == 1
        pids = [info["pid"] for info in infos]
        assert len(set(pids)) == 2 and w.pid not in pids
        jids = RecordJob.perform_bulk([["ran"]] * 20)
        wait_until(lambda: sorted(r.lrange("ran", 0, -1)) == sorted(jids), timeout=20, message="20 jobs run")
        w.signal(signal.SIGTTIN)
        wait_until(lambda: w.log().count("thread dump") >= 2, timeout=15, message="both children dump")
        w.signal(signal.SIGTSTP)
        wait_until(lambda: all(r.hget(K.process(i), "quiet") == "true" for i in children), timeout=15,
                   message="both children quiet")
        assert w.alive
        started = time.monotonic()
        w.term()
        assert w.wait(30) == 0
        took = time.monotonic() - started
    assert all(gone(r, identity) for identity in children)
    assert not any(pid_alive(pid) for pid in pids)
    log = w.log()
    assert "| processes 2" in log.splitlines()[0]
    assert log.count("stopped") >= 3  # each child, then the supervisor
    assert "restarting" not in log
    print(f"\nFIGURES --processes 2: TERM to exit 0 in {took:.2f}s, both children drained and deregistered")


def test_a_second_stop_signal_to_the_supervisor_hands_running_jobs_back_at_once(tmp_path, r):
    env = {"COGWORKER_CONCURRENCY": "1", "COGWORKER_SHUTDOWN_TIMEOUT": "600"}
    with supervisor(tmp_path, env=env) as w:
        children = wait_children(w, r, 2)
        jids = [SleepJob.perform_async(600, "marks") for _ in range(2)]
        wait_until(lambda: r.llen("marks") == 2, timeout=15)
        w.signal(signal.SIGINT)
        wait_until(lambda: "a second INT or TERM: they hand running jobs back now" in w.log(), timeout=15)
        assert w.alive
        w.signal(signal.SIGINT)
        assert w.wait(60) == 0  # (well before the 600 s SHUTDOWN_TIMEOUT)
    assert sorted(json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)) == sorted(jids)
    assert "stop signal repeated: worker processes hand their running jobs back now" in w.log()
    assert all(gone(r, identity) for identity in children)


def test_a_ctrl_c_reaching_the_supervisor_and_its_workers_is_one_stop_not_two(tmp_path, r):
    # A terminal's Ctrl-C signals every process of its group: the workers got it, and the
    # supervisor's forwarded TERM on top, which a second-stop rule would take for "hand back now".
    env = {"COGWORKER_CONCURRENCY": "1", "COGWORKER_SHUTDOWN_TIMEOUT": "600"}
    with supervisor(tmp_path, env=env) as w:
        children = wait_children(w, r, 2)
        jid = SleepJob.perform_async(2, "marks")
        wait_until(lambda: r.llen("marks") == 1, timeout=15)
        for info in children.values():
            os.kill(info["pid"], signal.SIGINT)
        w.signal(signal.SIGINT)
        assert w.wait(60) == 0
    assert r.lrange("marks", 0, -1) == [f"start:{jid}", f"end:{jid}"]  # finished, not cut short
    assert not r.exists(K.queue("default"))


def test_a_child_killed_9_under_load_is_restarted_and_nothing_is_lost(tmp_path, r):
    with supervisor(tmp_path, "-c", "4") as w:
        children = wait_children(w, r, 2)
        jids = SleepJob.perform_bulk([[0.1, "marks"]] * 200)
        victim_id = next(i for i, info in children.items() if info["index"] == 0)
        victim_pid = children[victim_id]["pid"]

        def ended() -> set[str]:
            return {m[4:] for m in r.lrange("marks", 0, -1) if m.startswith("end:")}

        wait_until(lambda: len(ended()) >= 20 and r.llen(K.in_progress(victim_id)) > 0, timeout=30,
                   message="the victim busy")
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        held = r.llen(K.in_progress(victim_id))

        def replacement():
            return next((i for i, info in w.children(r).items()
                         if info["index"] == 0 and i != victim_id and pid_alive(info["pid"])), None)

        wait_until(replacement, timeout=30, message="a new child in slot 0")
        restarted_after = time.monotonic() - killed_at
        wait_until(lambda: not r.exists(K.in_progress(victim_id)), timeout=THRESHOLD + 30,
                   message="the killed child's jobs recovered")
        recovered_after = time.monotonic() - killed_at
        wait_until(lambda: ended() >= set(jids), timeout=60, message="every job done")
        done_after = time.monotonic() - killed_at
        w.term()
        assert w.wait(30) == 0
    assert ended() == set(jids)  # none lost (those cut short by the kill ran again)
    assert not r.exists(K.queue("default")) and r.zcard(K.dead) == 0
    log = w.log()
    assert f"worker process 0 (pid {victim_pid}, generation 0) killed by SIGKILL" in log
    assert "restarting it in 1.0s" in log
    print(f"\nFIGURES kill -9 of a child under load: 200 jobs, lost 0, {held} in flight at the kill; "
          f"replacement registered {restarted_after:.2f}s after, its jobs requeued {recovered_after:.2f}s after "
          f"(threshold {THRESHOLD:.0f}s), all done {done_after:.2f}s after")


def test_children_exit_when_the_supervisor_is_killed_9_handing_back_their_jobs(tmp_path, r):
    with supervisor(tmp_path, "-c", "2", env={"COGWORKER_SHUTDOWN_TIMEOUT": "1"}) as w:
        children = wait_children(w, r, 2)
        pids = [info["pid"] for info in children.values()]
        jids = SleepJob.perform_bulk([[60, "marks"]] * 2)
        wait_until(lambda: r.llen("marks") == 2, timeout=20, message="both jobs running")
        w.kill9()
        assert w.wait(10) == -signal.SIGKILL
        killed_at = time.monotonic()
        wait_until(lambda: not any(pid_alive(pid) for pid in pids), timeout=20, interval=0.1,
                   message="the children gone")
        exited_after = time.monotonic() - killed_at
    # They stopped as on any TERM: the unfinished jobs back on their queue, the registry left.
    assert sorted(json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1)) == sorted(jids)
    assert all(gone(r, identity) for identity in children)
    print(f"\nFIGURES kill -9 of the supervisor: both children exited {exited_after:.2f}s after "
          f"(SHUTDOWN_TIMEOUT 1s), their 2 running jobs handed back to the queue")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_crash_loop_backs_off_doubling_to_the_cap_and_a_long_life_resets_it(monkeypatch):
    clock = FakeClock()
    sup = Supervisor(1, lambda spec: 0, shutdown_timeout=5, clock=clock)
    slot = sup.slots[0]
    exits: list[tuple[int, int]] = []

    def waitpid(pid, options):
        return exits.pop(0) if exits else (0, 0)

    monkeypatch.setattr(os, "waitpid", waitpid)

    def die(after: float, status: int = signal.SIGKILL, worked: bool = False) -> float | None:
        """The child started now (ready) dies ``after`` seconds later; return the wait before its restart."""
        slot.current = sup.children[4242] = Child(4242, 0, 0, clock.now, None, ready=True, worked=worked)
        clock.now += after
        exits.append((4242, status))
        sup._reap()
        assert 4242 not in sup.children
        return None if slot.restart_at is None else slot.restart_at - clock.now

    assert [die(0.5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert die(60, status=3 << 8) == 1  # it had lived long enough: a new failure, not the same loop
    assert die(0.5) == 2
    monkeypatch.setattr(os, "fork", lambda: (_ for _ in ()).throw(BlockingIOError(11, "EAGAIN")))
    clock.now = slot.restart_at
    sup._restart_due()  # fork failed: tried again later, the supervisor (and the other workers) stay up
    assert slot.current is None and slot.restart_at == clock.now + 4
    # Exited to be replaced (a cap) having run a job: a fresh one at once (here: the fork attempt,
    # which fails and backs off), not after the crash backoff; over its cap having run nothing (a
    # cap below what a fresh process grows to), a crash loop (each exit: tests/fast/test_caps.py).
    slot.restart_at = None
    forks = []
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or (_ for _ in ()).throw(BlockingIOError(11, "EAGAIN")))
    assert die(0.5, status=REPLACE_EXIT << 8, worked=True) is not None and forks == [1]
    slot.restart_at = None
    assert die(0.5, status=REPLACE_EXIT << 8) == 16 and forks == [1]
    sup.quiet = True  # a quiet supervisor restarts nothing: a new child would fetch
    slot.restart_at = None
    assert die(100, status=0) is None


def test_an_exit_is_described_by_code_or_signal():
    assert describe_exit(3 << 8) == "exited with code 3"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(signal.SIGKILL) == "killed by SIGKILL"
