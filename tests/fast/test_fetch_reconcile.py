"""Reliable fetch trusts the process's own record over Redis: jobs on its in-progress list that it
never received (a fetch whose reply was lost) are requeued while it lives, not stranded until it dies."""

from __future__ import annotations

import collections

import redis
from engine_fixtures import Boom, Note, fail_acks, launcher_factory_fixture, new_token, runs  # noqa: F401 - fixture
from helpers import wait_until

from django_cogworker.engine.process import launcher as launcher_module
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import JobSetter


def test_a_job_stranded_on_our_list_runs_after_two_reconciles(launcher_factory, monkeypatch, r):
    monkeypatch.setattr(launcher_module, "RECONCILE_INTERVAL", 0.3)
    running = launcher_factory()
    token = new_token()
    stranded = JobSetter(Note, {}).build([token, "stranded"], {})
    # What Redis holds after a fetch script ran but its reply never arrived.
    r.lpush(running.in_progress, payloads.encode(stranded))

    wait_until(lambda: runs(token), timeout=10, message="stranded job requeued and run")
    assert [jid for jid, _ in runs(token)] == [stranded["jid"]]
    wait_until(lambda: r.llen(running.in_progress) == 0, timeout=5, message="in-progress list emptied")


def test_reconcile_leaves_known_jobs_and_needs_two_sightings(launcher_factory, r):
    running = launcher_factory(QUEUES=["idle-queue-nobody-pushes-to"])
    fetch = running.launcher.fetch
    known_raw = payloads.encode(JobSetter(Note, {}).build([new_token()], {})).encode()
    unknown_raw = payloads.encode(JobSetter(Note, {}).build([new_token()], {})).encode()
    r.lpush(fetch.in_progress, known_raw, unknown_raw)
    known = collections.Counter([known_raw])

    suspects = fetch.reconcile(known, collections.Counter())
    assert suspects == collections.Counter([unknown_raw])  # first sighting: only suspected
    assert r.llen(fetch.in_progress) == 2

    suspects = fetch.reconcile(known, suspects)
    assert not suspects
    assert [x.encode() for x in r.lrange(fetch.in_progress, 0, -1)] == [known_raw]  # known job untouched
    assert r.lrange("cogworker:queue:default", 0, -1) == [unknown_raw.decode()]


def test_reconcile_still_works_while_settlements_are_pending(launcher_factory, monkeypatch, r):
    # An ack and a retry filing that failed (Redis away for them) wait in the process's record; the
    # reconcile used to crash on them (a settlement counted as a number), stranding jobs for good.
    monkeypatch.setattr(launcher_module, "RECONCILE_INTERVAL", 0.3)
    running = launcher_factory()
    fetch = running.launcher.fetch
    token = new_token()
    # Both failures are in place before either job is pushed: a worker this quick would otherwise
    # run and ack the first one before its ack could be made to fail.
    acked = JobSetter(Note, {}).build([token, "ack fails"], {})
    fail_acks(fetch, lambda raw: payloads.decode(raw)["jid"] == acked["jid"], monkeypatch)
    real_file = fetch.file

    def file(raw, filing, trim):
        if filing.payload["jid"] == failed["jid"]:
            raise redis.ConnectionError("Redis went away (injected)")
        real_file(raw, filing, trim)

    monkeypatch.setattr(fetch, "file", file)
    failed = JobSetter(Boom, {}).build([token], {})
    running.client.push(acked)
    running.client.push(failed)
    wait_until(lambda: len(running.manager.pending_settlements()) == 2, timeout=10, message="both pending")

    stranded = JobSetter(Note, {}).build([token, "stranded"], {})
    r.lpush(running.in_progress, payloads.encode(stranded))
    wait_until(lambda: (stranded["jid"], ["stranded"]) in runs(token), timeout=10,
               message="stranded job requeued and run")
    assert len(running.manager.pending_settlements()) == 2  # still known: neither requeued nor run again
    assert runs(token).count(failed["jid"]) == 1
