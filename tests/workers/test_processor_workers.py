"""Processors (engine/run/processor.py) in a real worker process: run, settle, survive.

The job's path on its own is tested on a processor called on the test's thread, in
tests/fast/test_processor.py; here, the whole of it in a ``runcogworker`` process.
"""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from engine_fixtures import (
    launcher_factory_fixture,  # noqa: F401, F811 - the launcher_factory fixture
)
from helpers import FAST_ENV, REPO_ROOT, Worker, wait_until, worker

# Helpers shared with this subject's fast tests, defined there once.
from test_processor import dead_entries, retry_entries

from django_cogworker.broker.keys import Keys
from django_cogworker.push import payload as payloads
from testproject.demo.jobs import FailJob, ListFolderJob, RecordJob

K = Keys()


def test_a_worker_acks_retries_and_buries_what_it_runs_and_counts_it(tmp_path, r):
    # The whole path once, in a real process: the fetch, the processors' runs, the acks held for the
    # fetch's round trip, the heartbeat's counts and the TERM that ends it with nothing left behind.
    key = "test:processor:whole"
    jobs = [{"jid": f"ok-{i}", "class": RecordJob.name, "args": [key], "kwargs": {}, "queue": "default"}
            for i in range(3)]
    jobs.append({"jid": "fails", "class": FailJob.name, "args": ["on fire"], "kwargs": {}, "queue": "default",
                 "retry": 2})
    r.lpush(K.queue("default"), *(payloads.encode(job) for job in jobs), "{this is not json")

    with worker(tmp_path) as w:
        identity = w.wait_ready()
        wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1, timeout=20, message="filed")
        try:
            wait_until(lambda: r.get(K.stat_processed) == "4", timeout=20, message="counted")
        except AssertionError as exc:  # (what it read instead, for the next look at a failure)
            raise AssertionError(f"{exc}; processed: {r.get(K.stat_processed)!r}; log:\n{w.log()[-4000:]}") from None
        wait_until(lambda: r.llen(K.in_progress(identity)) == 0, message="acknowledged")
        w.term()
        assert w.wait(30) == 0

    assert sorted(r.lrange(key, 0, -1)) == ["ok-0", "ok-1", "ok-2"]
    (retried,), (dead,) = retry_entries(r), dead_entries(r)
    assert (retried["jid"], retried["error_message"], retried["retry_count"]) == ("fails", "on fire", 0)
    assert (dead["class"], dead["raw"]) == ("(unparseable)", "{this is not json")
    assert r.get(K.stat_failed) == "1" and r.llen(K.queue("default")) == 0
    assert "died" not in w.log() and not r.exists(K.in_progress(identity))


def test_a_worker_files_a_failure_whose_message_names_a_file_that_is_not_utf8(tmp_path, r):
    # os.listdir gives "caf\udce9.bad" for the file b"caf\xe9.bad": its failure message, UTF-8 can't
    # carry it. Its filing raised on every try, taken for an outage: the job sat on the in-progress
    # list, "pending settlement still fails" every beat, couldn't be handed over at TERM, and died
    # "orphaned N times", its real error lost.
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / os.fsdecode(b"caf\xe9.bad")).touch()
    for jid, retry in (("listing", 1), ("listing-no-retry", 0)):
        r.lpush(K.queue("default"), payloads.encode({"jid": jid, "class": ListFolderJob.name, "args": [str(folder)],
                                                     "kwargs": {}, "queue": "default", "retry": retry,
                                                     "backtrace": True}))

    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        identity = w.wait_ready()
        wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1, timeout=20, message="filed")
        wait_until(lambda: r.llen(K.in_progress(identity)) == 0, message="acknowledged")
        time.sleep(1.5)  # three beats
        w.term()
        assert w.wait(30) == 0

    (retried,), (dead,) = retry_entries(r), dead_entries(r)
    assert (retried["jid"], dead["jid"]) == ("listing", "listing-no-retry")
    for filed in (retried, dead):
        assert (filed["error_class"], filed["error_message"]) == ("ValueError", "cannot process caf\\udce9.bad")
        assert filed["error_backtrace"][-1] == "ValueError: cannot process caf\\udce9.bad"
        # (From the job's own code in: the worker's frames down to perform are left out.)
        assert filed["error_backtrace"][1].lstrip().startswith(f'File "{REPO_ROOT / "testproject"}')
    assert dead["dead_reason"] == "retries exhausted"
    log = w.log()
    assert "class=testproject.demo.jobs.ListFolderJob jid=listing django_cogworker.engine.run.processor: fail" in log
    assert "still fails" not in log and "kept in memory" not in log
    assert r.llen(K.unsettled) == 0 and not r.exists(K.in_progress(identity))


# A project's feature with a bug in one hook, for a real worker: written to tmp_path with settings
# naming it (the suite's own settings, plus FEATURES).
MISFIT_FEATURES = '''
from django_cogworker.features import Feature


class DecideRaises(Feature):
    name = "misfit"

    def decide(self, run):
        raise ValueError("decide is broken")


class AppliesRaises(Feature):
    name = "misfit"

    def applies(self, job_class):
        raise ValueError("applies is broken")


def decide_raises(parts):
    return DecideRaises()


def applies_raises(parts):
    return AppliesRaises()
'''


@pytest.mark.parametrize("hook", ["decide", "applies"])
def test_a_worker_files_the_jobs_of_a_feature_whose_hook_raises_retry_then_dead_and_no_processor_dies(
        tmp_path, r, hook):
    # decide raising: each job ran once per worker start (1, 2, 3 runs over three starts), never
    # reached retry or dead, and its processor died ("processor 3 died; replacing it"); applies
    # raising killed every processor on every job.
    (tmp_path / "misfit_features.py").write_text(MISFIT_FEATURES)
    (tmp_path / "misfit_settings.py").write_text(
        f"from {settings.SETTINGS_MODULE} import *  # noqa\n"
        f"COGWORKER = {{**COGWORKER, 'FEATURES': ['misfit_features.{hook}_raises']}}  # noqa\n")
    key = f"test:misfit:{hook}:runs"
    r.lpush(K.queue("default"), payloads.encode({"jid": "misfit", "class": RecordJob.name, "args": [key],
                                                 "kwargs": {}, "queue": "default", "retry": 1}))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]), "DJANGO_SETTINGS_MODULE": "misfit_settings"}

    with worker(tmp_path, env=env) as w:
        identity = w.wait_ready()
        wait_until(lambda: r.zcard(K.retry) == 1, timeout=20, message="its first attempt filed for retry")
        r.zadd(K.retry, {r.zrange(K.retry, 0, 0)[0]: 0}, xx=True)  # (its retry due now, not in 15 s or more)
        wait_until(lambda: r.zcard(K.dead) == 1, timeout=20, message="its second attempt filed in dead")
        wait_until(lambda: r.llen(K.in_progress(identity)) == 0, message="acknowledged")
        w.term()
        assert w.wait(30) == 0

    (dead,) = dead_entries(r)
    assert dead["jid"] == "misfit" and dead["error_class"] == "django_cogworker.errors.FeatureError"
    assert dead["error_message"] == (f"feature 'misfit' (misfit_features.{hook.title()}Raises) raised in {hook}: "
                                     f"ValueError: {hook} is broken")
    assert (dead["retry_count"], dead["dead_reason"]) == (1, "retries exhausted")
    assert r.llen(key) == (2 if hook == "decide" else 0)  # (it ran on each attempt; never, with no plan)
    assert (r.get(K.stat_failed), r.get(K.stat_processed)) == ("2", "2")  # (once per attempt)
    log = w.log()
    assert log.count("FeatureError: feature 'misfit'") >= 2  # (each attempt's fail line, its trace)
    assert "died" not in log and "Traceback" in log
    assert r.zcard(K.retry) == 0 and r.llen(K.queue("default")) == 0
