"""The django.tasks backend (django_cogworker/tasks/backend.py) end to end: ``@task`` functions of the
demo app (testproject/demo/tasks.py) pushed by the API and run by a real ``runcogworker``.

Runs on Django 6.1 (django.tasks) and on Django 5.2 with the django-tasks backport: ``make test``
runs this module in both venvs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import FAST_ENV, REPO_ROOT, Worker, wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.errors import Cancelled, JobExpired, JobTimeout
from django_cogworker.features.cancellation import cancel
from django_cogworker.push import runtime
from django_cogworker.tasks.api import InvalidTask, TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_cogworker.tasks.backend import CogworkerBackend
from testproject.demo.tasks import add, async_add, doomed, explode, fail, flaky, hold, limited, perishable, spin

K = Keys()


def worker(tmp_path, *args):
    return Worker(*args, env=FAST_ENV, log_path=tmp_path / "worker.log")


def status(task, result_id):
    return task.get_result(result_id).status


def dead_entries(r) -> list[dict]:
    return [json.loads(raw) for raw in r.zrange(K.dead, 0, -1)]


def make_retries_due(r) -> None:
    for member in r.zrange(K.retry, 0, -1):
        r.zadd(K.retry, {member: 0}, xx=True)  # (skip the backoff)


def test_the_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, CogworkerBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, False)
    with pytest.raises(InvalidTask):
        add.using(priority=5)  # refused, not silently ignored: nothing orders the work by priority
    with pytest.raises(InvalidTask):
        add.using(queue_name="elsewhere")  # not in QUEUES
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("no-such-id")
    with pytest.raises(TypeError, match="JSON"):
        add.enqueue(dt.datetime.now(), 1)  # the JSON check every push gets


BACKEND = "django_cogworker.tasks.CogworkerBackend"


@pytest.mark.parametrize("params,expected", [
    ({"OPTIONS": {"RESULT_TTL": 0}}, 'TASKS["t"]["OPTIONS"]["RESULT_TTL"] must be a positive number of seconds, got 0'),
    ({"OPTIONS": {"TIMEOUT": "soon"}}, 'TASKS["t"]["OPTIONS"]["TIMEOUT"] must be a positive number of seconds or '
                                       "None, got 'soon'"),
    # (Past what Redis can expire; 10**400 raised OverflowError.)
    ({"OPTIONS": {"RESULT_TTL": 1e16}}, 'TASKS["t"]["OPTIONS"]["RESULT_TTL"] must be at most 1e9 seconds (about 31 '
                                        'years), got 1e+16'),
    ({"OPTIONS": {"TIMEOUT": 10**400}}, 'TASKS["t"]["OPTIONS"]["TIMEOUT"] must be at most 1e9 seconds (about 31 '
                                        f"years), got 1{'0' * 56}..."),
    ({"OPTIONS": {"RETRY": -1}}, 'TASKS["t"]["OPTIONS"]["RETRY"] must be True, False or a count >= 0, got -1'),
    ({"OPTIONS": {"RETRY": "3"}}, 'TASKS["t"]["OPTIONS"]["RETRY"] must be True, False or a count >= 0, got \'3\''),
    ({"OPTIONS": {"RETRIES": 1}}, 'TASKS["t"]["OPTIONS"]["RETRIES"] is not an option (did you mean "RETRY"?)'),
    ({"OPTIONS": {"RESULTS": 1}}, 'TASKS["t"]["OPTIONS"]["RESULTS"] is not an option (did you mean "RESULT_TTL"?)'),
    ({"OPTIONS": {"MODULES": ["testproject.demo.nowhere"]}},
     'TASKS["t"]["OPTIONS"]["MODULES"]: no module \'testproject.demo.nowhere\' to import'),
    ({"QUEUES": "default"}, 'TASKS["t"]["QUEUES"] must be a list of queue names (non-empty strings without spaces), '
                            "got 'default'"),
    ({"RETRY": 2}, 'TASKS["t"]["RETRY"] is not a key of the entry (did you mean TASKS["t"]["OPTIONS"]["RETRY"]?)'),
])
def test_a_bad_option_is_a_check_error_a_refused_start_and_a_refused_push_naming_it(params, expected, r):
    """It was an ImproperlyConfigured from the backend's construction: out of django.setup(), a
    40-line traceback, as @task builds the backend while Django starts."""
    from django.core import checks
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.test import override_settings

    from django_cogworker.errors import ConfigError

    backend = CogworkerBackend("t", {"BACKEND": BACKEND, **params})  # (no raise)
    with override_settings(TASKS={"t": {"BACKEND": BACKEND, **params}}):
        assert [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"]) if m.level >= checks.ERROR] == [
            ("cogworker.E005", expected)]
        with pytest.raises(CommandError) as refused:
            call_command("runcogworker")  # (call_command runs no system check: the command's own)
    assert str(refused.value) == f"invalid configuration:\n  {expected}"
    with pytest.raises(ConfigError) as pushed:
        backend.enqueue(add, [1, 2], {})
    assert str(pushed.value) == expected
    assert r.keys("*") == []  # (no job, no result record)


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


def never_a_task():
    """Decorated with a bad option by a test: refused, so never a task."""


def test_a_bad_retry_on_a_task_is_refused_naming_it():
    from django_cogworker.tasks.api import task

    for bad in (2.5, -1, "3"):
        with pytest.raises(InvalidTask, match=rf"test_tasks.never_a_task: @task\(retry=...\) must be True, False "
                                              rf"or a count >= 0, got {re.escape(repr(bad))}"):
            task(retry=bad)(never_a_task)


def test_bad_limits_or_expires_in_on_a_task_are_refused_naming_them():
    from django_cogworker.tasks.api import task

    with pytest.raises(InvalidTask, match=r"test_tasks.never_a_task: @task\(limits=...\)\[0\] must be a Limiter"):
        task(limits=["partner:3"])(never_a_task)
    with pytest.raises(InvalidTask, match=r"test_tasks.never_a_task: @task\(limits=...\) must be a list of limiters"):
        task(limits="partner:3")(never_a_task)
    with pytest.raises(InvalidTask, match=r"test_tasks.never_a_task: @task\(expires_in=...\) must be a positive "
                                          r"number of seconds or None, got 0"):
        task(expires_in=0)(never_a_task)


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


def test_a_unique_task_is_pushed_once_and_a_periodic_entry_may_name_a_task(r):
    from django_cogworker.push.periodic import build_entries
    from testproject.demo.tasks import unique_add

    first = unique_add.enqueue(1, 1)
    again = unique_add.enqueue(1, 1)  # a duplicate while the first is queued: not pushed
    assert r.llen(K.queue("default")) == 1
    assert unique_add.get_result(first.id).status == TaskResultStatus.READY
    with pytest.raises(TaskResultDoesNotExist):
        unique_add.get_result(again.id)
    [entry] = build_entries([{"name": "adds", "cron": "* * * * *", "job": "testproject.demo.tasks.add",
                              "args": [1, 2]}], "UTC")
    assert entry.job == "testproject.demo.tasks.add"


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_a_task_is_pushed_at_commit(r):
    from django.db import transaction

    with transaction.atomic():
        result = add.enqueue(1, 2)
        assert r.llen(K.queue("default")) == 0 and not r.exists(K.result(result.id))
    assert r.llen(K.queue("default")) == 1
    assert add.get_result(result.id).status == TaskResultStatus.READY


def test_a_task_queue_no_worker_serves_is_warned_of():
    backend = CogworkerBackend("t", {"QUEUES": ["default", "mail", "reports"]})
    [warning] = backend.check()
    assert warning.id == "cogworker.W101" and "'reports'" in warning.msg
    assert CogworkerBackend("t", {"QUEUES": ["default"]}).check() == []


def test_the_testing_modes_take_tasks(r):
    from django_cogworker import testing
    from django_cogworker.tasks.backend import job_class_for

    with testing.fake() as jobs:
        flaky.enqueue("fake-attempts", 0)
        assert jobs.args(job_class_for(flaky)) == [["fake-attempts", 0]]
        assert jobs.drain() == 1
    with testing.inline():
        flaky.enqueue("inline-attempts", 0)
    assert r.lrange("fake-attempts", 0, -1) == r.lrange("inline-attempts", 0, -1) == ["1"]  # context.attempt
    assert not r.keys(K.result("*"))  # (no result record: nothing is pushed to Redis)


def test_a_result_reads_where_its_queue_is_not_listed(settings):
    result = add.using(queue_name="mail").enqueue(1, 2)
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default"]}}  # (another process's TASKS)
    read = add.get_result(result.id)
    assert read.status == TaskResultStatus.READY and read.task.queue_name == "default"


def test_the_inline_mode_tells_django_tasks_a_task_failed(r):
    from django_cogworker import testing
    from django_cogworker.tasks.api import task_finished

    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.task.name, task_result.status))

    task_finished.connect(receiver)
    try:
        with testing.inline(), pytest.raises(ValueError, match="inline failure"):
            explode.enqueue("inline failure")  # (no retries in the testing modes: its failure is final)
    finally:
        task_finished.disconnect(receiver)
    assert seen == [("explode", TaskResultStatus.FAILED)]


def test_a_signal_receiver_that_raises_fails_neither_the_push_nor_the_task(r, caplog):
    from django_cogworker import testing
    from django_cogworker.tasks.api import task_enqueued, task_finished

    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    task_enqueued.connect(broken)
    task_finished.connect(broken)
    try:
        pushed = add.enqueue(1, 2)  # a push that went through must not look failed: it would be pushed again
        assert r.llen(K.queue("default")) == 1
        with testing.inline():
            flaky.enqueue("signal-attempts", 0)  # succeeds: an error here would have it retried, run again
    finally:
        task_enqueued.disconnect(broken)
        task_finished.disconnect(broken)
    assert add.get_result(pushed.id).status == TaskResultStatus.READY
    assert r.lrange("signal-attempts", 0, -1) == ["1"]
    assert caplog.text.count("receiver bug") >= 2


# -- flow control: limits, expiry, cancel -----------------------------------------------------------


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


def test_a_task_cancelled_while_waiting_reads_failed_with_cancelled(r):
    result = add.enqueue(1, 2)

    assert cancel(result.id) == "removed"

    failed = add.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at
    assert failed.errors[0].exception_class_path == "django_cogworker.errors.Cancelled"
    assert failed.errors[0].exception_class is Cancelled
    assert "cancelled before it ran" in failed.errors[0].traceback
    assert r.llen(K.queue("default")) == 0 and r.get(K.stat_cancelled) == "1"
    assert 3000 < r.ttl(K.result(result.id)) <= 3600  # (kept as long as its task's results are)
