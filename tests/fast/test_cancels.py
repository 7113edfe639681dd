"""A worker's copy of the cancel requests (django_cogworker/engine/run/cancels.py), in process: what
``update`` takes from a beat's read of the ``cancels`` hash, what it tells the runs, and the
interrupt raised in a run's thread (and withdrawn once the run ended). No Redis: the hash's
contents are handed in as a beat reads them (bytes)."""

from __future__ import annotations

import json
import threading
import time

from django_cogworker.engine.run.cancels import REQUEST_TTL, Cancels
from django_cogworker.errors import Cancelled
from django_cogworker.push.scope import Running

NOW = 1_000_000.0


def request(at: float = NOW, interrupt: bool = False) -> bytes:
    return json.dumps({"at": at, "interrupt": interrupt}).encode()


def cancels() -> Cancels:
    return Cancels(clock=lambda: NOW)


def run_of(jid: str) -> Running:
    return Running({"jid": jid, "class": "x.Y", "args": []})


def test_update_marks_a_running_job_cancelled_and_leaves_the_others():
    c = cancels()
    asked, other = run_of("j1"), run_of("j2")
    c.started("j1", asked)
    c.started("j2", other)

    assert c.update({b"j1": request()}) == []

    assert (asked.cancelled, other.cancelled) == (True, False)
    assert c.requested("j1") and not c.requested("j2")


def test_a_run_started_after_its_request_is_cancelled_at_once():
    c = cancels()
    c.update({b"j1": request()})
    run = run_of("j1")
    c.started("j1", run)
    assert run.cancelled


def test_requested_follows_the_last_read_of_the_hash():
    c = cancels()
    assert not c.requested("j1")  # (nothing read yet)
    c.update({b"j1": request(), b"j2": request(interrupt=True)})
    assert c.requested("j1") and c.requested("j2") and not c.requested("j3")
    c.update({b"j2": request()})  # (j1's request deleted since: withdrawn, or stale elsewhere)
    assert not c.requested("j1") and c.requested("j2")
    c.update({})
    assert not c.requested("j2")


def test_update_returns_the_requests_older_than_request_ttl_and_ignores_them():
    c = cancels()
    run = run_of("old")
    c.started("old", run)

    stale = c.update({b"old": request(at=NOW - REQUEST_TTL - 1), b"young": request(at=NOW - REQUEST_TTL + 60)})

    assert stale == ["old"]
    assert not c.requested("old") and c.requested("young")
    assert not run.cancelled


def test_an_entry_no_cancel_wrote_cancels_nothing_and_is_returned_to_be_deleted(caplog):
    # (Such garbage was taken for a request made "now": it cancelled its job, and never grew old
    # enough to be dropped.)
    c = cancels()
    run = run_of("j1")
    c.started("j1", run)
    garbage = {b"j1": b"not json", b"j2": b"[1, 2]", b"j3": json.dumps({"at": "soon"}).encode(),
               b"j4": request(at=NOW + REQUEST_TTL + 1), b"j5": b'{"at": 1e999}', b"j6": b"\xff\xfe",
               b"j7": b"[" * 100_000, b"j8": json.dumps({"at": 10**400}).encode(), b"j9": b'{"interrupt": true}'}
    assert c.update({**garbage, b"ok": request(at=NOW + 60)}) == [f"j{i}" for i in range(1, 10)]
    assert not run.cancelled
    assert not any(c.requested(f"j{i}") for i in range(1, 10)) and c.requested("ok")
    assert "the cancel request stored for jid=j1 is no request (not json): dropped, its job not cancelled" in (
        caplog.text)


class Spinner:
    """A thread that registers its run, then spins in bytecode until told to stop (or interrupted)."""

    def __init__(self, c: Cancels, jid: str, body=None):
        self.c, self.jid = c, jid
        self.run = run_of(jid)
        self.started = threading.Event()
        self.stop = threading.Event()
        self.outcome: str | None = None
        self.body = body or self._spin
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        assert self.started.wait(5)

    def _spin(self) -> None:
        deadline = time.monotonic() + 10
        while not self.stop.is_set() and time.monotonic() < deadline:
            pass

    def _main(self) -> None:
        self.c.started(self.jid, self.run)
        self.started.set()
        try:
            self.body()
            self.outcome = "returned"
        except Cancelled:
            self.outcome = "cancelled"

    def join(self) -> str | None:
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.outcome


def test_an_interrupt_request_raises_cancelled_in_the_run_s_thread_once():
    c = cancels()
    spinner = Spinner(c, "j1")

    c.update({b"j1": request(interrupt=True)})

    assert spinner.join() == "cancelled"
    assert spinner.run.cancelled
    c.update({b"j1": request(interrupt=True)})  # (the next beat reads it again: raised once only)
    c.finished("j1")


def test_a_request_without_interrupt_raises_nothing():
    c = cancels()
    spinner = Spinner(c, "j1")
    c.update({b"j1": request()})
    time.sleep(0.1)
    spinner.stop.set()
    assert spinner.join() == "returned"
    assert spinner.run.cancelled
    c.finished("j1")


def test_finished_withdraws_an_interrupt_sent_but_not_yet_raised():
    # A thread blocked in one C call (a sleep) sees an async exception only when it returns: the
    # run ended meanwhile, it would land in the processor's code after the job's. finished()
    # (called from the processor once the run ended) takes it back.
    def sleep_then_return():
        time.sleep(0.5)

    c = cancels()
    withdrawn = Spinner(c, "j1", body=sleep_then_return)
    control = Spinner(c, "j2", body=sleep_then_return)
    c.update({b"j1": request(interrupt=True), b"j2": request(interrupt=True)})

    c.finished("j1")

    assert withdrawn.join() == "returned"
    assert control.join() == "cancelled"  # (the same, not withdrawn: raised once the sleep returned)
    c.finished("j2")


def test_finished_forgets_the_run():
    c = cancels()
    run = run_of("j1")
    c.started("j1", run)
    c.finished("j1")
    c.update({b"j1": request(interrupt=True)})  # (no run of j1 here any more: nothing to tell or raise)
    assert not run.cancelled and c.requested("j1")
