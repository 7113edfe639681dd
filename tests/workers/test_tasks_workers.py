"""The django.tasks backend (django_cogworker/tasks/backend.py) end to end: ``@task`` functions of the
demo app (testproject/demo/tasks.py) pushed by the API and run by a real ``runcogworker``.

Runs on Django 6.1 (django.tasks) and on Django 5.2 with the django-tasks backport: ``make test``
runs this module in both venvs.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_tasks.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time

import pytest
from helpers import FAST_ENV, REPO_ROOT, Worker, wait_until, worker

# Helpers shared with this subject's fast tests, defined there once.
from test_tasks import status

from django_cogworker.broker.keys import Keys
from django_cogworker.errors import JobExpired, JobTimeout
from django_cogworker.push import runtime
from django_cogworker.tasks.api import TaskResultStatus
from testproject.demo.tasks import add, async_add, doomed, explode, fail, flaky, hold, limited, perishable, spin

K = Keys()


def dead_entries(r) -> list[dict]:
    return [json.loads(raw) for raw in r.zrange(K.dead, 0, -1)]


def make_retries_due(r) -> None:
    for member in r.zrange(K.retry, 0, -1):
        r.zadd(K.retry, {member: 0}, xx=True)  # (skip the backoff)


def test_a_bad_option_in_settings_is_one_line_from_check_and_runcogworker_not_a_traceback(tmp_path):
    (tmp_path / "newcomer_settings.py").write_text(
        "from testproject.settings import *  # noqa\nTASKS['default']['OPTIONS']['RETRY'] = -1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
           "DJANGO_SETTINGS_MODULE": "newcomer_settings"}
    line = '?: (cogworker.E005) TASKS["default"]["OPTIONS"]["RETRY"] must be True, False or a count >= 0, got -1'
    for command in ("check", "runcogworker"):
        done = subprocess.run([sys.executable, "manage.py", command], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1 and line in done.stderr.splitlines(), done.stderr
        assert "Traceback" not in done.stderr


def test_a_task_that_raises_is_failed_after_one_attempt_by_default_and_kept_in_dead(tmp_path, r):
    # With a Job's default (retry True) it read READY and ran 25 more times.
    result = explode.enqueue("no retries asked for")
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: status(explode, result.id) == TaskResultStatus.FAILED and r.zcard(K.dead) == 1,
                   timeout=15, message="failed, and filed in dead")
        w.term()
        assert w.wait(30) == 0
    failed = explode.get_result(result.id)
    assert failed.attempts == 1 and [e.exception_class for e in failed.errors] == [ValueError]
    assert r.zcard(K.retry) == 0
    [dead] = dead_entries(r)  # visible to operators (the admin's dead set), as any job out of retries
    assert (dead["jid"], dead["class"], dead["retry"], dead["dead_reason"]) == (
        result.id, "testproject.demo.tasks.explode", 0, "retries exhausted")


def test_options_retry_runs_a_failing_task_that_many_times_more_and_it_is_logged_failed_once(tmp_path, r):
    # `doomed` is on the "retrying" backend: OPTIONS["RETRY"] = 2 (testproject/settings.py).
    result = doomed.enqueue("doomed-attempts")
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: status(doomed, result.id) == TaskResultStatus.READY and r.zcard(K.retry) == 1,
                   timeout=15, message="first attempt filed for retry")

        def out_of_retries():
            make_retries_due(r)
            return status(doomed, result.id) == TaskResultStatus.FAILED and r.zcard(K.dead) == 1

        wait_until(out_of_retries, timeout=20, message="failed after its retries, and filed in dead")
        w.term()
        assert w.wait(30) == 0
    assert r.lrange("doomed-attempts", 0, -1) == ["1", "2", "3"]
    failed = doomed.get_result(result.id)
    assert failed.attempts == 3 and len(failed.errors) == 3
    [dead] = dead_entries(r)
    assert (dead["jid"], dead["retry"], dead["retry_count"]) == (result.id, 2, 2)
    # django.tasks logs task_finished: FAILED once, for the last attempt; the two retried
    # attempts said FAILED while their result read READY.
    lines = [line for line in w.log().splitlines() if f"Task id={result.id} " in line]
    assert [line.rpartition(" state=")[2] for line in lines] == ["RUNNING"] * 3 + ["FAILED"], lines


def test_enqueue_then_get_result_through_ready_running_successful(tmp_path, r):
    result = hold.enqueue("held")
    assert result.status == TaskResultStatus.READY
    waiting = hold.get_result(result.id)
    assert waiting.status == TaskResultStatus.READY and waiting.args == ["held"] and waiting.enqueued_at
    with worker(tmp_path) as w:
        identity = w.wait_ready()
        wait_until(lambda: r.lrange("held", 0, -1) == ["started"], message="task started")
        running = hold.get_result(result.id)
        assert running.status == TaskResultStatus.RUNNING
        assert running.worker_ids == [identity] and running.started_at and running.last_attempted_at
        assert not running.is_finished
        r.set("held:go", 1)
        wait_until(lambda: status(hold, result.id) == TaskResultStatus.SUCCESSFUL, message="task done")
        done = hold.get_result(result.id)
        assert done.return_value == "held"
        assert done.finished_at >= done.started_at >= done.enqueued_at
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "held"
        w.term()
        assert w.wait(30) == 0
    ttl = r.ttl(K.result(result.id))
    assert 3000 < ttl <= 3600  # OPTIONS["RESULT_TTL"] of testproject/settings.py


def test_defer_async_and_aenqueue(tmp_path, r):
    run_after = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    deferred = add.using(run_after=run_after).enqueue(20, 22)
    assert r.zcard(K.schedule) == 1 and r.llen(K.queue("default")) == 0  # waits in the schedule set
    assert add.get_result(deferred.id).status == TaskResultStatus.READY
    coroutine = async_add.enqueue(1, 2)

    async def through_the_async_api():
        result = await add.aenqueue(3, 4)
        return result, await add.aget_result(result.id)

    awaited, read_back = asyncio.run(through_the_async_api())
    assert read_back.id == awaited.id and read_back.status == TaskResultStatus.READY
    with worker(tmp_path) as w:
        w.wait_ready()
        for task, result, value in ((async_add, coroutine, 3), (add, awaited, 7), (add, deferred, 42)):
            wait_until(lambda t=task, res=result: status(t, res.id) == TaskResultStatus.SUCCESSFUL, timeout=15,
                       message=f"{task.name} done")
            assert task.get_result(result.id).return_value == value
        assert add.get_result(deferred.id).started_at >= run_after
        w.term()
        w.wait(30)


def test_retry_with_context_then_success_and_a_failure(tmp_path, r):
    retried = flaky.enqueue("attempts", 2)  # fails twice, then returns
    failed = fail.enqueue("no good")

    def retries_due_now():
        make_retries_due(r)
        return status(flaky, retried.id) == TaskResultStatus.SUCCESSFUL

    with worker(tmp_path) as w:
        identity = w.wait_ready()
        wait_until(lambda: r.llen("attempts") == 1, message="first attempt")
        wait_until(lambda: status(flaky, retried.id) == TaskResultStatus.READY and r.zcard(K.retry) == 1,
                   message="filed for retry")
        between = flaky.get_result(retried.id)
        assert [e.exception_class for e in between.errors] == [RuntimeError]
        wait_until(retries_due_now, timeout=20, message="succeeded on a retry")
        done = flaky.get_result(retried.id)
        assert done.return_value == {"attempt": 3, "result_id": retried.id}
        assert r.lrange("attempts", 0, -1) == ["1", "2", "3"]  # context.attempt
        assert done.attempts == 3 and done.worker_ids == [identity] * 3
        assert ["attempt 1 fails" in done.errors[0].traceback, "attempt 2 fails" in done.errors[1].traceback] == [
            True, True]

        wait_until(lambda: status(fail, failed.id) == TaskResultStatus.FAILED and r.zcard(K.dead) == 1,
                   message="failed, and filed in dead")
        gone = fail.get_result(failed.id)
        assert gone.errors[0].exception_class is ValueError and "no good" in gone.errors[0].traceback
        with pytest.raises(ValueError):
            gone.return_value  # noqa: B018 - django.tasks raises for a failed task's value
        [dead] = dead_entries(r)
        assert (dead["class"], dead["queue"], dead["error_message"]) == ("testproject.demo.tasks.fail", "mail",
                                                                          "no good")
        w.term()
        w.wait(30)


def test_a_task_past_its_timeout_fails_with_job_timeout(tmp_path, r):
    result = spin.enqueue(30)
    with worker(tmp_path) as w:
        w.wait_ready()
        # The result is recorded as failed just before the job is filed in dead: wait for both.
        wait_until(lambda: status(spin, result.id) == TaskResultStatus.FAILED and r.zcard(K.dead) == 1, timeout=15,
                   message="timed out, and filed in dead")
        failed = spin.get_result(result.id)
        assert failed.errors[0].exception_class is JobTimeout
        assert "JobTimeout: the job ran past its timeout of 0.5s" in failed.errors[0].traceback
        [dead] = dead_entries(r)
        assert dead["error_class"] == "django_cogworker.errors.JobTimeout"
        assert dead["error_message"] == "the job ran past its timeout of 0.5s"
        assert dead["dead_reason"] == "retries exhausted"
        w.term()
        assert w.wait(30) == 0  # (the processor that ran it lived on)
    assert "ran past its timeout of 0.5s" in w.log()


def test_a_payload_naming_an_undiscovered_function_is_filed_with_its_reason_and_nothing_imported(tmp_path, r):
    # (Filed as any unknown job: retried, here with retry 0 straight to dead.)
    client = runtime.get_client()
    jid = client.push({"jid": "sneaky1", "class": "testproject.demo.undiscovered.sneaky", "args": [], "kwargs": {},
                       "queue": "default", "retry": 0, "created_at": time.time()}, on_commit=False)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: r.zcard(K.dead) == 1, message="filed in dead")
        w.term()
        w.wait(30)
    [dead] = dead_entries(r)
    assert dead["jid"] == jid
    assert dead["error_message"].startswith("no job is registered as 'testproject.demo.undiscovered.sneaky' in "
                                            "this worker")
    assert dead["error_class"] == "django_cogworker.errors.UnknownJobError"
    assert not r.exists("imported:undiscovered") and not r.exists("ran:undiscovered")


def test_a_task_with_limits_runs_within_them_and_its_results_read_successful(tmp_path, r):
    results = [limited.enqueue("lt", 0.2) for _ in range(8)]
    with Worker("-c", "8", env={**FAST_ENV, "DEMO_LIMIT_LEASE": "2"}, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: all(status(limited, x.id) == TaskResultStatus.SUCCESSFUL for x in results), timeout=30,
                   message="limited tasks not all done")
    assert r.get("lt:max") == "3"  # (8 processors, 8 tasks: only the limit kept them to 3)
    assert {limited.get_result(x.id).return_value for x in results} == {"done"}


def test_a_task_that_expired_before_any_worker_took_it_reads_failed_with_job_expired(tmp_path, r):
    result = perishable.enqueue("perished")
    time.sleep(1)  # (expires_in 0.5: expired before the worker starts)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: status(perishable, result.id) == TaskResultStatus.FAILED, timeout=15,
                   message="dropped, its result failed")
        w.term()
        assert w.wait(30) == 0
    failed = perishable.get_result(result.id)
    assert failed.errors[0].exception_class is JobExpired
    assert failed.errors[0].exception_class_path == "django_cogworker.errors.JobExpired"
    assert "before it could run" in failed.errors[0].traceback
    assert failed.finished_at and not failed.started_at and failed.attempts == 0
    assert not r.exists("perished")  # never ran
    assert r.get(K.stat_expired) == "1" and r.zcard(K.dead) == 0 and r.zcard(K.retry) == 0
