"""joblog: the running job's jid and class on the records logged while it runs, and what a real
``runcogworker`` prints with them (its handler, management/commands/runcogworker.py): each record
once, with the job's context, whatever the project's LOGGING.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_joblog.py.
"""

from __future__ import annotations

import re

import pytest
from helpers import wait_until, worker

from django_cogworker.broker.keys import Keys
from django_cogworker.tasks.api import SOURCE, TaskResultStatus
from testproject.demo.jobs import LoggerJob, LogJob, RecordJob
from testproject.demo.tasks import fail

K = Keys()


# A line of runcogworker's handler, up to its level: time, pid, thread.
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \d+ cogworker-processor-\d+"


TASKS_LOGGER = r"django\.tasks" if SOURCE == "django.tasks" else "django_tasks"


class AnyMatch:
    """Equal to a string the regular expression matches whole (in a list compared with ==)."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and re.fullmatch(self.pattern, other) is not None

    def __repr__(self) -> str:
        return f"AnyMatch({self.pattern!r})"


def test_a_job_s_records_carry_its_class_and_jid_whatever_the_project_s_logging(tmp_path, r):
    # testproject's LOGGING: handlers for its own loggers, none on the root; here its handler
    # has no filter though its format shows the job's context (KeyError: "--- Logging error ---"),
    # and "testproject" propagates. A job's line on a logger the project routes nowhere printed
    # nothing at all.
    with worker(tmp_path, env={"TESTPROJECT_LOGGING_PLAIN": "1"}) as w:
        w.wait_ready()
        unrouted = LoggerJob.perform_async("someapp", "hello from someapp")
        routed = LogJob.perform_async("routed")
        wait_until(lambda: "hello from someapp" in w.log() and "warning: routed" in w.log(), timeout=15)
        w.term()
        assert w.wait(30) == 0
    log = w.log()
    assert [line for line in log.splitlines() if "hello from someapp" in line] == [
        AnyMatch(rf"{STAMP} INFO class=testproject\.demo\.jobs\.LoggerJob jid={unrouted} someapp: hello from someapp")]
    # Printed by the project's handler; runcogworker's, on the root, doesn't print it again.
    assert [line for line in log.splitlines() if "info: routed" in line] == [
        AnyMatch(rf"\S+ \S+ INFO pid=\d+ cogworker-processor-\d+ class=testproject\.demo\.jobs\.LogJob jid={routed} "
                 rf"testproject\.demo\.jobs: info: routed")]
    assert "Logging error" not in log


def test_with_startproject_s_logging_each_django_line_prints_once_with_the_job_s_context(tmp_path, r):
    # Django's DEFAULT_LOGGING prints the "django" logger's records when DEBUG is on, bare; they
    # propagated to runcogworker's root handler too: each django.tasks line (Django 6), traceback
    # and all, printed twice. (The backport logs on django_tasks, outside "django": a job logs on
    # django.tasks here so that both show it.)
    with worker(tmp_path, env={"TESTPROJECT_NO_LOGGING": "1", "DEBUG": "true"}) as w:
        w.wait_ready()
        failed = fail.enqueue("printed once")
        jid = LoggerJob.perform_async("django.tasks", "a django line from a job")
        wait_until(lambda: fail.get_result(failed.id).status == TaskResultStatus.FAILED and r.zcard(K.dead) == 1
                   and "a django line from a job" in w.log(), timeout=15)
        w.term()
        assert w.wait(30) == 0
    lines = w.log().splitlines()
    task = rf"class=testproject\.demo\.tasks\.fail jid={failed.id}"
    assert [line for line in lines if f"Task id={failed.id} " in line] == [
        AnyMatch(rf"{STAMP} INFO {task} {TASKS_LOGGER}: Task id={failed.id} path=testproject\.demo\.tasks\.fail "
                 rf"state=RUNNING"),
        AnyMatch(rf"{STAMP} ERROR {task} {TASKS_LOGGER}: Task id={failed.id} path=testproject\.demo\.tasks\.fail "
                 rf"state=FAILED")]
    # Two tracebacks: cogworker's failure line's and Django's FAILED line's.
    assert lines.count("ValueError: printed once") == 2
    assert [line for line in lines if "a django line from a job" in line] == [
        AnyMatch(rf"{STAMP} INFO class=testproject\.demo\.jobs\.LoggerJob jid={jid} django\.tasks: "
                 rf"a django line from a job")]


@pytest.mark.parametrize("env", [{}, {"TESTPROJECT_NO_LOGGING": "1"}], ids=["project-logging", "no-logging"])
def test_a_job_s_start_and_done_lines_name_it_once(tmp_path, r, env):
    # Under testproject's LOGGING (its handler's format shows the job's context, through the
    # filter) and under runcogworker's own handler alike, each line had the jid and the class twice:
    # "INFO class=... jid=... ...processor: start jid=... class=...".
    with worker(tmp_path, env=env) as w:
        w.wait_ready()
        jid = RecordJob.perform_async("once")
        wait_until(lambda: r.llen("once") == 1 and "processor: done" in w.log(), timeout=15)
        w.term()
        assert w.wait(30) == 0
    lines = [line for line in w.log().splitlines() if jid in line and "processor:" in line]
    job = rf"INFO (pid=\d+ )?(cogworker-processor-\d+ )?class=testproject\.demo\.jobs\.RecordJob jid={jid}"
    assert lines == [AnyMatch(rf".* {job} django_cogworker\.engine\.run\.processor: start"),
                     AnyMatch(rf".* {job} django_cogworker\.engine\.run\.processor: done elapsed=\d+\.\d{{3}}s")]
