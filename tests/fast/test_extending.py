"""A project's own feature (docs/extending.md): named in COGWORKER["FEATURES"], it sees every job
a worker settles, through the same hooks as the package's features.

The example is testproject/demo/audit.py: an audit trail of each job's outcome in a Redis stream.
"""

from __future__ import annotations

import time

import pytest
from django.core import checks
from django.test import override_settings
from engine_fixtures import Boom, Note, launcher_factory_fixture, new_token, runs  # noqa: F401 - launcher_factory
from helpers import wait_until

from django_cogworker.conf import build_config
from django_cogworker.engine.process.launcher import Launcher
from django_cogworker.errors import ConfigError
from django_cogworker.features import Decision, Feature, JobRun, Outcome
from django_cogworker.push.job import JobSetter

AUDIT = "testproject.demo.audit.audit"


def audited(r) -> dict[str, dict[str, str]]:
    """jid -> the audit entry of its last settlement."""
    return {fields["jid"]: fields for _id, fields in r.xrange("cogworker:audit")}


def test_an_audit_feature_sees_every_job_s_outcome_run_or_not(launcher_factory, r):
    token = new_token()
    running = launcher_factory(FEATURES=[AUDIT])
    ok = running.push(Note, token, 1)
    failed = running.push(Boom, token)
    expired = JobSetter(Note, {}).build([token, 2], {})
    expired["expires_at"] = time.time() - 60  # (as a push with expires_in, a minute after it)
    running.client.push(expired)

    wait_until(lambda: len(audited(r)) == 3, timeout=15, message="three jobs audited")
    entries = audited(r)
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


def test_a_feature_s_before_settles_a_job_unrun_and_its_bug_in_after_is_logged_not_the_job_s(launcher_factory, r,
                                                                                              caplog):
    token = new_token()
    running = launcher_factory(FEATURES=["test_extending.refuses_boom"])
    note = running.push(Note, token, 1)
    boom = running.push(Boom, token)

    wait_until(lambda: all(f"Refuses.after failed for jid={job['jid']}" in caplog.text for job in (note, boom)),
               timeout=15, message="both settled, the feature's bug logged for each")
    wait_until(lambda: r.llen(running.in_progress) == 0, message="both acked")
    assert runs(token) == [(note["jid"], [1])]  # Boom never ran
    assert r.zcard("cogworker:retry") == 0 and r.zcard("cogworker:dead") == 0  # acked, as the Decision said


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
