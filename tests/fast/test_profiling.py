"""Profiling on request (features/profiling/, issue 46 point 3): a job pushed with
``set(profile=...)`` runs under cProfile or pyinstrument and its profile is kept a day in Redis
(its known hot function on top, its error when it raised); a job not asked never enters the hook;
another profiler active on the thread leaves the run unprofiled, never failed; the index is
trimmed; "run profiled" of a retry entry; ``manage.py cogworker profiles``.

Jobs are pushed through the real client and run by a processor called on the test's thread
(engine_fixtures' ``make_processor``), on the suite's Redis.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from engine_fixtures import Note, make_processor_fixture, new_token  # noqa: F401 - make_processor

from django_cogworker import api as cogworker_api
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run.hooks import Outcome
from django_cogworker.errors import InvalidArgument
from django_cogworker.features.profiling import api, profilers, records
from django_cogworker.features.profiling.hook import Profiling
from django_cogworker.push.job import Job

K = Keys()
PROFILERS = ("cProfile", "pyinstrument")  # (pyinstrument: the dev extra installs it, as the profile extra)


def hot() -> int:
    return sum(range(10**6))


class HotJob(Job):
    """Calls ``hot`` five times: the function a profile must put on top."""

    def perform(self, fail: bool = False) -> None:
        for _ in range(5):
            hot()
        if fail:
            raise RuntimeError("hot and broken")


class FailsFirst(Job):
    retry = 3

    def perform(self) -> None:
        hot()
        if self.payload.get("retry_count") is None:
            raise RuntimeError("first attempt")

    def retry_in(self, count: int, exc: BaseException) -> float:
        return 0


class HasItsOwnProfile(Job):
    profile = "aws-prod"  # (a class attribute of its own: never read as a profiling label)

    def perform(self) -> None:
        pass


def profiling(prefer: str | None):
    """The feature alone, on the processor's parts, with ``prefer``'s profiler."""
    return [lambda parts: Profiling(parts.redis, parts.keys, parts.identity, prefer=prefer)]


def kept(rb) -> list[records.Profile]:
    return api.profiles(redis=rb, keys=K).items


@pytest.mark.parametrize("prefer", PROFILERS)
def test_a_job_pushed_with_a_label_is_profiled_and_its_hot_function_is_on_top(make_processor, rb, prefer):
    called = make_processor(features=profiling(prefer))
    run = called.run(HotJob, profile="why-slow")
    assert run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    [summary] = kept(rb)
    profile = api.profile(summary.id, redis=rb, keys=K)
    assert profile is not None
    assert (profile.label, profile.jid, profile.job_class, profile.queue, profile.attempt, profile.profiler,
            profile.error, profile.skipped) == ("why-slow", run.jid, "test_profiling.HotJob", "default", 1, prefer,
                                                "", "")
    assert 0 < profile.elapsed < 60 and abs(profile.started - time.time()) < 60
    rows = {row["function"]: row for row in profile.top}
    assert "hot" in rows, list(rows)[:10]
    assert rows["hot"]["where"] == f"{__file__}:{hot.__code__.co_firstlineno}"
    assert rows["hot"]["calls"] == (5 if prefer == "cProfile" else None)  # (pyinstrument samples: no counts)
    # The job's own frames hold the run's time: perform first (or right after the frames above it), hot within.
    assert rows["hot"]["cumtime"] <= rows["perform"]["cumtime"] <= profile.elapsed + 0.05
    assert rows["hot"]["cumtime"] > 0.5 * rows["perform"]["cumtime"]
    assert len(profile.top) <= 50
    # The worker's own frames around the job (each holding the whole run) are left out.
    assert not [row for row in profile.top if row["where"].startswith(profilers.WRAPPERS)]
    page = api.html(summary.id, redis=rb, keys=K)
    assert (page is not None) == (prefer == "pyinstrument") == profile.has_html
    if page is not None:
        assert page.lstrip().lower().startswith("<!doctype html") and "hot" in page


def test_a_job_that_raises_keeps_its_profile_with_its_error_and_is_filed_as_usual(make_processor, rb):
    called = make_processor(features=profiling("cProfile"))
    run = called.run(HotJob, True, profile="broken")
    assert run.decision is not None and run.decision.outcome is Outcome.RETRY
    assert rb.zcard(K.retry) == 1 and called.ends() == ["retry"]
    [summary] = kept(rb)
    profile = api.profile(summary.id, redis=rb, keys=K)
    assert profile is not None and profile.error == "RuntimeError: hot and broken"
    assert "hot" in {row["function"] for row in profile.top}


def test_each_run_of_a_marked_job_is_profiled_with_its_attempt(make_processor, rb):
    called = make_processor(features=profiling("cProfile"))
    first = called.run(FailsFirst, profile="flaky")
    assert first.decision is not None and first.decision.outcome is Outcome.RETRY
    assert called.sweep() == 1
    second = called.run_next()
    assert second is not None and second.decision is not None and second.decision.outcome is Outcome.SUCCESS
    assert [(p.attempt, p.error, p.jid) for p in kept(rb)] == [(2, "", first.jid),
                                                               (1, "RuntimeError: first attempt", first.jid)]


def test_a_job_not_asked_never_enters_the_hook_and_writes_nothing(make_processor, rb):
    called = make_processor()  # (the package's features, as a worker builds them)
    plan = called.processor.plans.plan(HotJob)
    [feature] = [f for f in plan.around if getattr(f, "__self__", None).__class__ is Profiling]  # type: ignore[union-attr]
    assert "profile" in plan.fields
    unmarked = plan.for_payload({"jid": "x", "class": "test_profiling.HotJob"})
    assert feature not in unmarked.around and all(getattr(h, "__self__", None).__class__ is not Profiling
                                                  for phase in (unmarked.before, unmarked.around, unmarked.after)
                                                  for h in phase)
    assert feature in plan.for_payload({"jid": "x", "profile": "why"}).around
    run = called.run(HotJob)
    assert run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    assert "profile" not in run.payload and rb.zcard(K.profiles) == 0 and not rb.keys(K.profile("*"))
    # The push side: a plain push's setter runs no profiling hook, and a class's own "profile" isn't a label.
    assert "profile" not in called.run(HasItsOwnProfile).payload and rb.zcard(K.profiles) == 0


def test_a_label_must_be_text(make_processor):
    for bad, said in (("", "non-empty string"), (5, "non-empty string"), ("x" * 201, "at most 200 characters"),
                      ("\ud800", "UTF-8")):
        with pytest.raises(InvalidArgument, match=said):
            HotJob.set(profile=bad)
    assert HotJob.set(profile=None).push_hooks == HotJob.set().push_hooks


def test_a_cprofile_already_active_leaves_a_run_asked_for_cprofile_unprofiled_not_failed(make_processor, rb, caplog):
    called = make_processor(features=profiling("cProfile"))
    theirs = cProfile.Profile()
    theirs.enable()  # (a project's own: its sys.setprofile before 3.12, sys.monitoring's one profiler slot after)
    try:
        run = called.run(HotJob, profile="doubly")
        still = sys.getprofile() is theirs if sys.version_info < (3, 12) else True
    finally:
        theirs.disable()
    assert run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    assert still, "their profiler was switched off"
    [profile] = kept(rb)
    assert (profile.profiler, profile.label, profile.top) == ("", "doubly", []) and "profiler" in profile.skipped
    assert "run unprofiled" in caplog.text
    # Their profiler saw the job's run: it was never replaced.
    assert "hot" in {name for (_file, _line, name) in pstats.Stats(theirs).stats}  # type: ignore[attr-defined]


@pytest.mark.parametrize("prefer", PROFILERS)
def test_a_profile_function_already_set_on_the_thread_is_left_in_place(make_processor, rb, prefer):
    called = make_processor(features=profiling(prefer))
    seen: list[str] = []

    def theirs(frame, event, arg):  # (a debugger's, a coverage tool's: sys.setprofile)
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(theirs)
    try:
        run = called.run(HotJob, profile="under a debugger")
        still = sys.getprofile() is theirs
    finally:
        sys.setprofile(None)
    assert run.decision is not None and run.decision.outcome is Outcome.SUCCESS and still
    assert seen.count("hot") == 5
    [profile] = kept(rb)
    assert profile.profiler == "" and profile.skipped == ("another profiler was active on the worker's thread "
                                                          "(sys.setprofile)")


def test_a_profile_lives_a_day_and_the_index_keeps_a_day_and_at_most_kept(make_processor, rb, monkeypatch):
    called = make_processor(features=profiling("cProfile"))
    called.run(Note, new_token(), profile="short")
    [profile] = kept(rb)
    assert records.TTL - 5 <= rb.ttl(K.profile(profile.id)) <= records.TTL
    now = time.time()
    old = records.Profile("0" * 16, "old", "j0", "x.Old", started=now - records.TTL - 10)
    records.save(rb, K, old)  # (written late, by its start: trimmed off at once)
    assert [p.id for p in kept(rb)] == [profile.id]
    monkeypatch.setattr(records, "KEPT", 3)
    for n in range(1, 5):
        records.save(rb, K, records.Profile(f"{n:016x}", f"n{n}", f"j{n}", "x.New", started=now + n))
    assert [p.label for p in kept(rb)] == ["n4", "n3", "n2"]
    assert not rb.exists(K.profile(profile.id)) and not rb.exists(K.profile(f"{1:016x}"))


def test_run_profiled_enqueues_a_retry_entry_now_marked_and_its_run_is_profiled(make_processor, rb):
    called = make_processor(features=profiling("cProfile"))
    failed = called.run(HotJob, True)  # (not marked: no profile)
    assert failed.decision is not None and failed.decision.outcome is Outcome.RETRY and rb.zcard(K.profiles) == 0
    retries = cogworker_api.RetrySet(redis=rb, keys=K)
    [entry] = retries.page(1, 10).items
    assert api.run_profiled(retries, entry.token, "from the admin")
    assert retries.size() == 0 and not api.run_profiled(retries, entry.token, "again")  # (gone: False)
    rerun = called.run_next()
    assert rerun is not None and rerun.jid == failed.jid and rerun.payload["profile"] == "from the admin"
    [profile] = kept(rb)
    assert (profile.label, profile.attempt, profile.error) == ("from the admin", 2, "RuntimeError: hot and broken")


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("cogworker", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_cli_lists_profiles_as_json_and_shows_one(make_processor, rb):
    called = make_processor(features=profiling("cProfile"))
    run = called.run(HotJob, True, profile="cli <label>")
    document = json.loads(cli("profiles", "--json"))
    [listed] = document["profiles"]
    assert document["total"] == 1 and "top" not in listed
    assert {k: listed[k] for k in ("label", "jid", "class", "profiler", "error", "html", "attempt")} == {
        "label": "cli <label>", "jid": run.jid, "class": "test_profiling.HotJob", "profiler": "cProfile",
        "error": "RuntimeError: hot and broken", "html": False, "attempt": 1}
    shown = json.loads(cli("profiles", "show", listed["id"], "--json"))
    assert shown["id"] == listed["id"] and shown["top"][0]["cumtime"] >= shown["top"][-1]["cumtime"]
    assert "hot" in {row["function"] for row in shown["top"]}
    table = cli("profiles", "show", listed["id"])
    assert table.splitlines()[0].split() == ["FUNCTION", "WHERE", "CALLS", "CUMTIME", "S", "TOTTIME", "S"]
    assert listed["id"] in cli("profiles")
    with pytest.raises(CommandError, match="no profile 'ffffffffffffffff'"):
        cli("profiles", "show", "ffffffffffffffff")
    with pytest.raises(CommandError, match="usage: cogworker profiles"):
        cli("profiles", "show")
