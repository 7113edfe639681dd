"""The worker's batch step (django_cogworker/features/batches/steps.py) and the delivery of what it fired
(features/batches/delivery.py), cut at each point where a process can die, one point at a time.

A job of a batch settles its step (BATCH_SETTLE: the counters move and the callbacks it fired go
onto the batch's outbox, in one script), then delivers the outbox (per callback: BATCH_DELIVER,
which pushes it unless its mark is set, then an LREM off the outbox), then is acked. A process
killed between any two of these has the job recovered and run again: its step moves nothing
twice, and delivers what the first left. Here the process "dies" at a chosen call (its client
raises there, as a killed process never gets past it), and the job's step is run again, as after
orphan recovery: each callback must be on its queue exactly once. (test_batch_chaos.py kills
real workers at random moments; these are the moments, each on purpose.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import steps
from django_cogworker.push import runtime
from testproject.demo.jobs import BatchCallbackJob, BatchMemberJob

K = Keys()
RECORD = json.dumps({"class": BatchMemberJob.name, "error": "RuntimeError", "message": "failing", "at": 0})
# Where the first run of the last job's step dies: (the call it never gets past, and which of
# them), with what is then left on the outbox and already on the callbacks' queue.
CRASHES = {
    "after its script": (("lrange", 1), 2, 0),
    "after the first delivery, before its LREM": (("lrem", 1), 2, 1),
    "after the last delivery, before its LREM": (("lrem", 2), 1, 2),
    "after its step and deliveries, before the ack": (None, 0, 2),
}


class Killed(BaseException):
    """The process dies here (a BaseException: no outage handling on the way may take it for one)."""


class DiesAt:
    """A client whose process dies at the ``n``-th call of ``method``: that call never reaches Redis."""

    def __init__(self, client: Any, method: str, n: int):
        self._client, self._method, self._left = client, method, n

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != self._method:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._left -= 1
            if self._left == 0:
                raise Killed(f"killed before {name}")
            return attr(*args, **kwargs)

        return call


def settle(client: Any, bid: str, jid: str, outcome: str) -> None:
    steps.settle(client, K, bid, jid, outcome, "" if outcome == "success" else RECORD,
                 runtime.get_config().batch_ttl)


def callbacks_queued(rb) -> list[tuple[str, str]]:
    """(event, jid) of each callback on the callbacks' queue, every copy."""
    payloads = [json.loads(raw) for raw in rb.lrange(K.queue("default"), 0, -1)]
    return sorted((p["args"][0]["event"], p["jid"]) for p in payloads)


def batch_of_two(rb) -> tuple[str, list[str]]:
    """A batch of two jobs with a callback on each event; its jobs taken off their queue (never
    run here: their steps are settled by hand), so that the queue holds only callbacks."""
    batch = Batch("two")
    for event in ("complete", "success", "death"):
        batch.on(event, BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [BatchMemberJob.perform_async("m") for _ in range(2)]
    rb.delete(K.queue("default"))
    assert batch.bid is not None
    return batch.bid, jids


@pytest.mark.parametrize("outcome", ["success", "dead"])
@pytest.mark.parametrize("crash", list(CRASHES))
def test_the_last_job_s_step_run_again_after_a_kill_pushes_each_callback_exactly_once(rb, crash, outcome):
    bid, (first, last) = batch_of_two(rb)
    outbox = K.batch(bid).outbox
    settle(rb, bid, first, "success")
    assert callbacks_queued(rb) == [] and rb.llen(outbox) == 0  # (the other job still pending: nothing fires)
    dies_at, left, pushed = CRASHES[crash]
    if dies_at is None:
        settle(rb, bid, last, outcome)
    else:
        with pytest.raises(Killed):
            settle(DiesAt(rb, *dies_at), bid, last, outcome)
    assert (rb.llen(outbox), len(callbacks_queued(rb))) == (left, pushed)
    settle(rb, bid, last, outcome)  # the job, recovered and run again
    settle(rb, bid, last, outcome)  # and again (killed before its ack once more)
    fired = ["complete", "success"] if outcome == "success" else ["complete", "death"]
    callbacks = Batch.status(bid).callbacks
    assert callbacks_queued(rb) == sorted((event, callbacks[event][0]) for event in fired)  # each once
    assert rb.llen(outbox) == 0
    status = Batch.status(bid)
    assert (status.pending, status.dead, status.complete, status.success) == (
        (0, 0, True, True) if outcome == "success" else (1, 1, True, False))


def test_two_processes_delivering_one_outbox_push_each_callback_once(rb):
    # The step that fired dies after its first delivery; another process delivers the same outbox
    # (a jobs() block closing on the batch does), then the job runs again: the marks keep it once.
    bid, (first, last) = batch_of_two(rb)
    settle(rb, bid, first, "success")
    with pytest.raises(Killed):
        settle(DiesAt(rb, "lrem", 1), bid, last, "success")
    steps.delivery.deliver(rb, K, bid, runtime.get_config().batch_ttl)
    settle(rb, bid, last, "success")
    assert [event for event, _ in callbacks_queued(rb)] == ["complete", "success"]
    assert rb.llen(K.batch(bid).outbox) == 0


# -- keys of the wrong type ------------------------------------------------------------------------


def quarantined(rb, key: str) -> list[bytes]:
    return list(rb.scan_iter(match=f"{K.quarantine_prefix}{key}:*"))


@pytest.mark.parametrize("together", [False, True], ids=["alone", "with other steps"])
def test_an_outbox_of_the_wrong_type_when_the_last_job_ends_loses_no_callback(rb, together):
    # (The success was stamped done, then its callbacks failed to reach the outbox: once the key was
    # cleared, the step run again found success done, and the callbacks were lost for good.)
    bid, (first, last) = batch_of_two(rb)
    outbox = K.batch(bid).outbox
    settle(rb, bid, first, "success")
    rb.set(outbox, "not a list")
    if together:  # (the fetcher's round: BATCH_SUCCEED for the steps held, in one pipeline)
        other, other_jids = batch_of_two(rb)
        steps.BatchSteps(rb, K, runtime.get_config().batch_ttl).run_many([
            steps.BatchStep(bid, last, "success", ""),
            steps.BatchStep(other, other_jids[0], "success", "")])
    else:
        settle(rb, bid, last, "success")
    settle(rb, bid, last, "success")  # (run again: nothing twice)
    callbacks = Batch.status(bid).callbacks
    assert callbacks_queued(rb) == sorted((event, callbacks[event][0]) for event in ("complete", "success"))
    assert len(quarantined(rb, outbox)) == 1 and rb.llen(outbox) == 0
    assert rb.hget(K.batch(bid).meta, "lost:outbox") is not None


@pytest.mark.parametrize("poisoned", ["queue", "mark"])
def test_a_callback_s_queue_or_mark_of_the_wrong_type_is_moved_aside_and_the_callback_pushed(rb, poisoned):
    # (The mark was set before the push: a queue of the wrong type stopped the delivery between
    # them, and the next one took the callback for delivered. A mark of the wrong type was taken
    # for one: the callback never pushed.)
    bid, (first, last) = batch_of_two(rb)
    settle(rb, bid, first, "success")
    callbacks = Batch.status(bid).callbacks
    key = K.queue("default") if poisoned == "queue" else K.batch_delivered("default", callbacks["success"][0])
    rb.hset(key, "x", "not mine")
    settle(rb, bid, last, "success")
    settle(rb, bid, last, "success")
    assert callbacks_queued(rb) == sorted((event, callbacks[event][0]) for event in ("complete", "success"))
    assert len(quarantined(rb, key)) == 1 and rb.llen(K.batch(bid).outbox) == 0
