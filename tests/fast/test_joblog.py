"""joblog: the running job's jid and class on the records logged while it runs, and what a real
``runcogworker`` prints with them (its handler, management/commands/runcogworker.py): each record
once, with the job's context, whatever the project's LOGGING."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys
import threading

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import joblog
from django_cogworker.broker.keys import Keys
from django_cogworker.tasks.api import SOURCE, TaskResultStatus
from testproject.demo.jobs import LoggerJob, LogJob
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


def worker(tmp_path, env: dict[str, str]) -> Worker:
    return Worker(env={**FAST_ENV, **env}, log_path=tmp_path / "worker.log")


def filtered(message: str = "m", **extra) -> logging.LogRecord:
    record = logging.LogRecord("shop.jobs", logging.INFO, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    assert joblog.JobContextFilter().filter(record) is True  # (it never drops a record)
    return record


def test_outside_a_job_the_fields_read_a_dash_and_the_context_is_empty():
    record = filtered()
    assert (record.jid, record.job_class, record.job_context) == ("-", "-", "")


def test_inside_a_job_every_record_carries_its_jid_and_class_until_it_ends():
    token = joblog.enter("abc123", "shop.jobs.Hello")
    try:
        record = filtered()
        assert (record.jid, record.job_class) == ("abc123", "shop.jobs.Hello")
        assert record.job_context == " class=shop.jobs.Hello jid=abc123"
        assert joblog.current() == ("abc123", "shop.jobs.Hello")
    finally:
        joblog.leave(token)
    assert filtered().jid == "-" and joblog.current() is None


def test_the_context_is_the_thread_s_own_and_an_async_perform_keeps_it():
    seen: dict[str, str] = {}
    token = joblog.enter("main-job", "shop.jobs.Main")
    try:
        other = threading.Thread(target=lambda: seen.update(other=filtered().jid))
        other.start()
        other.join()

        async def perform():
            await asyncio.sleep(0)
            seen["async"] = filtered().jid
        asyncio.run(perform())
    finally:
        joblog.leave(token)
    assert seen == {"other": "-", "async": "main-job"}


def test_a_record_given_its_own_jid_with_extra_keeps_it():
    token = joblog.enter("running", "shop.jobs.Main")
    try:
        assert filtered(jid="given").jid == "given"
    finally:
        joblog.leave(token)


def test_a_console_handler_s_record_is_not_printed_again_by_the_root_s(caplog):
    near, far = io.StringIO(), io.StringIO()
    parent, child = logging.getLogger("jobloglines"), logging.getLogger("jobloglines.routed")
    routed = logging.StreamHandler(near)
    routed.addFilter(lambda record: "skip" not in record.getMessage())  # (the handler's own filter)
    routed.addFilter(joblog.MarkPrinted())
    everything = logging.StreamHandler(far)
    everything.addFilter(joblog.NotPrinted())
    child.addHandler(routed)
    parent.addHandler(everything)
    try:
        child.warning("printed near")
        child.warning("skip: printed far")  # its filter let it through nowhere near: not lost
        logging.getLogger("jobloglines.unrouted").warning("unrouted")
    finally:
        child.removeHandler(routed)
        parent.removeHandler(everything)
    assert near.getvalue().splitlines() == ["printed near"]
    assert far.getvalue().splitlines() == ["skip: printed far", "unrouted"]


def test_a_console_handler_is_one_that_prints_to_stdout_or_stderr(tmp_path):
    file_handler = logging.FileHandler(tmp_path / "log", delay=True)
    assert [joblog.is_console(h) for h in (logging.StreamHandler(), logging.StreamHandler(sys.stdout),
                                           logging.StreamHandler(io.StringIO()), file_handler)] == [
        True, True, False, False]


def test_add_context_gives_every_handler_the_fields_and_leaves_extra_its_own():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(jid)s %(job_class)s%(job_context)s: %(message)s"))
    handler.addFilter(lambda record: record.jid != "dropped")  # (its own filters see the fields too)
    logger = logging.getLogger("joblogcontext")
    logger.addHandler(handler)
    joblog.add_context([handler])
    joblog.add_context([handler])  # (once)
    token = joblog.enter("abc123", "shop.jobs.Hello")
    try:
        logger.warning("in a job")
        logger.warning("given", extra={"jid": "pushed1"})  # a record factory made this a KeyError
        logger.warning("not shown", extra={"jid": "dropped"})
    finally:
        joblog.leave(token)
        logger.removeHandler(handler)
    assert sum(isinstance(f, joblog.JobContextFilter) for f in handler.filters) == 1
    assert stream.getvalue().splitlines() == [
        "abc123 shop.jobs.Hello class=shop.jobs.Hello jid=abc123: in a job",
        "pushed1 shop.jobs.Hello class=shop.jobs.Hello jid=abc123: given"]


def test_a_job_s_records_carry_its_class_and_jid_whatever_the_project_s_logging(tmp_path, r):
    # testproject's LOGGING: handlers for its own loggers, none on the root; here its handler
    # has no filter though its format shows the job's context (KeyError: "--- Logging error ---"),
    # and "testproject" propagates. A job's line on a logger the project routes nowhere printed
    # nothing at all.
    with worker(tmp_path, {"TESTPROJECT_LOGGING_PLAIN": "1"}) as w:
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
    with worker(tmp_path, {"TESTPROJECT_NO_LOGGING": "1", "DEBUG": "true"}) as w:
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
