"""The caps' decisions, without a worker process: engine/process/caps.py, report.py, and the
supervisor's answer to each kind of exit (its reap, with waitpid and fork stood in for).

MAX_MEMORY_MB below what a fresh process takes made a supervisor fork for ever (392 forks in
42 s, no job run): a process now refuses to run below its own size, naming both figures, and a
supervisor replaces at once only a process that ran a job. tests/workers/test_caps_workers.py
runs the same with real supervisors.
"""

from __future__ import annotations

import os
import signal

import pytest
from engine_fixtures import Note, make_config, new_token, push, runs

from django_cogworker.broker.connection import make_redis
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.process.caps import REFUSE_EXIT, REPLACE_EXIT, Caps, Then, after_exit
from django_cogworker.engine.process.children import Child
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.engine.process.report import Reporter, split_refusal
from django_cogworker.engine.process.supervisor import Supervisor
from django_cogworker.errors import ConfigError
from django_cogworker.push.client import Client

MB = 1024  # (kB: what rss_kb reads)


def test_a_cap_below_the_size_a_process_has_before_any_job_is_refused_naming_both_figures():
    rss = [70 * MB + 300]
    caps = Caps(64, None, lambda over: None, rss=lambda: rss[0])
    why = caps.refusal()
    assert why is not None
    assert why.startswith('COGWORKER["MAX_MEMORY_MB"] 64 is below the 70.3 MB (RSS) this worker process takes')
    assert "Set it above 71 " in why
    rss[0] = 64 * MB  # (at the cap is not over it: the rule of every later check)
    assert caps.refusal() is None
    assert Caps(None, 5, lambda over: None, rss=lambda: 10**9).refusal() is None  # (no memory cap)


def test_the_first_job_is_told_once_whatever_follows():
    told = []
    caps = Caps(None, 3, lambda over: None, rss=lambda: 50 * MB, on_first_job=lambda: told.append(caps.jobs))
    for _ in range(5):
        caps.job_started()
    assert told == [1]


@pytest.mark.parametrize(("code", "worked", "any_ready", "then"), [
    (REPLACE_EXIT, True, True, Then.AT_ONCE),  # a cap, after a job: the host keeps its N processes
    (REPLACE_EXIT, False, True, Then.BACK_OFF),  # a cap before any job: the next would do the same
    (REPLACE_EXIT, False, False, Then.BACK_OFF),
    (0, True, True, Then.BACK_OFF),  # (an exit of its own, however it exits: backed off)
    (-signal.SIGKILL, True, True, Then.BACK_OFF),
    (1, False, False, Then.BACK_OFF),
    (REFUSE_EXIT, False, False, Then.STOP),  # refused before any was ready: every fresh one would
    (REFUSE_EXIT, False, True, Then.BACK_OFF),  # a roll to a release that refuses: the old ones work on
])
def test_what_follows_each_exit(code, worked, any_ready, then):
    assert after_exit(code, worked, any_ready) is then


def test_a_refusal_travels_whole_between_the_one_byte_messages():
    read, write = os.pipe()
    try:
        reporter = Reporter(write)
        reporter.beat()
        reporter.worked()
        reporter.refuse('COGWORKER["MAX_MEMORY_MB"] 1 is below the 58.4 MB (RSS)\nquite\tbusy')
        reporter.quiet()
        data = os.read(read, 4096)
    finally:
        os.close(read)
        os.close(write)
    rest, why = split_refusal(data)
    assert why == 'COGWORKER["MAX_MEMORY_MB"] 1 is below the 58.4 MB (RSS) quite busy'
    assert rest == b"bwq"  # (the text's own r, b, q and u are no READY, BEAT, QUIET or UNREADY)
    assert split_refusal(b"rbb") == (b"rbb", None)


def test_a_launcher_below_its_cap_refuses_before_taking_anything_and_leaves_no_trace(redis_url, r):
    config = make_config(redis_url, MAX_MEMORY_MB=1, FETCH="basic")
    client = make_redis(config)
    token = new_token()
    push(Client(config, client), Note, token, 1)
    read, write = os.pipe()
    try:
        launcher = Launcher(config, client, reporter=Reporter(write))
        with pytest.raises(ConfigError) as info:
            launcher.run(install_signals=False)
        _, said = split_refusal(os.read(read, 4096))
    finally:
        os.close(read)
        os.close(write)
        client.close()
    why = info.value.errors[0]
    assert why.startswith('COGWORKER["MAX_MEMORY_MB"] 1 is below the ') and " MB (RSS) " in why
    assert float(why.split("below the ")[1].split()[0]) > 1
    assert said == why  # (what its supervisor stops with)
    keys = Keys(config.key_prefix)
    assert r.llen(keys.queue("default")) == 1 and runs(token) == []  # nothing taken, nothing run
    assert not r.exists(keys.processes) and not r.exists(keys.process(launcher.identity))


class _Exits:
    """waitpid and fork stood in for: the test says which child exits how; a fork fails (EAGAIN)."""

    def __init__(self, monkeypatch):
        self.pending: list[tuple[int, int]] = []
        self.forks = 0
        monkeypatch.setattr(os, "waitpid", lambda pid, options: self.pending.pop(0) if self.pending else (0, 0))
        monkeypatch.setattr(os, "fork", self._fork)

    def _fork(self):
        self.forks += 1
        raise BlockingIOError(11, "EAGAIN")


def _child(sup: Supervisor, pid: int, index: int, now: float, *, said: bytes = b"", ready: bool = True) -> Child:
    """A child in slot ``index`` that has written ``said`` on its report pipe (then exited: EOF)."""
    read, write = os.pipe()
    os.write(write, said)
    os.close(write)
    os.set_blocking(read, False)
    child = Child(pid, index, 0, now, read, ready=ready)
    sup.slots[index].current = sup.children[pid] = child
    return child


def test_a_supervisor_stops_at_a_refusal_before_any_child_was_ready_and_forks_no_more(monkeypatch):
    now = [100.0]
    sup = Supervisor(2, lambda spec: 0, shutdown_timeout=5, clock=lambda: now[0])
    exits = _Exits(monkeypatch)
    _child(sup, 11, 0, now[0], said=b"b!" + b"MAX_MEMORY_MB 1 is below the 58.4 MB\n" + b"q", ready=False)
    _child(sup, 12, 1, now[0], ready=False)
    now[0] += 0.4
    exits.pending.append((11, REFUSE_EXIT << 8))
    sup._reap()
    assert sup.stopping and sup.refusal == "MAX_MEMORY_MB 1 is below the 58.4 MB"
    assert all(slot.restart_at is None for slot in sup.slots) and exits.forks == 0
    exits.pending.append((12, signal.SIGTERM))  # (the other one, stopped: not restarted)
    sup._reap()
    sup._restart_due()
    assert exits.forks == 0 and not sup.children


def test_a_cap_exit_is_replaced_at_once_only_after_a_job_and_a_refusal_after_a_ready_one_backs_off(monkeypatch):
    now = [100.0]
    sup = Supervisor(1, lambda spec: 0, shutdown_timeout=5, clock=lambda: now[0])
    exits = _Exits(monkeypatch)
    slot = sup.slots[0]

    def exit_after(lived: float, status: int, said: bytes) -> float | None:
        """A child ready now exits ``lived`` s later having said ``said``; the wait before the next, or None."""
        _child(sup, 21, 0, now[0], said=said)
        sup.any_ready = True
        now[0] += lived
        exits.pending.append((21, status))
        sup._reap()
        wait = None if slot.restart_at is None else slot.restart_at - now[0]
        slot.restart_at = None
        return wait

    # Over a cap after it ran a job (--max-jobs-per-process 1 exits after each): at once, at any age.
    assert exit_after(0.3, REPLACE_EXIT << 8, b"rwb") is not None and exits.forks == 1  # (the fork tried: EAGAIN)
    slot.delay = sup.backoff_min
    # Over a cap having run nothing, however young or old it is: the crash backoff, growing.
    assert [exit_after(0.3, REPLACE_EXIT << 8, b"rb") for _ in range(4)] == [1, 2, 4, 8]
    assert exit_after(0.3, 0, b"rb") == 16  # (an exit 0 just as well)
    assert exit_after(61, REPLACE_EXIT << 8, b"rb") == 1  # (it had lived: a new failure, not the same loop)
    # A refusal once others ran (a roll to a release that refuses): backed off, the supervisor goes on.
    assert exit_after(0.3, REFUSE_EXIT << 8, b"!too small\n") == 2
    assert not sup.stopping and sup.refusal is None
    assert exits.forks == 1
