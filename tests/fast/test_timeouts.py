"""Job timeouts (django_cogworker/engine/run/timeouts.py): JobTimeout raised in the job's thread, a
job that ignores it reported, and under --processes its process replaced; end to end with a
class job (the task's timeout is in test_tasks.py)."""

from __future__ import annotations

import logging
import threading
import time

from helpers import wait_until

from django_cogworker.errors import JobTimeout


def run_in_thread(body) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = body()
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def spin_until(event: threading.Event) -> None:
    """Busy-loop until ``event`` is set. A function of its own: on CPython 3.13 a JobTimeout may
    skip the handlers of the function it lands in (engine/run/timeouts.py), never its callers'."""
    while not event.is_set():
        pass


def test_a_busy_job_gets_job_timeout_in_its_own_thread():
    from django_cogworker.engine.run.timeouts import Timeouts

    timeouts = Timeouts(grace=30)
    timeouts.start()
    try:
        def job():
            token = timeouts.arm(0.2, "j1")
            try:
                spin_until(threading.Event())
            finally:
                timeouts.disarm(token)

        thread, outcome = run_in_thread(job)
        thread.join(10)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), JobTimeout)
    finally:
        timeouts.stop()


def test_a_job_done_in_time_is_never_interrupted_afterwards():
    from django_cogworker.engine.run.timeouts import Timeouts

    timeouts = Timeouts(grace=30)
    timeouts.start()
    try:
        def job():
            token = timeouts.arm(0.3, "j2")
            timeouts.disarm(token)
            end = time.monotonic() + 0.8  # (runs past what was its deadline: nothing may hit it)
            while time.monotonic() < end:
                pass
            return "ok"

        thread, outcome = run_in_thread(job)
        thread.join(10)
        assert outcome == {"value": "ok"}
    finally:
        timeouts.stop()


def test_a_job_that_ignores_it_is_stuck_replaced_or_reported(caplog):
    from django_cogworker.engine.run.timeouts import Timeouts

    replaced = threading.Event()
    stop = threading.Event()
    for replace in (True, False):
        timeouts = Timeouts(grace=0.3, replace_when_stuck=replace, on_stuck=replaced.set)
        timeouts.start()
        caught = []

        def stubborn(timeouts=timeouts, caught=caught):
            token = timeouts.arm(0.1, "stubborn")
            try:
                while not stop.is_set():
                    try:
                        spin_until(stop)
                    except JobTimeout:
                        caught.append(1)
            finally:
                timeouts.disarm(token)

        with caplog.at_level(logging.ERROR, logger="django_cogworker.engine.run.timeouts"):
            thread, _ = run_in_thread(stubborn)
            if replace:
                assert replaced.wait(10)
            else:
                wait_until(lambda: "its processor stays busy" in caplog.text, message="stuck reported")
                assert not replaced.is_set() or replace
            stop.set()
            thread.join(10)
            stop.clear()
        timeouts.stop()
        assert caught == [1]  # raised once: the rest is the stuck rule's
        replaced.clear()


