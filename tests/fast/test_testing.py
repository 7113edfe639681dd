"""testing: fake and inline modes, the pytest fixtures and the TestCase mixins users write tests with."""

from __future__ import annotations

import asyncio
import importlib.metadata
import io
import logging

import pytest
from django.test import TestCase

from django_cogworker import Job, UnknownJobError, joblog, testing
from django_cogworker.push import runtime
from testproject.demo.jobs import FailJob, RecordJob


class Collect(Job):
    """Appends its arguments to a module-level list, so a test can see it ran."""

    def perform(self, *args, **kwargs):
        ran.append((self.jid, list(args), kwargs))


class FanOut(Job):
    """Pushes one Collect per item: jobs that push jobs."""

    def perform(self, items):
        for item in items:
            Collect.perform_async(item)


class AsyncCollect(Job):
    """An ``async def perform``: run to completion like any other."""

    async def perform(self, *args):
        await asyncio.sleep(0)
        ran.append((self.jid, list(args), {}))


class PushesThenFails(Job):
    """Pushes a FailJob, then records that it went on: a child's failure is not its parent's."""

    def perform(self, message):
        FailJob.perform_async(message)
        ran.append((self.jid, ["after the push"], {}))


ran: list = []


@pytest.fixture(autouse=True)
def clear_ran():
    ran.clear()


# -- fake mode -------------------------------------------------------------------------------------


def test_fake_collects_pushes_per_class_without_redis(r):
    with testing.fake() as jobs:
        jid = Collect.perform_async(1, flag=True)
        Collect.perform_in(60, 2)
        FanOut.perform_async([3])
        assert jobs.args(Collect) == [[1], [2]]
        assert [p["jid"] for p in jobs.jobs(Collect)][0] == jid
        assert jobs.jobs(Collect)[0]["kwargs"] == {"flag": True}
        assert jobs.args(FanOut) == [[[3]]]
        assert len(jobs) == 3 and len(jobs.jobs()) == 3
    assert r.dbsize() == 0
    assert ran == []


def test_fake_payloads_are_what_a_worker_would_see():
    with testing.fake() as jobs:
        Collect.set(queue="mail", retry=2).perform_async({"k": [1, 2]})
        (payload,) = jobs.jobs(Collect)
    assert (payload["class"], payload["queue"], payload["retry"], payload["args"]) == (
        Collect.name, "mail", 2, [{"k": [1, 2]}])
    assert isinstance(payload["enqueued_at"], float)


def test_fake_still_refuses_non_json_arguments():
    with testing.fake() as jobs, pytest.raises(TypeError, match=r"^args\[0\] is a tuple"):
        Collect.perform_async((1, 2))
    assert len(jobs) == 0


def test_drain_runs_jobs_and_the_jobs_they_push():
    with testing.fake() as jobs:
        FanOut.perform_async(["a", "b"])
        Collect.perform_async("c")
        assert jobs.drain() == 4
        assert len(jobs) == 0
    assert [args for _, args, _ in ran] == [["c"], ["a"], ["b"]]


def test_drain_one_class_leaves_the_others():
    with testing.fake() as jobs:
        Collect.perform_async(1)
        FanOut.perform_async([2])
        assert jobs.drain(Collect) == 1
        assert jobs.args(FanOut) == [[[2]]]
        jobs.clear()
        assert len(jobs) == 0


def test_drain_raises_what_the_job_raises():
    with testing.fake() as jobs:
        FailJob.perform_async("in drain")
        with pytest.raises(RuntimeError, match="in drain"):
            jobs.drain()


def test_drain_of_an_unregistered_class_says_so():
    with testing.fake() as jobs:
        jobs.push({"jid": "x", "class": "nowhere.Missing", "args": [], "kwargs": {}, "queue": "default"})
        with pytest.raises(UnknownJobError, match="'nowhere.Missing'"):
            jobs.drain()


def test_fake_bulk_collects_each_item():
    with testing.fake() as jobs:
        jids = Collect.perform_bulk([(1,), (2,)])
        assert [p["jid"] for p in jobs.jobs(Collect)] == jids


def test_leaving_fake_mode_pushes_to_redis_again(r):
    with testing.fake():
        Collect.perform_async(1)
    Collect.perform_async(2)
    assert r.llen("cogworker:queue:default") == 1


# -- inline mode ------------------------------------------------------------------------------------


def test_inline_runs_at_push_in_the_callers_thread(r):
    with testing.inline():
        jid = RecordJob.perform_async("inline:key")
        assert r.lrange("inline:key", 0, -1) == [jid]
        RecordJob.perform_in(3600, "inline:key", "later")  # scheduled ones run at once too
        assert r.lrange("inline:key", 0, -1) == [jid, "later"]
    assert not r.exists("cogworker:queue:default", "cogworker:schedule")


def test_inline_exceptions_reach_the_caller():
    with testing.inline(), pytest.raises(RuntimeError, match="from inline"):
        FailJob.perform_async("from inline")


def test_inline_passes_json_round_tripped_arguments():
    with testing.inline():
        Collect.perform_async([1, {"a": None}], key="v")
        Collect.perform_bulk([(2,), (3,)])
    assert [(args, kwargs) for _, args, kwargs in ran] == [([[1, {"a": None}]], {"key": "v"}), ([2], {}), ([3], {})]


def test_inline_runs_a_job_s_pushes_once_it_is_settled_and_raises_their_failure_to_the_caller():
    # (As a worker: the child runs after its parent, whose run its failure doesn't end. Run inside
    # the parent, a chain of 300 steps nested 300 runs, and a child's exception failed its parent.)
    with testing.inline(), pytest.raises(RuntimeError, match="child failed"):
        PushesThenFails.perform_async("child failed")
    assert [args for _, args, _ in ran] == [["after the push"]]


def test_a_project_s_feature_runs_under_both_modes(settings, r):
    # The helpers run the worker's path: a project's COGWORKER["FEATURES"] sees their jobs too
    # (testproject/demo/audit.py: an entry per job settled, in the stream <prefix>audit).
    settings.COGWORKER = {**settings.COGWORKER, "FEATURES": ["testproject.demo.audit.audit"]}
    with testing.fake() as jobs:
        done = Collect.perform_async(1)
        jobs.drain()
    with testing.inline(), pytest.raises(RuntimeError):
        FailJob.perform_async("audited")
    outcomes = {fields["jid"]: fields["outcome"] for _id, fields in r.xrange("cogworker:audit")}
    assert len(outcomes) == 2 and outcomes[done] == "success"
    assert list(outcomes.values())[1] == "dead"  # (a failure is final here: FailJob's 2 retries aren't made)


def test_modes_nest_and_restore_the_previous_one():
    with testing.inline():
        with testing.fake() as jobs:
            Collect.perform_async(1)
        assert jobs.args(Collect) == [[1]] and ran == []
        Collect.perform_async(2)
        assert [args for _, args, _ in ran] == [[2]]
    assert runtime.set_override(None) is None


# -- pytest fixtures (installed by the package's pytest11 entry point) ------------------------------


def test_plugin_is_installed_by_entry_point(pytestconfig):
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "cogworker"]
    assert entry.value == "django_cogworker.pytest_plugin"
    assert pytestconfig.pluginmanager.has_plugin("cogworker")


def test_cogworker_fake_fixture(cogworker_fake, r):
    Collect.perform_async(1)
    assert cogworker_fake.args(Collect) == [[1]]
    assert cogworker_fake.drain() == 1
    assert r.dbsize() == 0


def test_cogworker_inline_fixture(cogworker_inline, r):
    jid = RecordJob.perform_async("fixture:key")
    assert r.lrange("fixture:key", 0, -1) == [jid]
    with pytest.raises(RuntimeError, match="fixture boom"):
        FailJob.perform_async("fixture boom")


# -- unittest / Django TestCase mixins -------------------------------------------------------------


class FakeJobsMixinTests(testing.FakeJobsMixin, TestCase):
    def test_pushes_inside_the_test_transaction_are_recorded(self):
        # TestCase wraps each test in atomic(): fake mode must not wait for a commit that never comes.
        Collect.perform_async("receipt", 42)
        self.assertEqual(self.jobs.args(Collect), [["receipt", 42]])
        self.assertEqual(self.jobs.drain(), 1)
        self.assertEqual([args for _, args, _ in ran], [["receipt", 42]])


class InlineJobsMixinTests(testing.InlineJobsMixin, TestCase):
    def test_jobs_run_at_push(self):
        jid = RecordJob.perform_async("mixin:key")
        self.assertEqual(runtime.get_redis().lrange("mixin:key", 0, -1), [jid.encode()])
        with self.assertRaises(RuntimeError):
            FailJob.perform_async("mixin boom")


def test_an_async_perform_runs_in_both_modes():
    with testing.fake() as jobs:
        AsyncCollect.perform_async(1)
        assert jobs.drain() == 1
    with testing.inline():
        AsyncCollect.perform_async(2)
    assert [args for _jid, args, _kw in ran] == [[1], [2]]


@pytest.mark.parametrize("mode", ["fake", "inline"])
def test_a_job_s_start_and_done_lines_name_it_once_under_the_project_s_logging(mode):
    # The project's LOGGING as testproject/settings.py writes it (the JobContextFilter, a format with
    # %(job_context)s): under the helpers (a test, a dev server in inline mode) each line had the jid
    # and class twice ("class=... jid=... processor: start jid=... class=..."), as runcogworker's had.
    # A handler whose format shows no job still gets them in the message.
    shown, plain = io.StringIO(), io.StringIO()
    with_context = logging.StreamHandler(shown)
    with_context.setFormatter(logging.Formatter("%(levelname)s%(job_context)s %(name)s: %(message)s"))
    with_context.addFilter(joblog.JobContextFilter())
    without = logging.StreamHandler(plain)
    without.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("django_cogworker.engine.run.processor")
    logger.addHandler(with_context)
    logger.addHandler(without)
    try:
        with getattr(testing, mode)() as jobs:
            jid = Collect.perform_async("logged")
            if mode == "fake":
                jobs.drain()
    finally:
        logger.removeHandler(with_context)
        logger.removeHandler(without)
    job = f"{Collect.__module__}.Collect"
    assert [line.split(" elapsed=")[0] for line in shown.getvalue().splitlines()] == [
        f"INFO class={job} jid={jid} django_cogworker.engine.run.processor: start",
        f"INFO class={job} jid={jid} django_cogworker.engine.run.processor: done"]
    assert [line.split(" elapsed=")[0] for line in plain.getvalue().splitlines()] == [
        f"INFO django_cogworker.engine.run.processor: start jid={jid} class={job}",
        f"INFO django_cogworker.engine.run.processor: done jid={jid} class={job}"]
