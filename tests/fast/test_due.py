"""The due sweep (engine/schedule/due.py): due schedule and retry entries to their queues, poison to dead."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from engine_fixtures import (
    make_config,
)
from peek import queued_payloads
from poller_fixtures import (
    NOW,
    K,
    bclient_fixture,  # noqa: F401 - the bclient fixture (the poller fixture's)
    entry,
    make_poller,
    poller_fixture,  # noqa: F401 - the poller fixture
)

from django_cogworker.broker.connection import make_redis
from django_cogworker.engine.schedule import due
from django_cogworker.engine.schedule.due import BATCH


def test_due_entries_move_to_their_queues_and_the_rest_wait(poller, r):
    r.zadd(K.schedule, {entry("due-1", "mail", at=NOW - 5): NOW - 5, entry("due-2"): NOW,
                        entry("later"): NOW + 1})
    r.zadd(K.retry, {entry("retry-due", retry_count=0): NOW - 1, entry("retry-later"): NOW + 60})

    assert poller.enqueue_due() == 3

    assert [p["jid"] for p in queued_payloads(r, "mail")] == ["due-1"]
    assert [p["jid"] for p in queued_payloads(r)] == ["due-2", "retry-due"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.schedule, 0, -1)] == ["later"]
    assert [json.loads(e)["jid"] for e in r.zrange(K.retry, 0, -1)] == ["retry-later"]
    moved = queued_payloads(r, "mail")[0]
    assert moved["enqueued_at"] == NOW and "at" not in moved
    assert queued_payloads(r)[1]["retry_count"] == 0  # the failure record travels with the job
    assert r.smembers(K.queues) == {"mail", "default"}


def test_large_integers_in_args_survive_exactly(poller, r):
    args = [2 ** 63 + 1, 12345678901234567890123, -(2 ** 70), 0.1, "9007199254740993"]
    r.zadd(K.schedule, {entry("big", args=args): NOW - 1})
    r.zadd(K.retry, {entry("big-retry", args=args): NOW - 1})

    poller.enqueue_due()

    for moved in queued_payloads(r):
        assert moved["args"] == args
    assert "12345678901234567890123" in r.lindex(K.queue("default"), 0)


def test_an_entry_whose_queue_key_holds_the_wrong_type_stays_in_the_set(poller, r):
    r.set(K.queue("broken"), "not a list")
    stuck = entry("stuck", "broken")
    r.zadd(K.schedule, {stuck: NOW - 2, entry("fine"): NOW - 1})
    r.zadd(K.retry, {entry("stuck-retry", "broken"): NOW - 1})

    assert poller.enqueue_due() == 1

    # Push first, then remove: the failed push removed nothing.
    assert r.zrange(K.schedule, 0, -1, withscores=True) == [(stuck, NOW - 2)]
    assert r.zcard(K.retry) == 1
    assert [p["jid"] for p in queued_payloads(r)] == ["fine"]
    assert r.get(K.queue("broken")) == "not a list"


def test_a_full_batch_of_entries_that_cannot_be_moved_does_not_hold_up_those_behind_it(poller, r):
    r.set(K.queue("broken"), "not a list")
    r.zadd(K.schedule, {entry(f"stuck{i}", "broken"): NOW - 1000 + i for i in range(BATCH + 50)})
    r.zadd(K.schedule, {entry("behind", "default"): NOW - 1, entry("later"): NOW + 60})

    assert poller.enqueue_due() == 1

    assert [p["jid"] for p in queued_payloads(r)] == ["behind"]
    assert r.zcard(K.schedule) == BATCH + 51
    assert poller.next_due() == NOW + 60  # the peek: the first entry not yet due, not a stuck one


def test_a_schedule_set_of_the_wrong_type_does_not_hold_up_the_retries(poller, r):
    r.set(K.schedule, "not a zset")
    r.zadd(K.retry, {entry("retry-due"): NOW - 1})

    assert poller.enqueue_due() == 1

    assert [p["jid"] for p in queued_payloads(r)] == ["retry-due"]


@pytest.mark.parametrize(("raw", "reason"), [
    ("{this is not json", "unparseable payload"),
    ('["a", "list"]', "not an object"),
    ('{"jid": "x", "args": []}', "no job class"),
    ('{"jid": "x", "class": "x.Job", "args": []}', "names no queue"),
    # Python's json reads NaN, but can't write it back: the move used to raise on every round,
    # before any due entry after it.
    ('{"jid": "x", "class": "x.Job", "args": [NaN], "kwargs": {}, "queue": "default"}', "NaN"),
])
def test_an_unreadable_due_entry_goes_to_dead_with_its_text(poller, r, raw, reason):
    r.zadd(K.schedule, {raw: NOW - 1, entry("fine"): NOW - 1})

    poller.enqueue_due()

    assert r.zcard(K.schedule) == 0
    assert [p["jid"] for p in queued_payloads(r)] == ["fine"]
    (dead,) = [json.loads(d) for d in r.zrange(K.dead, 0, -1)]
    assert dead["class"] == "(unparseable)"
    assert dead["raw"] == raw
    assert reason in dead["error_message"]


def poison(jid, *, args="[1e309]", queue='"default"'):
    """A due entry that reads, but can't be written back as it is: 1e309 reads as inf, which JSON can't
    hold; a queue name that is a lone surrogate can't be sent to Redis."""
    return f'{{"jid":"{jid}","class":"x.Job","args":{args},"kwargs":{{}},"queue":{queue},"retry":true}}'


def test_poison_goes_to_dead_with_its_reason_and_the_entries_around_it_move_in_the_same_sweep(poller, r):
    # Once one such entry made the sweep raise, at every round: schedule is swept before retry, so
    # neither the entries after it nor any retry moved again, on any process.
    poisons = {}
    for key in (K.schedule, K.retry):
        poisons[poison(f"inf-{key}")] = "Out of range float values are not JSON compliant"
        poisons[poison(f"queue-{key}", args="[]", queue='"\\udce9"')] = "surrogates not allowed"
        r.zadd(key, {entry(f"before-{key}"): NOW - 3, **{raw: NOW - 2 for raw in poisons if key in raw},
                     entry(f"surrogate-{key}", args=["caf\udce9.bad"]): NOW - 2, entry(f"after-{key}"): NOW - 1})

    poller.enqueue_due()

    assert r.zcard(K.schedule) == r.zcard(K.retry) == 0
    moved = {p["jid"]: p for p in queued_payloads(r)}
    assert set(moved) == {f"{what}-{key}" for what in ("before", "surrogate", "after") for key in (K.schedule, K.retry)}
    # Not poison: a lone surrogate in the args is written escaped, and reads back the same.
    assert moved[f"surrogate-{K.retry}"]["args"] == ["caf\udce9.bad"]
    dead = {json.loads(d)["jid"]: d for d in r.zrange(K.dead, 0, -1)}
    assert len(dead) == 4
    for raw, reason in poisons.items():
        kept = dead[json.loads(raw)["jid"]]
        assert kept.startswith(raw[:-1])  # as it was, byte for byte, with the reason appended
        assert reason in json.loads(kept)["dead_reason"]
        assert json.loads(kept)["failed_at"] == NOW


def test_entries_stuck_on_a_key_are_logged_once_a_minute_not_once_per_entry_and_sweep(poller, r, caplog):
    caplog.set_level(logging.DEBUG, logger="django_cogworker")
    r.set(K.queue("broken"), "not a list")
    r.zadd(K.schedule, {entry(f"stuck{i}", "broken"): NOW - 100 + i for i in range(50)})
    r.set(K.retry, "not a zset")

    for _ in range(20):
        poller.enqueue_due()

    # One line per stuck entry per sweep was 7,165 lines in 57 s.
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert any("could not move jid=stuck0 to queue 'broken'" in m and K.queue("broken") in m for m in errors)
    assert any(f"due entries of {K.retry} not moved" in m for m in errors)

    caplog.clear()
    # A minute on: the last reports made a minute older, not slept for (with STUCK_LOG_EVERY at
    # 0.2 s, one sweep of a loaded machine outlasted it and reported stuck37 a second time).
    stuck = poller.due._stuck_logged
    stuck.update({key: (last - due.STUCK_LOG_EVERY, quiet) for key, (last, quiet) in stuck.items()})
    poller.enqueue_due()
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert any(f"{50 * 20 - 1} more like it since the last report" in m for m in errors)


def test_more_than_a_batch_of_due_entries_all_move(poller, r):
    r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1000 + i for i in range(BATCH * 2 + 17)})

    assert poller.enqueue_due() == BATCH * 2 + 17

    assert [p["jid"] for p in queued_payloads(r)] == [f"j{i}" for i in range(BATCH * 2 + 17)]


def test_two_pollers_racing_move_each_entry_once(redis_url, r):
    clients = [make_redis(make_config(redis_url)) for _ in range(2)]
    try:
        pollers = [make_poller(redis_url, c) for c in clients]
        r.zadd(K.schedule, {entry(f"j{i}"): NOW - 1 for i in range(300)})
        start = threading.Barrier(2)

        def run(p):
            start.wait()
            p.enqueue_due()

        threads = [threading.Thread(target=run, args=(p,)) for p in pollers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()

    assert sorted(p["jid"] for p in queued_payloads(r)) == sorted(f"j{i}" for i in range(300))


def test_due_entries_move_even_while_the_queues_set_holds_the_wrong_type(poller, r):
    # Registering the queue name is best-effort (the key guard moves the key aside later): a
    # `queues` key of the wrong type must not keep a due job from its queue.
    r.set(K.queues, "not a set")
    r.zadd(K.schedule, {entry("sched", "mail"): NOW - 1})
    r.zadd(K.retry, {entry("retried", retry_count=0): NOW - 1})

    assert poller.enqueue_due() == 2

    assert [p["jid"] for p in queued_payloads(r, "mail")] == ["sched"]
    assert [p["jid"] for p in queued_payloads(r)] == ["retried"]
    assert r.zcard(K.schedule) == 0 and r.zcard(K.retry) == 0
    assert r.get(K.queues) == "not a set"  # left to the key guard

