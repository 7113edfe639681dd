"""The django.tasks backend (django_cogworker/tasks/backend.py) end to end: ``@task`` functions of the
demo app (testproject/demo/tasks.py) pushed by the API and run by a real ``runcogworker``.

Runs on Django 6.1 (django.tasks) and on Django 5.2 with the django-tasks backport: ``make test``
runs this module in both venvs.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from django_cogworker.broker.keys import Keys
from django_cogworker.errors import Cancelled
from django_cogworker.features.cancellation import cancel
from django_cogworker.tasks.api import InvalidTask, TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_cogworker.tasks.backend import CogworkerBackend
from testproject.demo.tasks import add, explode, flaky

K = Keys()


def status(task, result_id):
    return task.get_result(result_id).status


def test_the_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, CogworkerBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    with pytest.raises(InvalidTask):
        add.using(priority=101)  # Django's range is -100..100
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


def _waiting(rb, queue: str) -> list[bytes]:
    """The raw payloads waiting in ``queue``: its list, and its priorities' zset (where the core's push
    writes a prioritized job: broker/keys/families.py's LaneKeys)."""
    found = [*rb.lrange(K.queue(queue), 0, -1), *rb.zrange(K.lanes(queue).prio, 0, -1)]
    return [raw for raw in found if not raw.startswith(b'{"lane":')]  # (a doorbell the push rings: no job)


@pytest.mark.parametrize("priority", [5, -100, 100])
def test_a_task_s_priority_is_its_job_s_priority_the_payload_s_first_field(rb, priority):
    result = add.using(priority=priority).enqueue(1, 2)
    [raw] = _waiting(rb, add.queue_name)
    assert raw.startswith(b'{"priority":%d,' % priority)  # (the fetch tells it by its opening text)
    payload = json.loads(raw)
    assert payload["jid"] == result.id and payload["priority"] == priority
    assert payload["task"]["priority"] == priority


def test_a_task_of_the_default_priority_is_a_plain_job(rb):
    add.enqueue(1, 2)
    [raw] = _waiting(rb, add.queue_name)
    assert "priority" not in json.loads(raw)
