"""The ledger (engine/fetch/ledger.py): this process's record of the jobs handed over and running.

No Redis here: the ledger is memory only, trusted over Redis on purpose.
"""

from __future__ import annotations

import collections
import json
import threading

from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.fetch.ledger import Ledger
from django_cogworker.push import payload as payloads


def unit(jid="j1", queue="default"):
    return Unit(payloads.encode({"jid": jid, "class": "x.Job", "args": [], "queue": queue}).encode(), queue)


def test_a_job_is_held_from_hand_over_to_finish_and_counted_once():
    ledger, u = Ledger(), unit()
    ledger.hand([u])
    assert ledger.held() == collections.Counter({u.raw: 1}) and ledger.busy == 0
    ledger.job_started(u, json.loads(u.raw))
    assert ledger.held() == collections.Counter({u.raw: 1})  # no longer handed, running now
    assert ledger.busy == 1 and ledger.running_jobs() == [u.raw]
    ledger.job_finished(u)
    assert ledger.held() == collections.Counter() and ledger.busy == 0 and ledger.running_jobs() == []


def test_two_copies_of_one_payload_are_counted_as_two():
    ledger, u = Ledger(), unit()
    ledger.hand([u, u])
    ledger.job_started(u, json.loads(u.raw))
    assert ledger.held() == collections.Counter({u.raw: 2})
    ledger.unit_dropped(u)  # the other copy never started
    assert ledger.held() == collections.Counter({u.raw: 1})
    assert ledger.running_jobs() == [u.raw]


def test_units_taken_back_at_stop_are_forgotten():
    ledger, a, b = Ledger(), unit("a"), unit("b")
    ledger.hand([a, b, b])
    ledger.forget_unstarted([a, b])
    assert ledger.held() == collections.Counter({b.raw: 1})


def test_the_workers_snapshot_names_each_running_thread_and_what_it_runs():
    ledger, u = Ledger(), unit(queue="mail")
    started = threading.Event()
    done = threading.Event()

    def run():
        ledger.job_started(u, json.loads(u.raw))
        threading.current_thread().name = "renamed-by-the-job"  # (the record is by ident, not name)
        started.set()
        done.wait(5)
        ledger.job_finished(u)

    thread = threading.Thread(target=run, name="cogworker-processor-3")
    thread.start()
    try:
        started.wait(5)
        ((name, entry),) = ledger.workers_snapshot().items()
        assert name == "cogworker-processor-3"
        assert json.loads(entry)["queue"] == "mail" and json.loads(entry)["payload"] == u.raw.decode()
    finally:
        done.set()
        thread.join(5)
    assert ledger.workers_snapshot() == {} and ledger.busy == 0
