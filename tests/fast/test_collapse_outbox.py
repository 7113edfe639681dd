"""Pushes that collapse (features/collapse/) with OUTBOX on: inside a transaction each is a row of it,
handed to the collapse writer at commit or by a relay (outbox/pushing.py), with the outbox's mark, so
a row relayed again after its hand-over writes nothing; outside one, a push Redis refuses is saved
for the relay. The outbox's own tests are in test_outbox.py; collapse's in test_collapse.py."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from django.db import transaction
from helpers import in_thread
from outbox_fixtures import Boom, alias_fixture, away_fixture, outbox_fixture, relay, rows  # noqa: F401 - fixtures

from django_cogworker import Job
from django_cogworker.broker.keys import Keys
from django_cogworker.outbox.models import OutboxJob

K = Keys()
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])


class Debounced(Job):
    debounce = 30

    def perform(self, token: str, n: int) -> None: ...


class Throttled(Job):
    throttle = 30

    def perform(self, token: str, n: int) -> None: ...


def scheduled(client) -> list[dict]:
    return [json.loads(raw) for raw in client.zrange(K.schedule, 0, -1)]


def test_a_debounced_push_in_a_transaction_is_a_row_until_commit_then_collapses(outbox, alias, rb):
    token = uuid.uuid4().hex
    with pytest.raises(Boom), transaction.atomic(using=alias):
        Debounced.set(dedup_key=token).perform_async(token, 0)
        raise Boom
    assert rb.zcard(K.schedule) == 0 and not rb.keys(K.collapse("*"))  # (rolled back: nothing in Redis)
    with transaction.atomic(using=alias):
        first = Debounced.set(dedup_key=token).push(token, 1)
        last = Debounced.set(dedup_key=token).push(token, 2)
        assert (first.status, last.status) == ("deferred", "deferred")
        assert rows(alias) == [first.jid, last.jid] and rb.zcard(K.schedule) == 0
    [job] = scheduled(rb)  # (handed to the collapse writer at commit: the last replaced the first)
    assert job["jid"] == last.jid and job["args"] == [token, 2]
    assert rows(alias) == []


def test_a_debounced_bulk_in_a_transaction_returns_each_items_own_jid_and_the_last_runs(outbox, alias, rb):
    """Inside a transaction what a push comes to is decided at the commit (or by a relay): each item
    of a bulk returns its own jid, as each perform_async there does (docs/fairness.md says so);
    at the commit the last replaces the first, as outside one."""
    token = uuid.uuid4().hex
    with transaction.atomic(using=alias):
        jids = Debounced.set(dedup_key=token).perform_bulk([(token, 1), (token, 2)])
        assert len(set(jids)) == 2 and rows(alias) == jids
    [job] = scheduled(rb)
    assert job["jid"] == jids[-1] and job["args"] == [token, 2]


def test_a_row_relayed_again_after_its_hand_over_writes_nothing(outbox, alias, rb, caplog):
    """A row left after its hand-over (its pusher killed before the delete) is relayed again: its
    mark says it was handed over, so it neither replaces the later push's job nor runs twice."""
    token = uuid.uuid4().hex
    with transaction.atomic(using=alias):
        first = Debounced.set(dedup_key=token).perform_async(token, 1)
    [raw] = rb.zrange(K.schedule, 0, -1)
    later = Debounced.set(dedup_key=token).push(token, 2)
    assert later.status == "replaced"
    left = dict(json.loads(raw))
    OutboxJob.objects.using(alias).create(jid=first, payload=json.dumps(left), created=0)
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        assert in_thread(lambda: relay(alias)) == 1
    assert "handed to Redis before" in caplog.text
    [job] = scheduled(rb)
    assert job["jid"] == later.jid and job["args"] == [token, 2] and rows(alias) == []
    assert rb.llen(K.queue("default")) == 0  # (nor pushed to its queue as a plain job)


def test_outside_a_transaction_a_collapsing_push_redis_refuses_is_saved_for_the_relay(away):
    token = uuid.uuid4().hex
    away.kill()
    outcome = Throttled.set(dedup_key=token).push(token, 1)  # (no ConnectionError)
    assert outcome.status == "deferred" and rows("default") == [outcome.jid]
    away.restart()
    assert relay("default") == 1
    client = away.client()
    assert [json.loads(raw)["jid"] for raw in client.lrange(K.queue("default"), 0, -1)] == [outcome.jid]
    assert Throttled.set(dedup_key=token).push(token, 2) == ("dropped", outcome.jid, None)


def test_outside_a_transaction_a_collapsing_bulk_redis_refuses_is_saved_and_collapses_at_the_relay(away, caplog):
    token = uuid.uuid4().hex
    away.kill()
    jids = Throttled.set(dedup_key=token).perform_bulk([(token, 1), (token, 2)])  # (no ConnectionError)
    assert len(jids) == 2 and rows("default") == jids
    away.restart()
    with caplog.at_level(logging.WARNING, logger="django_cogworker"):
        relay("default")
    client = away.client()
    assert [json.loads(raw)["jid"] for raw in client.lrange(K.queue("default"), 0, -1)] == [jids[0]]
    assert rows("default") == [] and "handed to Redis before" not in caplog.text  # (a drop, not a re-relay)
