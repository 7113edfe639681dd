"""api.Queue, the object model over a queue (size, latency, pause); `manage.py cogworker` is in test_cli.py.

The pause tests run a real `runcogworker` process: a paused queue is left alone from its next
heartbeat on, the others are still served, and with every queue paused the process stays idle.
"""

from __future__ import annotations

import time

import pytest

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


