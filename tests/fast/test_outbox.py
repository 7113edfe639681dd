"""The transactional outbox, push side and relay, on SQLite and PostgreSQL ("pg"), in this process.

With OUTBOX on, a push inside a transaction is a row of it: handed to Redis at commit, kept when
Redis is away, relayed later exactly once; a rollback leaves nothing. The real-worker tests
(worker relays, kill -9, racing relays) are in test_outbox_workers.py.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time

import pytest
import redis
from django.db import OperationalError, connections, transaction
from helpers import in_thread
from outbox_fixtures import Boom, alias_fixture, away_fixture, outbox_fixture, relay, rows, stopped  # noqa: F401 - fixtures
from peek import queued_jids

from django_cogworker import Batch, BatchError, Job, chain, group
from django_cogworker.broker.keys import Keys
from django_cogworker.features.batches import batch as batch_module
from django_cogworker.outbox.models import OutboxJob
from django_cogworker.outbox.relay import relay_once
from django_cogworker.push import runtime

K = Keys()
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])


class Note(Job):
    def perform(self, *args):
        pass


class UniqueNote(Job):
    unique_for = 60

    def perform(self, *args):
        pass


def test_a_push_inside_a_transaction_is_a_row_until_commit_then_a_job(outbox, alias, rb):
    with transaction.atomic(using=alias):
        jid = Note.perform_async(1)
        scheduled = Note.perform_in(60, 2)
        assert rows(alias) == [jid, scheduled]
        assert rb.dbsize() == 0
    assert queued_jids(rb) == [jid]
    assert [json.loads(raw)["jid"] for raw in rb.zrange(K.schedule, 0, -1)] == [scheduled]
    assert rows(alias) == []


def test_a_rolled_back_transaction_leaves_no_row_and_no_job(outbox, alias, rb):
    with pytest.raises(Boom), transaction.atomic(using=alias):
        Note.perform_async(1)
        Note.perform_bulk([(2,), (3,)])
        raise Boom
    with transaction.atomic(using=alias):
        with pytest.raises(Boom), transaction.atomic(using=alias):
            Note.perform_async("savepoint")
            raise Boom
        kept = Note.perform_async("kept")
    assert rows(alias) == []
    assert queued_jids(rb) == [kept]


def test_a_bulk_push_is_one_row_and_one_push_at_commit(outbox, alias, rb):
    with transaction.atomic(using=alias):
        jids = Note.perform_bulk([(i,) for i in range(1000)])
        assert OutboxJob.objects.using(alias).count() == 1
        assert rows(alias) == jids
    assert queued_jids(rb) == jids
    assert rows(alias) == []


def test_redis_away_at_commit_commits_and_the_rows_wait_for_the_relay(away, alias, caplog):
    with transaction.atomic(using=alias):
        jids = [Note.perform_async(1), *Note.perform_bulk([(2,), (3,)])]
        away.kill()
    # (The commit went through, and said what happened to the jobs.)
    assert rows(alias) == jids
    assert "wait in the outbox" in caplog.text
    away.restart()
    assert relay(alias) == 3
    assert queued_jids(away.client()) == jids
    assert rows(alias) == []


def test_a_commit_that_finds_redis_stopped_waits_for_it_once_and_leaves_every_row_to_the_relay(away, alias, caplog):
    """Redis stopped (SIGSTOP), not refusing: a hand-over waits out its socket timeout. The first to
    fail leaves the commit's other rows to the relay, untried, in one line with the count. Each was
    tried in turn (five pushes held the commit 50 s), each with a line of its own."""
    warm = Note.perform_async("warm-up")  # (a connection made: the commit's pushes wait for a reply)
    with caplog.at_level(logging.WARNING, logger="django_cogworker"), stopped(away):
        with transaction.atomic(using=alias):  # (its pushes are rows: nothing reaches Redis before the commit)
            jids = [Note.perform_async(i) for i in range(4)] + Note.perform_bulk([(4,), (5,)])
            with Batch("a block").jobs():
                jids.append(Note.perform_async("in a batch"))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert "6 row(s), 6 job(s) and 1 batch block(s), wait in the outbox of database" in lines[0]
    assert "Timeout" in lines[0]
    assert OutboxJob.objects.using(alias).count() == 6
    assert relay(alias) == 7  # (Redis woken: the relay takes them, each once)
    assert sorted(queued_jids(away.client())) == sorted([warm, *jids])
    assert rows(alias) == []


def test_a_commit_that_finds_redis_refusing_says_so_in_one_line_for_all_its_rows(away, alias, caplog):
    """Redis refusing (killed), not stopped: each row's hand-over tried Redis in turn and wrote a
    WARNING of its own (2,000 pushes in one transaction, 2,000 lines). The first refusal leaves the
    rest to the relay, in one line counting them."""
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        with transaction.atomic(using=alias):
            jids = [Note.perform_async(i) for i in range(300)]
            away.kill()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines[:3]
    assert "ConnectionError" in lines[0]
    assert f"300 row(s), 300 job(s), wait in the outbox of database {alias!r}" in lines[0]
    assert rows(alias) == jids
    away.restart()
    assert relay(alias) == 300  # (each once)
    assert queued_jids(away.client()) == jids


def test_outside_a_transaction_a_push_redis_refuses_is_saved_to_the_outbox(away, rb):
    away.kill()
    jid = Note.perform_async(1)  # (no ConnectionError)
    jids = Note.perform_bulk([(2,), (3,)])
    assert rows("default") == [jid, *jids]
    away.restart()
    assert relay("default") == 3
    assert queued_jids(away.client()) == [jid, *jids]


def test_a_push_neither_redis_nor_the_database_takes_raises(away):
    away.kill()

    def refuse(execute, sql, params, many, context):
        if "cogworker_outbox" in sql:
            raise OperationalError("the database refuses too")
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(refuse), pytest.raises(redis.ConnectionError) as caught:
        Note.perform_async(1)
    assert isinstance(caught.value.__cause__, OperationalError)
    assert rows("default") == []


def test_a_row_pushed_but_not_deleted_is_not_pushed_again(outbox, alias, rb, caplog):
    # What a process killed between its push and its delete leaves: a row whose job is in Redis.
    with transaction.atomic(using=alias):
        jid = Note.perform_async(1)
    OutboxJob.objects.using(alias).create(jid=jid, payload=json.dumps(
        {"class": Note.name, "jid": jid, "queue": "default", "args": [1], "kwargs": {}}), created=0)
    with caplog.at_level(logging.INFO, logger="django_cogworker"):
        # (From another thread: another pusher, as a relay is, whose receipt knows nothing of it.)
        assert in_thread(lambda: relay(alias)) == 1
    assert queued_jids(rb) == [jid]
    assert rows(alias) == []
    assert "handed to Redis before" in caplog.text


def test_garbage_and_wrong_type_rows_go_to_dead_and_the_rows_behind_them_are_pushed(outbox, alias, rb):
    with transaction.atomic(using=alias):
        OutboxJob.objects.using(alias).create(jid="garbage", payload="{not json", created=0)
        OutboxJob.objects.using(alias).create(jid="wrongtype", created=0, payload=json.dumps(
            {"class": Note.name, "jid": "wrongtype", "queue": "blocked", "args": [], "kwargs": {}}))
        OutboxJob.objects.using(alias).create(jid="noqueue", created=0, payload=json.dumps(
            {"class": Note.name, "jid": "noqueue", "args": [], "kwargs": {}}))
        rb.set(K.queue("blocked"), "a string, not a list")
    behind = Note.perform_async("behind")  # (outside: pushed at once; the relay must not block it either)
    with transaction.atomic(using=alias):
        OutboxJob.objects.using(alias).create(jid="late", created=0, payload=json.dumps(
            {"class": Note.name, "jid": "late", "queue": "default", "args": [], "kwargs": {}}))
    assert relay(alias) == 4
    assert queued_jids(rb) == [behind, "late"]
    dead = {json.loads(raw).get("dead_reason", ""): json.loads(raw) for raw in rb.zrange(K.dead, 0, -1)}
    assert len(dead) == 3
    reasons = " | ".join(dead)
    assert "jid garbage" in reasons and "unparseable" in reasons
    assert "jid wrongtype" in reasons and "holds the wrong type" in reasons
    assert "jid noqueue" in reasons and "queue" in reasons
    assert rows(alias) == []


def test_a_job_of_a_row_of_several_that_cant_be_pushed_goes_to_dead_and_the_others_are_pushed(outbox, alias, rb):
    jobs = [{"class": Note.name, "jid": jid, "queue": queue, "args": [i]}
            for i, (jid, queue) in enumerate([("one", "default"), ("stuck", "blocked"), ("two", "default")])]
    with transaction.atomic(using=alias):
        OutboxJob.objects.using(alias).create(jid="one", jobs=3, created=0, payload=json.dumps(jobs))
    rb.set(K.queue("blocked"), "a string, not a list")
    assert relay(alias) == 3
    assert queued_jids(rb) == ["one", "two"]
    [dead] = [json.loads(raw) for raw in rb.zrange(K.dead, 0, -1)]
    assert dead["jid"] == "stuck" and "jid stuck" in dead["dead_reason"] and dead["args"] == [1]
    assert rows(alias) == []
    assert relay(alias) == 0 and queued_jids(rb) == ["one", "two"]  # (nothing pushed twice)


def test_a_row_of_several_jobs_that_isnt_an_array_of_jobs_goes_to_dead_whole(outbox, alias, rb):
    with transaction.atomic(using=alias):
        OutboxJob.objects.using(alias).create(jid="several", jobs=2, created=0, payload=json.dumps(
            [{"class": Note.name, "jid": "a", "queue": "default", "args": []}, {"no": "class"}]))
    assert relay(alias) == 2
    [dead] = [json.loads(raw) for raw in rb.zrange(K.dead, 0, -1)]
    assert "jid several" in dead["dead_reason"] and '"no"' in dead["raw"]  # (kept whole, as text)
    assert queued_jids(rb) == [] and rows(alias) == []


def test_a_mark_of_the_wrong_type_is_quarantined_and_the_job_pushed(away, alias, caplog):
    with transaction.atomic(using=alias):
        jid = Note.perform_async(1)
        away.kill()
    away.restart()
    client = away.client()
    client.lpush(K.outbox_marks(), "a list, not a mark")
    assert relay(alias) == 1
    assert queued_jids(client) == [jid]
    assert client.type(K.outbox_marks()) == b"zset"
    assert "is no outbox mark" in caplog.text


def test_a_unique_jobs_lock_is_taken_when_its_row_reaches_redis(away, alias, caplog):
    caplog.set_level(logging.INFO, logger="django_cogworker")
    with transaction.atomic(using=alias):
        first = UniqueNote.perform_async("same")
        away.kill()
    with transaction.atomic(using=alias):
        second = UniqueNote.perform_async("same")  # (no lock to find yet: both are rows)
    assert rows(alias) == [first, second]
    away.restart()
    assert relay(alias) == 2
    assert queued_jids(away.client()) == [first]
    assert "duplicate of unique job" in caplog.text
    assert rows(alias) == []


def test_a_push_in_a_transaction_of_another_database_is_a_row_of_that_database(outbox, rb):
    with transaction.atomic(using="pg"):
        jid = Note.perform_async(1)
        assert rows("pg") == [jid]
        assert rows("default") == []
    assert queued_jids(rb) == [jid]


def test_with_outbox_off_no_row_is_written(settings, alias, rb):
    with transaction.atomic(using=alias):
        jid = Note.perform_async(1)
    assert queued_jids(rb) == [jid]
    assert rows(alias) == []


def test_a_task_enqueued_in_a_transaction_is_a_row_and_its_ready_record_waits_for_commit(away, alias):
    from testproject.demo.tasks import add

    with pytest.raises(Boom), transaction.atomic(using=alias):
        add.enqueue(1, 2)
        raise Boom
    with transaction.atomic(using=alias):
        result = add.enqueue(1, 2)
        assert rows(alias) == [result.id]
        away.kill()
    assert rows(alias) == [result.id]  # (Redis away at commit: it waits, READY record or not)
    away.restart()
    client = away.client()
    assert not client.exists(K.result(result.id))
    assert relay(alias) == 1
    assert queued_jids(client) == [result.id]
    with transaction.atomic(using=alias):
        second = add.enqueue(3, 4)
    assert add.get_result(second.id).status == "READY"
    assert queued_jids(client) == [result.id, second.id]
    assert rows(alias) == []


def test_a_batch_and_a_workflow_in_a_rolled_back_transaction_write_nothing_to_redis(outbox, alias, rb):
    with pytest.raises(Boom), transaction.atomic(using=alias):
        batch = Batch("rolled back").on("complete", Note)
        with batch.jobs():
            Note.perform_async(1)
            Note.perform_bulk([(2,), (3,)])
        chain(Note.s(4), group(Note.s(5), Note.s(6))).perform_async()
        assert len(rows(alias)) == 2  # (one row per top-level block: the batch's, the workflow's)
        raise Boom
    assert rows(alias) == []
    assert rb.dbsize() == 0


def test_a_batch_committed_is_opened_counted_and_closed_at_commit(outbox, alias, rb):
    batch = Batch("committed")
    with transaction.atomic(using=alias):
        with batch.jobs():
            jids = [Note.perform_async(1), *Note.perform_bulk([(2,), (3,)]), Note.perform_in(60, 4)]
            with Batch("child").jobs():
                jids.append(Note.perform_async(5))
        assert rb.dbsize() == 0  # (nothing of it before the commit)
    assert sorted(queued_jids(rb)) == sorted(jids[:3] + jids[4:])
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.committed) == (5, 5, True)  # (4 jobs and the child)
    assert rows(alias) == []


def test_a_batch_whose_commit_found_redis_away_is_relayed_once_through_a_relay_stopped_mid_way(
        away, alias, monkeypatch):
    batch = Batch("away").on("complete", Note)
    with transaction.atomic(using=alias):
        with batch.jobs():
            jids = [Note.perform_async(1), *Note.perform_bulk([(2,), (3,)])]
        away.kill()
    saved = OutboxJob.objects.using(alias).get()
    away.restart()
    client = away.client()
    real_close = batch_module.close_block

    def dies(*args):  # (a relay killed after pushing the jobs, before closing the batch)
        raise redis.ConnectionError("killed")

    monkeypatch.setattr(batch_module, "close_block", dies)
    with pytest.raises(redis.ConnectionError):
        relay(alias)
    assert sorted(queued_jids(client)) == sorted(jids)
    assert not Batch.status(batch.bid).committed
    monkeypatch.setattr(batch_module, "close_block", real_close)
    assert relay(alias) == 1
    # The same row again (relayed, then found undeleted): its steps are done, nothing runs twice.
    OutboxJob.objects.using(alias).create(jid=saved.jid, payload=saved.payload, created=0)
    assert relay(alias) == 1
    assert sorted(queued_jids(client)) == sorted(jids)
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.committed) == (3, 3, True)
    assert rows(alias) == []


def test_a_job_of_a_batch_relayed_again_after_it_ran_is_not_counted_again(away, alias, monkeypatch):
    batch = Batch("ran")
    with transaction.atomic(using=alias):
        with batch.jobs():
            jid = Note.perform_async(1)
        away.kill()
    saved = OutboxJob.objects.using(alias).get()
    away.restart()
    client = away.client()
    real_close = batch_module.close_block

    def dies(*args):
        raise redis.ConnectionError("killed")

    monkeypatch.setattr(batch_module, "close_block", dies)
    with pytest.raises(redis.ConnectionError):
        relay(alias)
    # As a relay killed right after the push, before it noted the step done, leaves it; and the job ran.
    steps = [kind for kind, *_ in json.loads(saved.payload)["unit"]]
    client.set(K.outbox_pushed(saved.jid), steps.index("jobs"))
    assert client.lpop(K.queue("default")) is not None
    client.srem(K.batch(batch.bid).pending, jid)
    monkeypatch.setattr(batch_module, "close_block", real_close)
    assert relay(alias) == 1
    assert queued_jids(client) == []  # (written before, as its mark says)
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.committed) == (1, 0, True)
    assert status.complete and status.success


def test_a_second_block_on_a_batch_made_through_the_outbox_in_the_same_transaction_is_refused(outbox, alias, rb):
    batch = Batch("twice")
    with transaction.atomic(using=alias):
        with batch.jobs():
            first = Note.perform_async(1)
        with pytest.raises(BatchError, match="made by this transaction through the outbox"):
            with batch.jobs():
                Note.perform_async(2)
    assert queued_jids(rb) == [first]
    with batch.jobs():  # (after the commit: added at once, as to any batch)
        second = Note.perform_async(2)
    assert queued_jids(rb) == [first, second]
    assert Batch.status(batch.bid).total == 2


# -- rows no pusher of ours writes: each relayed, dead-lettered or said, never kept unseen nor lost --


def job_json(jid: str, *args, **extra) -> str:
    return json.dumps({"class": Note.name, "jid": jid, "queue": "default", "args": list(args), "kwargs": {}, **extra})


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_row_dated_ahead_of_this_hosts_clock_is_relayed_at_once_and_said(outbox, alias, rb, caplog):
    """Its pusher's clock 10 minutes ahead: the row waited those 10 minutes, unseen."""
    OutboxJob.objects.using(alias).create(jid="ahead", payload=job_json("ahead"), created=time.time() + 600)
    client = runtime.get_client()
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        assert relay_once(alias, client.hand_over, runtime.get_redis(), K, now=time.time()) == 1  # (the 5 s grace)
    assert queued_jids(rb) == ["ahead"] and rows(alias) == []
    assert re.search(r"row \d+ dated (599|600)s ahead of this host's clock", warnings_of(caplog))


def test_rows_dated_or_claimed_in_no_time_a_clock_gives_or_miscounted_are_relayed_and_said(outbox, rb, caplog):
    """PostgreSQL keeps NaN and Infinity in a float column: such a row never compared below now."""
    manager = OutboxJob.objects.using("pg")
    manager.create(jid="infinite", payload=job_json("infinite"), created=math.inf)
    manager.create(jid="nan-claim", payload=job_json("nan-claim"), created=0, claimed_until=math.nan,
                   claimed_by="nobody")
    manager.create(jid="miscounted", payload=job_json("miscounted"), created=0, jobs=1_000_000)
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        assert relay("pg") == 2  # (a round takes up to 500 jobs, as their rows count them)
        assert relay("pg") == 1
    assert sorted(queued_jids(rb)) == ["infinite", "miscounted", "nan-claim"]
    said = warnings_of(caplog)
    assert "whose dates or count no pusher writes, relayed now" in said
    assert "created inf" in said and "claimed until nan" in said
    assert "says it holds 1000000 job(s), holds 1" in said
    assert rows("pg") == []


def test_a_job_whose_at_is_no_time_goes_to_dead_with_the_reason(outbox, alias, rb):
    """``"at": 1e309`` reads as infinity: it was scheduled with the score inf, never due, never dead."""
    payload = job_json("never", 1)[:-1] + ', "at": 1e309}'
    with transaction.atomic(using=alias):
        OutboxJob.objects.using(alias).create(jid="never", payload=payload, created=0)
        OutboxJob.objects.using(alias).create(jid="fine", payload=job_json("fine"), created=0)
    assert relay(alias) == 2
    assert rb.zcard(K.schedule) == 0
    assert queued_jids(rb) == ["fine"]
    [dead] = [json.loads(raw) for raw in rb.zrange(K.dead, 0, -1)]
    assert dead["jid"] == "never" and dead["args"] == [1]
    assert "jid never" in dead["dead_reason"] and "is not a time" in dead["dead_reason"]


def test_a_row_holding_a_jid_already_used_is_pushed_once_sent_to_dead_or_said_never_lost_silently(
        outbox, alias, rb, caplog):
    manager = OutboxJob.objects.using(alias)
    with transaction.atomic(using=alias):
        copied = [manager.create(jid="same", payload=job_json("same", 1), created=0) for _ in range(2)]
        twins = [manager.create(jid="twin", payload=job_json("twin", n), created=0) for n in (1, 2)]
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        assert relay(alias) == 4
        # The same job twice: pushed once, the copy said. Another job under a used jid: to dead.
        assert queued_jids(rb) == ["same", "twin"]
        said = warnings_of(caplog)
        assert f"outbox rows {copied[0].pk} and {copied[1].pk} both hold job same" in said
        [dead] = [json.loads(raw) for raw in rb.zrange(K.dead, 0, -1)]
        assert dead["jid"] == "twin" and dead["args"] == [2]
        assert f"outbox row {twins[1].pk} (jid twin)" in dead["dead_reason"]
        assert f"also outbox row {twins[0].pk}'s job" in dead["dead_reason"]
        # A row holding a jid pushed in an earlier round, by this same relay: the pusher's receipt
        # took it for a retry of its last push and answered "written"; it vanished, nothing said.
        relay(alias)
        first = manager.create(jid="later", payload=job_json("later", 1), created=0)
        assert relay(alias) == 1
        second = manager.create(jid="later", payload=job_json("later", 2), created=0)
        assert relay(alias) == 1
    assert queued_jids(rb) == ["same", "twin", "later"]
    assert re.search(rf"1 job\(s\) of row\(s\) {second.pk} were handed to Redis before", warnings_of(caplog))
    assert str(first.pk) not in warnings_of(caplog).split("handed to Redis before")[0].rsplit("row(s)", 1)[-1]
    assert rows(alias) == []
