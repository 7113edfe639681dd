"""`manage.py cogworker` (django_cogworker/cli/ and its command): listings with headers and
--json, bounded paging, actions with their confirmations, and exit codes, on the suite's Redis;
quiet/stop on a real `runcogworker` process.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_cli.py.
"""

from __future__ import annotations

import time

import pytest
from django.core.management.base import CommandError
from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_cli import cli, cli_json

from django_cogworker import api
from django_cogworker.broker.keys import Keys

K = Keys()


def test_quiet_and_stop_reach_a_running_worker(r):
    with pytest.raises(CommandError, match="no such live process") as caught:
        cli("quiet", "nobody:1:abc")
    assert caught.value.returncode == 1
    with Worker("-c", "2", env=FAST_ENV) as worker:
        identity = worker.wait_ready()
        document = cli_json("processes")
        listed = document["items"]
        assert [p["identity"] for p in listed] == [identity] and listed[0]["concurrency"] == 2
        assert (document["total"], document["per_page"]) == (1, 25)  # (per_page: the page size, not 1)
        assert cli("processes")[0].splitlines()[1].startswith(identity)
        assert cli("quiet", identity)[0] == f"{identity}: quiet sent (read at its next heartbeat)\n"
        wait_until(lambda: r.hget(f"cogworker:process:{identity}", "quiet") == "true", timeout=10)
        assert cli_json("processes")["items"][0]["quiet"] is True
        cli("stop", "--all")
        assert worker.wait(30) == 0


def test_cancel_interrupt_stops_a_running_job_that_never_asks(rb):
    # GatedJob sleeps in slices of 0.05 s until its gate opens and never reads self.cancelled:
    # only the interrupt (Cancelled raised in its thread) stops it.
    from testproject.demo.jobs import GatedJob

    jid = GatedJob.perform_async("cancel:gate", "cancel:ran", 60.0)
    with Worker("-c", "2", env=FAST_ENV) as worker:
        worker.wait_ready()
        wait_until(lambda: rb.lrange("cancel:ran", 0, -1) == [f"start:{jid}".encode()], timeout=15,
                   message="started")
        out, err = cli("cancel", jid, "--interrupt")
        assert (out, err) == (f"{jid}: running; interrupt requested (its process acts at its next heartbeat)\n", "")
        wait_until(lambda: rb.get(K.stat_cancelled) == b"1", timeout=10, message="interrupted and counted")
        wait_until(lambda: "cancelled jid=" in worker.log(), timeout=5, message="logged")
        rb.set("cancel:gate", 1)  # (a rerun would end at once now, and record it)
        time.sleep(1.5)  # (three beats: a retry or a rerun would show by now)
        assert worker.alive and rb.get(K.stat_cancelled) == b"1"
        assert rb.zcard(K.retry) == 0 and rb.zcard(K.dead) == 0 and api.Queue("default").size() == 0
        assert rb.hlen(K.workers(worker.identity)) == 0  # nothing runs
    assert rb.lrange("cancel:ran", 0, -1) == [f"start:{jid}".encode()]  # never ended, never ran again
