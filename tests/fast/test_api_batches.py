"""api.BatchSet and its reads (django_cogworker/features/batches/api/): the listing newest first and its
pruning of expired batches, one batch's jobs where they are now, its children and its callbacks,
and the bounds, against the suite's Redis.

Batches are made with the real API (``Batch``, ``with batch.jobs(): RecordJob.perform_async``).
A job's outcome comes either from a real worker (``helpers.Worker``, said in the test) or from its
batch step run here as a worker's settlement runs it (``step``: ``BatchSteps.run`` of the
``step_for`` the processor builds), without running the job itself.
"""

from __future__ import annotations

import pytest
from helpers import wait_until

from django_cogworker import Batch, api
from django_cogworker.api import _base
from django_cogworker.broker.keys import Keys, for_config
from django_cogworker.features.batches import api as api_batches
from django_cogworker.features.batches.api import detail as batch_detail
from django_cogworker.features.batches.steps import BatchSteps, settle, step_for
from django_cogworker.push import runtime
from testproject.demo.jobs import BatchCallbackJob, RecordJob

K = Keys()
RECORD_JOB = "testproject.demo.jobs.RecordJob"


def step(bid: str, jid: str, outcome: str, message: str = "") -> None:
    """The batch step of job ``jid`` settling with ``outcome``, as a worker's settlement runs it."""
    exc = ValueError(message) if outcome != "success" else None
    config = runtime.get_config()
    steps = BatchSteps(runtime.get_redis(), for_config(config), config.batch_ttl)
    steps.run(step_for({"bid": bid, "jid": jid, "class": RECORD_JOB}, outcome, exc=exc))


def made(description: str, count: int, **callbacks) -> tuple[Batch, list[str]]:
    """A batch of ``count`` RecordJobs (pushed, never run), with callbacks {event: job class}."""
    batch = Batch(description)
    for event, job_class in callbacks.items():
        batch.on(event, job_class, **({"key": "cb"} if job_class is BatchCallbackJob else {}))
    with batch.jobs():
        jids = [RecordJob.perform_async("seen", n) for n in range(count)]
    return batch, jids


def wait_expired(*batches: Batch, rb) -> None:
    wait_until(lambda: not any(rb.exists(K.batch(b.bid).meta) for b in batches), timeout=5,
               message="the batches' data expired")


def test_a_page_lists_the_newest_first_with_their_counts_and_state(rb):
    done, done_jids = made("all done", 2)
    for jid in done_jids:
        step(done.bid, jid, "success")
    broken, broken_jids = made("one died", 3)
    step(broken.bid, broken_jids[0], "dead", "no such customer")
    step(broken.bid, broken_jids[1], "failure", "timeout")
    step(broken.bid, broken_jids[2], "success")
    running, _ = made("running", 4)

    page = api.BatchSet().page(1, 25)
    assert [row.bid for row in page.items] == [running.bid, broken.bid, done.bid]
    assert page.total == 3
    rows = {row.bid: row for row in page.items}
    assert (rows[done.bid].state, rows[done.bid].succeeded, rows[done.bid].total) == ("succeeded", 2, 2)
    b = rows[broken.bid]
    assert (b.state, b.total, b.pending, b.failures, b.dead, b.death, b.committed) == (
        "complete_with_failures", 3, 2, 2, 1, True, True)
    assert b.bar == [("succeeded", 33.3, 1), ("failing", 33.3, 1), ("dead", 33.3, 1)]
    assert (rows[running.bid].state, rows[running.bid].waiting, rows[running.bid].description) == (
        "incomplete", 4, "running")
    second = api.BatchSet().page(2, 2)
    assert [row.bid for row in second.items] == [done.bid] and second.pages == 2


def test_expired_batches_are_taken_off_the_listing_as_it_is_read(rb):
    gone = [Batch(f"short {n}", ttl=1) for n in range(2)]
    for batch in gone:
        with batch.jobs():
            RecordJob.perform_async("seen")
    live, _ = made("kept", 1)
    wait_expired(*gone, rb=rb)
    assert rb.zcard(K.batches) == 3  # (nothing takes a bid off the listing when its data expires)
    page = api.BatchSet().page()
    assert [row.bid for row in page.items] == [live.bid] and page.total == 1
    assert rb.zrange(K.batches, 0, -1) == [live.bid.encode()]
    assert api.BatchSet().get(gone[0].bid) is None


def test_prune_takes_off_the_oldest_expired_batches_and_no_live_one(rb, monkeypatch):
    monkeypatch.setattr(api_batches, "PRUNE_CHUNK", 2)
    gone = [Batch(f"short {n}", ttl=1) for n in range(3)]
    for batch in gone:
        with batch.jobs():
            pass
    live = [made(f"kept {n}", 1)[0] for n in range(3)]
    wait_expired(*gone, rb=rb)
    batches = api.BatchSet()
    assert batches.prune() == 3  # (two chunks held expired ones; the third, none: it stops there)
    assert sorted(rb.zrange(K.batches, 0, -1)) == sorted(b.bid.encode() for b in live)
    assert batches.prune() == 0 and batches.size() == 3


def test_a_detail_lists_each_job_where_it_is_the_dead_and_failing_first_with_their_errors(rb):
    batch, jids = made("import 42", 6, complete=BatchCallbackJob, success=BatchCallbackJob,
                       death=BatchCallbackJob)
    step(batch.bid, jids[0], "success")
    step(batch.bid, jids[1], "success")
    step(batch.bid, jids[2], "failure", "timeout talking to the bank")
    step(batch.bid, jids[3], "dead", "no such customer")

    detail = api.BatchSet().get(batch.bid)
    assert detail is not None and detail.complete
    assert [(job.jid, job.state) for job in detail.jobs[:2]] == [(jids[3], "dead"), (jids[2], "failing")]
    assert sorted(job.jid for job in detail.jobs[2:4]) == sorted(jids[4:]) and {
        job.state for job in detail.jobs[2:4]} == {"waiting"}
    assert sorted(job.jid for job in detail.jobs[4:]) == sorted(jids[:2]) and {
        job.state for job in detail.jobs[4:]} == {"succeeded"}
    dead = detail.jobs[0].failure
    assert (dead["class"], dead["error"], dead["message"]) == (RECORD_JOB, "ValueError", "no such customer")
    assert detail.tally() == [("dead", 1, 1), ("failing", 1, 1), ("waiting", 2, 2), ("succeeded", 2, 2)]
    callbacks = {cb.event: cb for cb in detail.callbacks}
    assert (callbacks["complete"].state, callbacks["success"].state) == ("not fired", "not fired")
    death = callbacks["death"]
    assert (death.state, death.job_class, death.queue, death.options) == (
        "pushed", "testproject.demo.jobs.BatchCallbackJob", "default", {"key": "cb"})
    # Looked for in retry and dead, and not there: it waits in its queue (where it is).
    assert death.looked and death.where is None and death.fired_at == detail.summary.died_at
    assert any(death.jid.encode() in raw for raw in rb.lrange(K.queue("default"), 0, -1))


def test_a_detail_is_bounded_and_says_how_many_it_does_not_list(rb, monkeypatch):
    monkeypatch.setattr(batch_detail, "JOB_LIMIT", 5)
    batch = Batch("big")
    with batch.jobs():
        jids = RecordJob.perform_bulk([["seen", n] for n in range(300)])
    for jid in jids[:3]:
        step(batch.bid, jid, "dead", "gone")
    for jid in jids[3:10]:
        step(batch.bid, jid, "failure", "later")
    for jid in jids[10:20]:
        step(batch.bid, jid, "success")
    detail = api.BatchSet().get(batch.bid)
    assert [job.state for job in detail.jobs] == ["dead"] * 3 + ["failing"] * 2
    assert detail.tally() == [("dead", 3, 3), ("failing", 7, 2), ("waiting", 280, 0), ("succeeded", 10, 0)]
    # A walk of the batch's members stops at MEMBER_SCAN_LIMIT, and says so; the counts stay exact.
    monkeypatch.setattr(batch_detail, "JOB_LIMIT", 500)
    monkeypatch.setattr(_base, "SCAN_COUNT", 10)
    monkeypatch.setattr(batch_detail, "MEMBER_SCAN_LIMIT", 20)
    detail = api.BatchSet().get(batch.bid)
    assert not detail.complete and len(detail.jobs) < 300
    assert detail.tally()[2][:2] == ("waiting", 280) and detail.summary.total == 300


def test_child_batches_are_listed_with_their_progress_and_their_parent(rb):
    parent = Batch("parent")
    with parent.jobs():
        RecordJob.perform_async("seen")
        child = Batch("child")
        with child.jobs():
            (child_jid,) = [RecordJob.perform_async("seen", 1)]
    step(child.bid, child_jid, "success")
    detail = api.BatchSet().get(parent.bid)
    ((bid, summary),) = detail.children
    assert bid == child.bid and summary.parent == parent.bid and summary.state == "succeeded"
    (member,) = [job for job in detail.jobs if job.child]
    assert member.child == child.bid
    assert api.BatchSet().get(child.bid).summary.parent == parent.bid
    assert {row.bid for row in api.BatchSet().page().items} == {parent.bid, child.bid}


def test_an_unknown_or_expired_batch_reads_as_none_even_after_a_late_step(rb):
    assert api.BatchSet().get("no-such-bid") is None
    batch = Batch("short", ttl=1)
    with batch.jobs():
        jid = RecordJob.perform_async("seen")
    wait_expired(batch, rb=rb)
    # A job of it that keeps a result settles after the expiry: its step finds the batch gone and
    # writes nothing (no meta hash made again with the result alone).
    config = runtime.get_config()
    settle(runtime.get_redis(), for_config(config), batch.bid, jid, "success", '"a result"', 60)
    assert not rb.exists(*K.batch(batch.bid))
    assert api.BatchSet().get(batch.bid) is None
    assert api.BatchSet().page().items == []


def test_states_count_the_newest_batches_by_state(rb):
    done, jids = made("done", 1)
    step(done.bid, jids[0], "success")
    failed, jids = made("failed", 1)
    step(failed.bid, jids[0], "failure", "boom")
    made("running", 1)
    assert api.BatchSet().states() == {"incomplete": 1, "complete_with_failures": 1, "succeeded": 1}
    assert api.BatchSet().states(limit=2) == {"incomplete": 1, "complete_with_failures": 1, "succeeded": 0}


@pytest.mark.parametrize("limit", [1, 3])
def test_page_reads_are_clamped_like_every_listing(rb, limit):
    for n in range(3):
        made(f"b{n}", 0)
    page = api.BatchSet().page(99, limit)
    assert page.items == [] and page.total == 3 and page.per_page == limit
    assert len(api.BatchSet().page(1, 10_000).items) == 3 and api.BatchSet().page(1, 10_000).per_page == 100
