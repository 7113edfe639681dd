"""A project's own feature (docs/extending.md): named in COGWORKER["FEATURES"], it sees every job
a worker settles, through the same hooks as the package's features.

The example is testproject/demo/audit.py: an audit trail of each job's outcome in a Redis stream.
"""

from __future__ import annotations

import json
import time

import pytest
from django.core import checks
from django.test import override_settings
from engine_fixtures import Boom, Note, make_processor_fixture, new_token, runs  # noqa: F401 - make_processor

from django_cogworker.broker.connection import make_redis
from django_cogworker.conf import build_config
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.engine.run.hooks import Plans
from django_cogworker.errors import ConfigError, FeatureError
from django_cogworker.features import Decision, Feature, JobRun, Outcome
from django_cogworker.push.job import JobSetter

AUDIT = "testproject.demo.audit.audit"


def audited(r) -> dict[str, dict[str, str]]:
    """jid -> the audit entry of its last settlement."""
    return {fields["jid"]: fields for _id, fields in r.xrange("cogworker:audit")}


def test_an_audit_feature_sees_every_job_s_outcome_run_or_not(make_processor, r):
    token = new_token()
    called = make_processor(FEATURES=[AUDIT])
    ok = called.push(Note, token, 1)
    failed = called.push(Boom, token)
    expired = JobSetter(Note, {}).build([token, 2], {})
    expired["expires_at"] = time.time() - 60  # (as a push with expires_in, a minute after it)
    called.client.push(expired)

    called.drain()

    entries = audited(r)
    assert len(entries) == 3
    assert (entries[ok["jid"]]["outcome"], entries[ok["jid"]]["ran"], entries[ok["jid"]]["error"]) == \
        ("success", "1", "")
    assert (entries[failed["jid"]]["outcome"], entries[failed["jid"]]["error"]) == ("retry", "RuntimeError")
    # (dropped before it ran: the package's expiry feature decided, the project's saw it)
    assert (entries[expired["jid"]]["outcome"], entries[expired["jid"]]["ran"]) == ("dead", "0")
    assert sorted(map(str, runs(token))) == sorted([str((ok["jid"], [1])), failed["jid"]])  # (never the expired one)


class Refuses(Feature):
    """Drops every job of one class before it runs, and raises in ``after``: neither may cost a job."""

    name = "refuses"

    def __init__(self, refused: str):
        self.refused = refused

    def before(self, run: JobRun) -> Decision | None:
        if run.payload["class"] != self.refused:
            return None
        from django_cogworker.features import ACK

        return Decision(Outcome.DEAD, ACK, RuntimeError("refused by a feature"))

    def after(self, run: JobRun) -> None:
        raise ValueError("a feature's bug")


def refuses_boom(parts):
    return [Refuses(Boom.name)]


def test_a_feature_s_before_settles_a_job_unrun_and_its_bug_in_after_is_logged_not_the_job_s(make_processor, r,
                                                                                              caplog):
    token = new_token()
    called = make_processor(FEATURES=["test_extending.refuses_boom"])
    note = called.push(Note, token, 1)
    boom = called.push(Boom, token)

    assert [run.decision.outcome for run in called.drain()] == [Outcome.SUCCESS, Outcome.DEAD]

    # Both settled, the feature's bug logged for each.
    assert all(f"Refuses.after failed for jid={job['jid']}" in caplog.text for job in (note, boom))
    assert r.llen(called.in_progress) == 0  # both acked
    assert runs(token) == [(note["jid"], [1])]  # Boom never ran
    assert r.zcard("cogworker:retry") == 0 and r.zcard("cogworker:dead") == 0  # acked, as the Decision said


def test_the_kill_switch_example_drops_a_switched_off_class_s_jobs_unrun(make_processor, r, caplog):
    # docs/extending.md's `before` example (testproject/demo/switch.py), its imports from
    # django_cogworker.features alone.
    token = new_token()
    r.sadd("cogworker:switched_off", Note.name)
    called = make_processor(FEATURES=["testproject.demo.switch.kill_switch"])
    dropped = called.push(Note, token, 1)
    failed = called.push(Boom, token)  # (a class not switched off runs: here, it fails and is retried)

    called.drain()

    assert r.zcard("cogworker:retry") == 1 and r.llen(called.in_progress) == 0  # the Boom retried, the Note acked
    assert runs(token) == [failed["jid"]]  # the Note never ran
    assert r.zcard("cogworker:dead") == 0  # dropped: acked, as its Decision said
    assert any(f"switched off: {dropped['jid']} dropped, never run" in m for m in caplog.messages)


def test_the_receipts_example_adds_a_step_that_lands_before_its_job_s_ack(make_processor, r):
    # docs/extending.md's step example (testproject/demo/receipts.py): a project's feature puts a
    # step of its own first in a job's settlement and gives its runner; the core names neither.
    token = new_token()
    called = make_processor(FEATURES=["testproject.demo.receipts.receipts"])
    ok = called.push(Note, token, 1)
    failed = called.push(Boom, token)
    called.drain()
    assert r.zrange("cogworker:receipts", 0, -1) == [ok["jid"]]  # (the failure has none: retried)
    assert r.llen(called.in_progress) == 0 and r.zcard("cogworker:retry") == 1
    assert sorted(map(str, runs(token))) == sorted([str((ok["jid"], [1])), failed["jid"]])

    # Redis refuses the step (its key holds a string): the job is not acked without it, but kept
    # pending, still on the in-progress list, until the step lands; then acked.
    r.delete("cogworker:receipts")
    r.set("cogworker:receipts", "not a sorted set")
    refused = called.push(Note, token, 2)
    called.drain()
    assert list(called.settler.pending_settlements()) and r.llen(called.in_progress) == 1
    r.delete("cogworker:receipts")
    assert called.settler.retry_pending_settlements() == 0  # (as the next beat's chore does)
    assert r.zrange("cogworker:receipts", 0, -1) == [refused["jid"]] and r.llen(called.in_progress) == 0


def test_a_features_entry_that_can_not_be_imported_stops_the_worker_at_startup_naming_the_setting(redis_url):
    with override_settings(COGWORKER={"FEATURES": ["no_such_module.audit"]}):
        errors = [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"]) if m.level >= checks.ERROR]
    assert errors and errors[0][0] == "cogworker.E002"
    assert errors[0][1].startswith("COGWORKER[\"FEATURES\"] entry 'no_such_module.audit' cannot be imported")
    config = build_config({"FEATURES": ["no_such_module.audit"]}, {"COGWORKER_REDIS_URL": redis_url})
    with pytest.raises(ImportError, match="no_such_module"):
        Launcher(config, None)  # type: ignore[arg-type]  # (fails before it would use Redis)


def test_features_must_be_a_list_of_dotted_paths():
    with pytest.raises(ConfigError, match=r'COGWORKER\["FEATURES"\]'):
        build_config({"FEATURES": "testproject.demo.audit.audit"}, {})


class DecideRaises(Feature):
    """Counts each ``decide`` it is asked, then raises: a feature's bug where the job's end is decided."""

    name = "misfit"
    asked: list[str] = []

    def decide(self, run: JobRun) -> Decision | None:
        DecideRaises.asked.append(run.jid)
        raise ValueError("decide is broken")


class AppliesRaises(Feature):
    """Raises when asked whether it applies: a feature's bug before any job of the class runs."""

    name = "misfit"

    def applies(self, job_class) -> bool:
        raise ValueError("applies is broken")


def decide_raises(parts):
    return DecideRaises()


def applies_raises(parts):
    return AppliesRaises()


@pytest.mark.parametrize("hook", ["decide", "applies"])
def test_a_feature_hook_that_raises_files_its_jobs_retry_then_dead_naming_it_and_no_processor_dies(
        make_processor, r, caplog, hook):
    # decide raising killed the processor ("processor 3 died; replacing it") with the job unfiled: it
    # ran again at each restart, never reached retry or dead; applies raising killed every processor
    # on every job. (A processor thread dies when ``process`` raises: here, each call returns.)
    token = new_token()
    called = make_processor(FEATURES=[f"test_extending.{hook}_raises"])
    pushed = called.push(Note, token, 1, retry=1)
    failed = called.push(Boom, token, "its own error", retry=0)

    assert [run.decision.outcome for run in called.drain()] == [Outcome.RETRY, Outcome.DEAD]
    assert r.zcard("cogworker:retry") == 1 and r.zcard("cogworker:dead") == 1
    r.zadd("cogworker:retry", {r.zrange("cogworker:retry", 0, 0)[0]: 0}, xx=True)  # (its retry due now)
    assert called.sweep() == 1
    assert [run.decision.outcome for run in called.drain()] == [Outcome.DEAD]
    assert r.zcard("cogworker:dead") == 2 and r.zcard("cogworker:retry") == 0  # the retried one dead
    dead = {entry["jid"]: entry for entry in map(json.loads, r.zrange("cogworker:dead", 0, -1))}
    said = f"feature 'misfit' (test_extending.{hook.title()}Raises) raised in {hook}: ValueError: {hook} is broken"
    assert dead[pushed["jid"]]["error_class"] == "django_cogworker.errors.FeatureError"
    assert dead[pushed["jid"]]["error_message"] == said
    assert (dead[pushed["jid"]]["retry_count"], dead[pushed["jid"]]["dead_reason"]) == (1, "retries exhausted")
    if hook == "decide":  # (it ran each attempt; the feature's decision failed, not the job)
        assert runs(token).count((pushed["jid"], [1])) == 2 and DecideRaises.asked.count(pushed["jid"]) == 2
        assert dead[failed["jid"]]["error_message"] == said + " (the job had raised RuntimeError: its own error)"
    else:  # (never run: its plan can't be made)
        assert runs(token) == []
        assert dead[failed["jid"]]["error_message"] == said
    assert r.llen(called.in_progress) == 0  # all acknowledged
    called.flush_stats()
    assert (r.get("cogworker:stat:failed"), r.get("cogworker:stat:processed")) == ("3", "3")  # (once per attempt)
    assert "died" not in caplog.text


def test_a_plan_a_feature_s_applies_raised_for_is_made_again_for_the_next_job():
    # Kept, a passing failure (a database away as applies read it) would fail every job of the
    # class until a restart.
    class Flaky(Feature):
        name = "flaky"
        answers = iter([ConnectionError("the database is away"), True])

        def applies(self, job_class) -> bool:
            answer = next(self.answers)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        def before(self, run: JobRun) -> Decision | None:
            return None

    plans = Plans([Flaky()])
    refused = plans.plan(Note)
    assert refused.refused and len(refused.before) == 1  # (its refusal alone: Flaky's before not in it)
    with pytest.raises(FeatureError, match=r"feature 'flaky' \(.*Flaky\) raised in applies: ConnectionError") as \
            caught:
        refused.before[0](None)  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, ConnectionError)
    made = plans.plan(Note)
    assert not made.refused and [hook.__func__.__name__ for hook in made.before] == ["before"]
    assert plans.plan(Note) is made  # (kept, once made)


class Marked(Feature):
    """A feature used only by a job whose payload carries its field (as a batch's ``bid``)."""

    def __init__(self, name: str, field: str):
        self.name, self.fields = name, (field,)

    def before(self, run: JobRun) -> Decision | None:
        return None


def test_a_payload_runs_through_the_features_of_the_fields_it_has_and_no_other():
    # A job of a batch ran every such feature's hooks (an expiry's, a lock's, a profile's...): the
    # features' own tests pass either way, so the plan is what is checked.
    batch, lock, expiry = Marked("batch", "bid"), Marked("lock", "unique_digest"), Marked("expiry", "expires_at")
    plan = Plans([batch, lock, expiry]).plan(Note)
    assert plan.fields == {"bid", "unique_digest", "expires_at"}

    def used(payload: dict) -> list[str]:
        return [hook.__self__.name for hook in plan.for_payload(payload).before]

    assert used({"jid": "j"}) == []
    assert used({"jid": "j", "bid": "b"}) == ["batch"]
    assert used({"jid": "j", "bid": "b", "expires_at": 1.0}) == ["batch", "expiry"]  # (in the features' order)
    assert used({"unique_digest": "d", "expires_at": 1.0, "bid": None}) == ["batch", "lock", "expiry"]
    assert plan.for_payload({"bid": "other"}) is plan.for_payload({"bid": "b"})  # (made once per set of fields)


class TakesItsParts(Feature):
    def __init__(self, parts):
        self.parts = parts


def returns_none(parts):
    return None


@pytest.mark.parametrize("entry, problem", [
    ("testproject.demo.audit.Audit", "is a Feature class, whose constructor can't take the worker's parts: name a "
                                     "function that takes them and returns the feature (docs/extending.md)"),
    ("test_extending.AUDIT", "is str 'testproject.demo.audit.audit', not a callable that takes the worker's parts "
                             "and returns a Feature"),
])
def test_a_features_entry_that_is_no_factory_fails_check_naming_it(entry, problem):
    # (A Feature class whose constructor takes the parts is a factory: TakesItsParts passes.)
    with override_settings(COGWORKER={"FEATURES": [entry, "test_extending.TakesItsParts"]}):
        errors = [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"]) if m.id in ("cogworker.E002",
                                                                                           "cogworker.E007")]
    assert errors == [("cogworker.E007", f'COGWORKER["FEATURES"] entry {entry!r} {problem}')]


def test_a_feature_factory_that_returns_none_stops_the_worker_at_startup_naming_its_entry(redis_url):
    config = build_config({"FEATURES": ["test_extending.returns_none"]}, {"COGWORKER_REDIS_URL": redis_url})
    client = make_redis(config)
    try:
        with pytest.raises(ConfigError, match=r"""COGWORKER\["FEATURES"\] entry 'test_extending.returns_none' """
                                              r"returned None: it must return a Feature or a list of them"):
            Launcher(config, client)
    finally:
        client.close()
