"""The manager (engine/process/manager.py) through a real in-process Launcher: quiet, and stop's order of things.

Settling (acks, filings, pending settlements, the shutdown hand-off) is tested in test_settling.py.
"""

from __future__ import annotations

import collections

from engine_fixtures import (
    GATES,
    Hold,
    Note,
    fail_acks,
    fetch_mode_fixture,  # noqa: F401 - the fetch_mode fixture
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
    runs,
)
from helpers import wait_until
from peek import queued_jids

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.engine.settle.settlement import ACK, Settlement
from django_cogworker.push import payload as payloads

K = Keys()


def _fail_ack_of(running, monkeypatch, jid):
    """Make acknowledging ``jid`` fail as if Redis were away, for the rest of the test."""
    fail_acks(running.launcher.fetch, lambda raw: payloads.decode(raw)["jid"] == jid, monkeypatch)


def test_stop_requeues_a_running_job_to_the_head_of_its_queue_and_drops_pending_acks(launcher_factory, fetch_mode,
                                                                                     r, monkeypatch):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1, SHUTDOWN_TIMEOUT=0.3)
    _fail_ack_of(running, monkeypatch, "finished")
    running.client.push({"jid": "finished", "class": Note.name, "args": [token, "done"], "kwargs": {},
                         "queue": "default"})
    wait_until(lambda: list(running.manager.pending_settlements().values()) == [Settlement(ACK)])
    running.client.push({"jid": "long", "class": Hold.name, "args": [token], "kwargs": {}, "queue": "default"})
    wait_until(lambda: ("start", "long") in runs(token))
    for jid in ("waiting-1", "waiting-2"):
        running.client.push({"jid": jid, "class": Note.name, "args": [token], "kwargs": {}, "queue": "default"})

    assert running.stop() == 0

    assert queued_jids(r) == ["long", "waiting-1", "waiting-2"]  # the interrupted job runs next
    assert running.manager.pending_settlements() == {}
    assert r.llen(running.in_progress) == 0  # the pending ack was dropped, not requeued
    assert r.sismember(K.in_progress_identities, running.launcher.identity) == 0
    assert r.sismember(K.processes, running.launcher.identity) == 0
    assert runs(token) == [("finished", ["done"]), ("start", "long")]


def test_quiet_stops_fetching_and_lets_the_running_job_finish(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    held = running.push(Hold, token)
    wait_until(lambda: runs(token) == [("start", held["jid"])])

    running.launcher._signals_put("quiet")
    wait_until(lambda: running.manager.quiet)
    later = running.push(Note, token, "later")
    GATES[token].set()

    wait_until(lambda: ("end", held["jid"]) in runs(token))
    # The fetch loop ended at the quiet (a blocking fetch in flight then hands back what it got):
    # from here no job can be taken, so the one pushed after the quiet still waits.
    wait_until(lambda: not running.manager.fetcher.thread.is_alive(), timeout=15, message="the fetch ended")
    assert queued_jids(r) == [later["jid"]]
    assert len(runs(token)) == 2


def test_known_raws_counts_what_runs_what_is_pending_and_the_held_acks(redis_url, rb):
    # The reconcile requeues what is on the in-progress list and not in here: a job missing from it
    # would run twice.
    manager = Launcher(make_config(redis_url), rb).manager
    handed, pending, held = (payloads.encode({"jid": jid, "class": Note.name, "args": [], "queue": "default"}
                                             ).encode() for jid in ("handed", "pending", "held"))
    manager.ledger.hand([Unit(handed, "default"), Unit(handed, "default")])
    manager.settler.pend([(pending, Settlement(ACK))])
    manager.settlements.open()
    manager.settlements.put(held, Settlement(ACK))
    assert manager.known_raws() == collections.Counter({handed: 2, pending: 1, held: 1})
