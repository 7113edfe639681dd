"""testing: batches, chains, groups and chords under fake and inline mode, with the outbox off and on.

The helpers run a job through the worker's own path (django_cogworker/testing/runner.py): a batch's
step settles in Redis as a worker's does, its callbacks come back to the helper (collected by
fake, run by inline), a chain's next step too. Each workflow is run under each helper as a project
meets it (the context managers ``testing.fake()`` / ``testing.inline()``, and the pytest plugin's
fixtures ``cogworker_fake`` / ``cogworker_inline``, active for the whole test), with OUTBOX off and
on (on: inside a transaction, where a push would otherwise be an outbox row).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Callable

import pytest
from django.conf import settings
from django.db import transaction
from django.test import TestCase

from django_cogworker import Batch, Job, chain, chord, group, testing
from django_cogworker.broker.keys import Keys
from django_cogworker.push import runtime

K = Keys()

ran: list = []  # (what ran, in order: (class, args))


class Step(Job):
    """Records its arguments; returns ``value`` (a workflow step)."""

    def perform(self, value, *rest):
        ran.append(("Step", [value, *rest]))
        return value


class Plus(Job):
    """Takes the previous step's value: records and returns it plus ``n`` (a list: its sum plus ``n``)."""

    def perform(self, previous, n):
        total = (sum(previous) if isinstance(previous, list) else previous) + n
        ran.append(("Plus", [previous, n]))
        return total


class Fails(Job):
    retry = 5  # (retried by a worker; under the helpers nothing is)

    def perform(self, message):
        ran.append(("Fails", [message]))
        raise RuntimeError(message)


class Callback(Job):
    """A batch callback: records its event and the counts its status gives."""

    def perform(self, status, tag):
        ran.append(("Callback", [tag, status["event"], status["total"], status["failures"]]))


class Sealed(Job):
    """Encrypts its arguments: ``perform`` gets them opened."""

    encrypt = True

    def perform(self, secret):
        ran.append(("Sealed", [secret]))
        return secret


class SealedCallback(Job):
    """A batch callback that encrypts: its options sealed, its status clear beside them."""

    encrypt = True

    def perform(self, status, secret):
        ran.append(("SealedCallback", [secret, status["event"]]))


@pytest.fixture(autouse=True)
def clear_ran():
    ran.clear()


@dataclasses.dataclass
class Mode:
    """A helper as a test meets it: ``kind`` (fake or inline) and ``helper()``, a context manager
    that gives the helper's jobs (the fixtures' already active: entered for the whole test)."""

    kind: str
    helper: Callable[[], contextlib.AbstractContextManager]


@pytest.fixture(params=["fake", "inline", "cogworker_fake", "cogworker_inline"])
def mode(request) -> Mode:
    if request.param.startswith("cogworker_"):  # (the pytest plugin's fixtures: django_cogworker/pytest_plugin.py)
        jobs = request.getfixturevalue(request.param)
        return Mode(request.param.removeprefix("cogworker_"), lambda: contextlib.nullcontext(jobs))
    return Mode(request.param, getattr(testing, request.param))


@pytest.fixture(params=["outbox off", "outbox on"])
def outbox(request, settings, redis_url):
    """OUTBOX off, or on with the workflow started inside a transaction (where a push would be an
    outbox row, were the helpers not the client)."""
    if request.param == "outbox on":
        settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": redis_url}
        request.getfixturevalue("transactional_db")
        return transaction.atomic
    return contextlib.nullcontext


def run_all(mode: Mode, outbox, start):
    """Start a workflow under ``mode`` (fake: then drain it); return how many jobs drain ran (inline: None)."""
    if mode.kind == "inline":
        with mode.helper(), outbox():
            start()
        return None
    with mode.helper() as jobs:
        with outbox():
            start()
        assert ran == []  # (collected, not run)
        return jobs.drain()


def run_failing(mode: Mode, outbox, start) -> list[str]:
    """``run_all`` for a workflow with a job that fails: the errors the caller saw (fake: each drain
    that raised is followed by another, until nothing is left)."""
    errors = []
    if mode.kind == "inline":
        try:
            with mode.helper(), outbox():
                start()
        except RuntimeError as exc:
            errors.append(str(exc))
        return errors
    with mode.helper() as jobs:
        with outbox():
            start()
        while len(jobs):
            try:
                jobs.drain()
            except RuntimeError as exc:
                errors.append(str(exc))
    return errors


def names(kind):
    return [args for name, args in ran if name == kind]


# -- batches -----------------------------------------------------------------------------------------


def test_a_batch_s_callbacks_run_once_after_its_jobs(mode, outbox, r):
    def start():
        batch = Batch("three").on("success", Callback, tag="s").on("complete", Callback, tag="c")
        with batch.jobs():
            for i in range(3):
                Step.perform_async(i)

    drained = run_all(mode, outbox, start)
    assert [name for name, _ in ran][:3] == ["Step"] * 3
    assert sorted(names("Callback")) == [["c", "complete", 3, 0], ["s", "success", 3, 0]]  # (once each)
    assert drained in (None, 5)
    assert not r.keys(K.queue("*"))  # (nothing went to a queue: the callbacks came to the helper)


def test_a_batch_whose_job_fails_fires_death_and_complete_once_and_retries_nothing(mode, outbox, r):
    def start():
        batch = Batch().on("death", Callback, tag="d").on("complete", Callback, tag="c").on(
            "success", Callback, tag="s")
        with batch.jobs():
            Step.perform_async(1)
            Fails.perform_async("boom")

    assert run_failing(mode, outbox, start) == ["boom"]  # (inline: raised to the caller; fake: by drain)
    assert names("Fails") == [["boom"]]  # (run once: nothing is retried under the helpers)
    assert sorted(names("Callback")) == [["c", "complete", 2, 1], ["d", "death", 2, 1]]
    assert not r.zcard(K.retry) and not r.zcard(K.dead)  # (the helpers keep no retry or dead set)


def test_fake_drain_raises_a_failure_and_a_second_drain_runs_the_callbacks_it_fired(outbox, r):
    with testing.fake() as jobs:
        with outbox():
            batch = Batch().on("death", Callback, tag="d").on("complete", Callback, tag="c")
            with batch.jobs():
                Fails.perform_async("boom")
        with pytest.raises(RuntimeError, match="boom"):
            jobs.drain()
        assert sorted(p["kwargs"]["tag"] for p in jobs.jobs(Callback)) == ["c", "d"]
        assert jobs.drain() == 2
    assert sorted(names("Callback")) == [["c", "complete", 1, 1], ["d", "death", 1, 1]]


# -- workflows ---------------------------------------------------------------------------------------


def test_a_chain_hands_each_step_the_previous_one_s_result_in_order(mode, outbox, r):
    def start():
        chain(Step.s(1), Plus.s(10).with_previous(), Plus.s(100).with_previous()).on(
            "success", Callback, tag="chain").perform_async()

    run_all(mode, outbox, start)
    assert [(name, args) for name, args in ran if name != "Callback"] == [
        ("Step", [1]), ("Plus", [1, 10]), ("Plus", [11, 100])]
    assert names("Callback") == [["chain", "success", 3, 0]]  # (the chain's batch: a child batch per step)


def test_a_group_runs_its_members_and_its_callback_after_them(mode, outbox, r):
    def start():
        group(Step.s(1), Step.s(2), Step.s(3)).on("success", Callback, tag="group").perform_async()

    run_all(mode, outbox, start)
    assert sorted(names("Step")) == [[1], [2], [3]]
    assert names("Callback") == [["group", "success", 3, 0]]
    assert ran[-1][0] == "Callback"


def test_a_chord_s_callback_gets_its_members_values_once_all_ran(mode, outbox, r):
    def start():
        chord([Step.s(1), Step.s(2), Step.s(3)], Plus.s(1000).with_previous()).perform_async()

    run_all(mode, outbox, start)
    assert sorted(names("Step")) == [[1], [2], [3]]
    assert ran[-1] == ("Plus", [[1, 2, 3], 1000])  # (the values in the order of its members)


def test_a_chain_stops_at_a_step_that_fails(mode, outbox, r):
    def start():
        chain(Step.s(1), Fails.s().with_previous(), Plus.s(5).with_previous()).on(
            "death", Callback, tag="chain").perform_async()

    assert run_failing(mode, outbox, start) == ["1"]
    assert names("Plus") == []
    assert names("Callback") == [["chain", "death", 2, 1]]


# -- encryption ---------------------------------------------------------------------------------------


def test_an_encrypted_job_gets_its_arguments_opened(mode, outbox, r):
    def start():
        Sealed.perform_async("Zanzibar")
        group(Sealed.s("in a group")).on("success", SealedCallback, secret="in its callback").perform_async()

    run_all(mode, outbox, start)
    assert sorted(names("Sealed")) == [["Zanzibar"], ["in a group"]]
    assert names("SealedCallback") == [["in its callback", "success"]]


def test_an_encrypted_step_s_value_is_handed_on(mode, outbox, r):
    def start():
        chain(Sealed.s(7), Plus.s(1).with_previous()).perform_async()

    run_all(mode, outbox, start)
    assert ran == [("Sealed", [7]), ("Plus", [7, 1])]


# -- no Redis for a plain job -----------------------------------------------------------------------


def unreachable_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_plain_job_needs_no_redis(settings):
    settings.COGWORKER = {**settings.COGWORKER, "REDIS_URL": f"redis://127.0.0.1:{unreachable_port()}/0"}
    with testing.fake() as jobs:
        Step.perform_async(1)
        Sealed.perform_async("opened")
        Step.perform_in(60, 2)
        assert jobs.drain() == 3
    with testing.inline():
        Step.perform_async(3)
    assert ran == [("Step", [1]), ("Sealed", ["opened"]), ("Step", [2]), ("Step", [3])]
    with pytest.raises(Exception, match="Connection refused|Error 111"):  # (the premise: no Redis there)
        runtime.get_redis().ping()


# -- Django TestCase ----------------------------------------------------------------------------------


class WorkflowInATestCase(testing.InlineJobsMixin, TestCase):
    """TestCase wraps each test in a transaction: a workflow there runs all the same (OUTBOX on too)."""

    def test_a_chain_runs(self):
        with self.settings(COGWORKER={**settings.COGWORKER, "OUTBOX": True}):
            chain(Step.s(2), Plus.s(3).with_previous()).perform_async()
        self.assertEqual(ran, [("Step", [2]), ("Plus", [2, 3])])
