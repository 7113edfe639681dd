"""MAX_MEMORY_MB and MAX_JOBS_PER_PROCESS with real supervisors and workers: a cap no process can
run under is refused at startup, a child that exits having run nothing is backed off, and one that
exits after each job on purpose is not.

`--processes 2 --max-memory-mb 1` used to fork for ever: 392 forks in 42 s, no job run. The
decisions alone: tests/fast/test_caps.py.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime

from helpers import FAST_ENV, Worker, pid_alive, supervisor, wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.process.caps import REFUSE_EXIT
from django_cogworker.engine.process.children import RETIRE
from testproject.demo.jobs import RecordJob

K = Keys()
REFUSED = re.compile(r'COGWORKER\["MAX_MEMORY_MB"\] 1 is below the (\d+\.\d) MB \(RSS\) this worker process takes '
                     r"before running any job")


def test_max_memory_mb_below_a_fresh_process_stops_the_supervisor_naming_the_cap_and_the_size(tmp_path, r):
    jids = RecordJob.perform_bulk([["ran"]] * 100)
    with supervisor(tmp_path, "--max-memory-mb", "1") as w:
        code = w.wait(60)  # (it forked for ever)
    log = w.log()
    assert code == REFUSE_EXIT, log
    assert log.count("started worker process") == 2  # one per slot, none again
    assert "refused to run" in log and "before any was ready: stopping" in log
    error = log[log.index("CommandError: invalid configuration:"):]
    assert float(REFUSED.search(error).group(1)) > 1  # the measured size, in the command's own error
    queued = sorted(json.loads(raw)["jid"] for raw in r.lrange(K.queue("default"), 0, -1))
    assert queued == sorted(jids) and r.llen("ran") == 0  # nothing taken: all 100 wait
    assert r.scard(K.processes) == 0  # (each left the registry as at a stop)


def test_a_lone_worker_below_its_max_memory_mb_exits_with_ex_config_naming_both_figures(tmp_path, r):
    RecordJob.perform_bulk([["ran"]] * 10)
    with Worker("--max-memory-mb", "1", env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        code = w.wait(60)
    log = w.log()
    assert code == REFUSE_EXIT, log  # (not 75, "replace me": its process manager would loop it)
    assert REFUSED.search(log[log.index("CommandError: invalid configuration:"):])
    assert r.llen(K.queue("default")) == 10 and r.llen("ran") == 0
    assert r.scard(K.processes) == 0


def _logged_at(line: str) -> datetime:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_a_child_that_exits_to_be_replaced_having_run_no_job_is_restarted_after_growing_delays(tmp_path, r):
    # A child retired by hand exits with 75, as one over its cap does, here before any job: under
    # the old rule it was replaced at once, each time (a fork loop, when a cap was what made it exit).
    with supervisor(tmp_path) as w:
        retired: set[int] = set()

        def fresh_in_slot_0() -> int | None:
            return next((info["pid"] for info in w.children(r).values()
                         if info["index"] == 0 and info["pid"] not in retired and pid_alive(info["pid"])), None)

        for _ in range(4):
            pid = wait_until(fresh_in_slot_0, timeout=60, message="a fresh process in slot 0")
            retired.add(pid)
            os.kill(pid, RETIRE)
            wait_until(lambda pid=pid: not pid_alive(pid), timeout=30, message="it exited")
        wait_until(lambda: "restarting it in 8.0s" in w.log(), timeout=30, message="the fourth exit reaped")
        w.term()
        assert w.wait(30) == 0
    lines = w.log().splitlines()
    exits = [(i, float(m.group(1))) for i, line in enumerate(lines) if (m := re.search(
        r"worker process 0 \(pid \d+, generation 0\) exited with code 75 after [\d.]+s; restarting it in ([\d.]+)s",
        line))]
    assert [delay for _, delay in exits] == [1.0, 2.0, 4.0, 8.0]
    assert not any("starting a fresh one now" in line for line in lines)
    # Each restart came no sooner than its delay (the log's own clock: load only makes it later).
    waited = []
    for i, delay in exits[:3]:
        started = next(line for line in lines[i:] if "started worker process 0 " in line)
        waited.append((_logged_at(started) - _logged_at(lines[i])).total_seconds())
        assert waited[-1] >= delay - 0.01
    print(f"\nFIGURES a child exiting 75 with no job, 4 times: restarted after {', '.join(f'{s:.2f}s' for s in waited)}"
          f" (delays 1, 2, 4 s; then 8 s)")


def test_max_jobs_per_process_1_under_a_supervisor_runs_every_job_once_and_is_never_backed_off(tmp_path, r):
    env = {"COGWORKER_CONCURRENCY": "1", "COGWORKER_PREFETCH": "0"}
    with supervisor(tmp_path, "--max-jobs-per-process", "1", env=env) as w:
        jids = RecordJob.perform_bulk([["ran"]] * 12)
        wait_until(lambda: r.llen("ran") == 12, timeout=120, interval=0.2, message="12 jobs run")
        wait_until(lambda: r.hget(K.stat_replaced, "jobs") == "12", timeout=60, message="12 processes replaced")
        # A child counts its replacement before it exits: the supervisor may not have reaped the last
        # yet, and one reaped after the TERM below is logged as stopped, not replaced (none is started).
        wait_until(lambda: w.log().count("exited to be replaced (code 75") == 12, timeout=30,
                   message="the supervisor saw the 12th exit to be replaced")
        w.term()
        assert w.wait(30) == 0
    assert sorted(r.lrange("ran", 0, -1)) == sorted(jids)  # each once
    log = w.log()
    assert log.count("exited to be replaced (code 75") == 12 and log.count("starting a fresh one now") == 12
    assert "restarting it in" not in log  # (each had run its job: replaced at once, never backed off)
