"""api.Queue, the object model over a queue (size, latency, pause); `manage.py cogworker` is in test_cli.py.

The pause tests run a real `runcogworker` process: a paused queue is left alone from its next
heartbeat on, the others are still served, and with every queue paused the process stays idle.
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from django.core.management import call_command
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.push.client import Client
from django_cogworker.push.job import JobSetter
from testproject.demo.jobs import RecordJob

K = Keys()


def push_at(rb, redis_url, queue: str, value, when: float) -> str:
    """Push RecordJob("seen", value) to `queue` as if enqueued at `when`."""
    client = Client(build_config({}, {"COGWORKER_REDIS_URL": redis_url}), rb, clock=lambda: when)
    return client.push(JobSetter(RecordJob, {"queue": queue}).build(["seen", value], {}))


def queues(**kw) -> dict[str, api.Queue]:
    return {q.name: q for q in api.Queue.all(**kw)}


# -- the object model ------------------------------------------------------------------------------


def test_size_latency_jobs_and_clear(rb, redis_url):
    first = push_at(rb, redis_url, "mail", 1, when=1000.0)
    push_at(rb, redis_url, "mail", 2, when=1010.0)
    last = push_at(rb, redis_url, "mail", 3, when=1030.0)
    mail = api.Queue("mail", redis=rb, keys=K)
    assert mail.size() == 3
    assert mail.latency(now=1100.0) == 100.0  # the oldest job's wait
    assert api.Queue("empty", redis=rb, keys=K).latency(now=1100.0) == 0.0
    page = mail.jobs(page=1, per_page=2)
    assert (page.total, page.pages, page.has_next) == (3, 2, True)
    assert [item.jid for item in page.items] == [last, mail.jobs(page=1, per_page=3).items[1].jid]
    assert mail.jobs(page=2, per_page=2).items[0].jid == first  # newest first; the fetch takes the oldest
    assert mail.clear() == 3
    assert mail.size() == 0 and mail.clear() == 0


def test_latency_of_an_unreadable_oldest_job_is_zero(rb):
    rb.lpush(K.queue("mail"), b"not json")
    assert api.Queue("mail", redis=rb, keys=K).latency(now=1e9) == 0.0


def test_a_queue_needs_a_name(rb):
    for name in ("", None, 3):
        with pytest.raises(ValueError, match="non-empty string"):
            api.Queue(name, redis=rb, keys=K)


def test_all_lists_queues_pushed_to_and_paused_ones_sorted(rb, redis_url):
    push_at(rb, redis_url, "mail", 1, when=time.time())
    push_at(rb, redis_url, "default", 1, when=time.time())
    api.Queue("reports", redis=rb, keys=K).pause()  # never pushed to: listed, so it can be unpaused
    assert list(queues(redis=rb, keys=K)) == ["default", "mail", "reports"]
    assert api.Queue.all() and [q.name for q in api.Queue.all()] == ["default", "mail", "reports"]  # the runtime's


def test_pause_and_unpause(rb):
    mail = api.Queue("mail", redis=rb, keys=K)
    assert mail.paused is False
    mail.pause()
    mail.pause()  # idempotent
    assert mail.paused is True and rb.smembers(K.paused_queues) == {b"mail"}
    assert api.Queue("default", redis=rb, keys=K).paused is False
    mail.unpause()
    assert mail.paused is False and rb.smembers(K.paused_queues) == set()


# -- a running worker ------------------------------------------------------------------------------


def test_a_running_worker_stops_fetching_a_paused_queue_and_resumes_on_unpause(r):
    with Worker("-c", "2", env=FAST_ENV) as worker:  # queues default and mail; a beat every 0.5 s
        identity = worker.wait_ready()
        RecordJob.set(queue="mail").perform_async("seen", "mail-before")
        wait_until(lambda: "mail-before" in r.lrange("seen", 0, -1), timeout=10)

        out = io.StringIO()
        call_command("cogworker", "pause", "mail", stdout=out)
        assert out.getvalue() == "mail: paused\n"
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


def redis_now(r) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1e6


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
