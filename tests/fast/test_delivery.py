"""Delivering batch callbacks (django_cogworker/features/batches/delivery.py): once each, and, when the pusher
whose jobs() block fired them died before it delivered them, by the workers' housekeeping."""

from __future__ import annotations

import logging
import time

import pytest
from peek import queued_payloads

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import delivery
from testproject.demo.jobs import BatchCallbackJob

K = Keys()


def callback_classes(r) -> list[str]:
    return [payload["class"] for payload in queued_payloads(r, "callbacks")]


def closer_dies_before_delivering(monkeypatch) -> Batch:
    """An empty batch whose close fires complete and success, its pusher 'dying' before delivery."""
    def die(*args, **kwargs):
        raise SystemExit("killed")

    batch = Batch(callback_queue="callbacks")
    batch.on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with monkeypatch.context() as m:
        m.setattr(delivery, "deliver", die)
        with pytest.raises(SystemExit):
            with batch.jobs():
                pass
    return batch


def test_a_closer_that_died_before_delivering_has_its_callbacks_delivered_once_by_the_sweep(monkeypatch, r, rb):
    batch = closer_dies_before_delivering(monkeypatch)
    assert Batch.status(batch.bid).success and callback_classes(r) == []
    assert r.llen(K.batch(batch.bid).outbox) == 2 and r.zscore(K.batch_closing, batch.bid)
    now = time.time()
    assert delivery.sweep_closing(rb, K, 60, now) == 0  # (within the grace: its closer may be delivering)
    assert delivery.sweep_closing(rb, K, 60, now + delivery.CLOSING_GRACE + 1) == 2
    assert delivery.sweep_closing(rb, K, 60, now + delivery.CLOSING_GRACE + 1) == 0
    assert callback_classes(r) == [BatchCallbackJob.name] * 2
    assert r.llen(K.batch(batch.bid).outbox) == 0 and r.zcard(K.batch_closing) == 0


def test_a_closing_is_kept_while_its_block_is_open_and_forgotten_once_its_batch_expired(r, rb):
    batch = Batch()
    later = time.time() + delivery.CLOSING_GRACE + 1
    with batch.jobs():
        delivery.closing(rb, K, batch.bid, time.time())  # (as another block of it, begun closing)
        assert delivery.sweep_closing(rb, K, 60, later) == 0
        assert r.zscore(K.batch_closing, batch.bid)  # (this block is open: kept)
    assert r.zcard(K.batch_closing) == 0  # (our close delivered and forgot it: the score is its own)
    delivery.closing(rb, K, "gone", time.time())
    delivery.sweep_closing(rb, K, 60, later)
    assert r.zcard(K.batch_closing) == 0


def test_a_batch_closing_of_the_wrong_type_is_moved_aside_and_the_block_closes_firing_its_callbacks(r, rb, caplog):
    # (The block's close failed at its first write: the batch stayed open for ever, its jobs ran,
    # and its callbacks never fired. The key guard's round moved the key aside, too late for it.)
    r.set(K.batch_closing, "not a zset")
    batch = Batch(callback_queue="callbacks")
    batch.on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with caplog.at_level(logging.WARNING):
        with batch.jobs():
            pass
    assert Batch.status(batch.bid).success and callback_classes(r) == [BatchCallbackJob.name] * 2
    assert r.type(K.batch_closing) in ("none", "zset") and r.zcard(K.batch_closing) == 0
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.batch_closing}:*"))) == 1
    assert [rec.name for rec in caplog.records] == ["django_cogworker.broker.quarantine"]
    r.set(K.batch_closing, "not a zset")
    assert delivery.sweep_closing(rb, K, 60, time.time()) == 0  # (the workers' sweep moves it aside too)
    assert r.type(K.batch_closing) == "none"


