"""Delivering batch callbacks (django_cogworker/features/batches/delivery.py): once each, and, when the pusher
whose jobs() block fired them died before it delivered them, by the workers' housekeeping.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_delivery.py.
"""

from __future__ import annotations

import time

from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_delivery import callback_classes, closer_dies_before_delivering

from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import delivery
from testproject.demo.jobs import BatchCallbackJob

K = Keys()


def test_a_worker_s_housekeeping_delivers_a_dead_closer_s_callbacks(monkeypatch, tmp_path, r):
    batch = closer_dies_before_delivering(monkeypatch)
    r.zadd(K.batch_closing, {batch.bid: time.time() - delivery.CLOSING_GRACE - 1})  # (its closer died a while ago)
    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:  # (serving default, not "callbacks")
        w.wait_ready()
        wait_until(lambda: len(callback_classes(r)) == 2, timeout=20, message="the callbacks delivered")
        wait_until(lambda: r.zcard(K.batch_closing) == 0, timeout=5)
        w.term()
        w.wait(30)
    assert callback_classes(r) == [BatchCallbackJob.name] * 2
    assert "delivered 2 batch callback(s) whose pusher died" in w.log()
