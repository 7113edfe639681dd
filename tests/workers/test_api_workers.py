"""api.Queue, the object model over a queue (size, latency, pause); `manage.py cogworker` is in test_cli.py.

The pause tests run a real `runcogworker` process: a paused queue is left alone from its next
heartbeat on, the others are still served, and with every queue paused the process stays idle.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_api.py.
"""

from __future__ import annotations

import io
import json
import os
import time

from django.core.management import call_command
from helpers import FAST_ENV, Worker, wait_until
from peek import redis_now

from django_cogworker import api
from testproject.demo.jobs import RecordJob


def test_a_running_worker_stops_fetching_a_paused_queue_and_resumes_on_unpause(r):
    with Worker("-c", "2", env=FAST_ENV) as worker:  # queues default and mail; a beat every 0.5 s
        identity = worker.wait_ready()
        RecordJob.set(queue="mail").perform_async("seen", "mail-before")
        wait_until(lambda: "mail-before" in r.lrange("seen", 0, -1), timeout=10)

        out = io.StringIO()
        call_command("cogworker", "pause", "mail", stdout=out)
        # The line says when the pause takes effect (at each process's next heartbeat), not "at once".
        said = out.getvalue()
        assert said.startswith("mail: paused (each process stops fetching from it at its next heartbeat, within ")
        assert said.endswith("; the jobs it took by then still run)\n")
        paused_at = redis_now(r)
        # The worker's next heartbeat reads the paused set; a fetch already waiting on the queue
        # (at most FETCH_IDLE_MAX_INTERVAL, 1 s, with two queues) ends first.
        wait_until(lambda: float(r.hget(f"cogworker:process:{identity}", "beat") or 0) > paused_at, timeout=5)
        time.sleep(1.2)
        RecordJob.set(queue="mail").perform_async("seen", "mail-paused")
        RecordJob.perform_async("seen", "default-served")
        wait_until(lambda: "default-served" in r.lrange("seen", 0, -1), timeout=10)  # others still served
        time.sleep(1.5)
        assert "mail-paused" not in r.lrange("seen", 0, -1)
        assert api.Queue("mail").size() == 1

        api.Queue("mail").unpause()
        wait_until(lambda: "mail-paused" in r.lrange("seen", 0, -1), timeout=10)
        assert api.Queue("mail").size() == 0
        worker.term()
        assert worker.wait(30) == 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def command_calls(r) -> int:
    return sum(stat["calls"] for stat in r.info("commandstats").values())


def test_with_every_queue_paused_the_worker_does_not_spin(r):
    api.Queue("default").pause()
    api.Queue("mail").pause()
    # A beat a second and the default poll interval (5 s): a quiet baseline.
    with Worker("-c", "5", env={"COGWORKER_HEARTBEAT_INTERVAL": "1", "COGWORKER_SHUTDOWN_TIMEOUT": "5"}) as worker:
        worker.wait_ready()
        time.sleep(1.0)  # startup done
        calls, cpu = command_calls(r), cpu_seconds(worker.pid)
        time.sleep(2.0)
        calls, cpu = command_calls(r) - calls, cpu_seconds(worker.pid) - cpu
        print(f"every queue paused, over 2 s: {calls} Redis commands, {cpu:.2f} s CPU")
        assert calls < 100, calls  # two heartbeats and a poll, not a fetch loop
        assert cpu < 0.5, cpu  # the fetcher waits instead of spinning on an empty queue list
        api.Queue("default").unpause()
        RecordJob.perform_async("seen", json.dumps("after"))
        wait_until(lambda: r.lrange("seen", 0, -1), timeout=15)  # served from the next heartbeat on
        worker.term()
        assert worker.wait(30) == 0
