"""joblog: the running job's jid and class on the records logged while it runs, and what a real
``runcogworker`` prints with them (its handler, management/commands/runcogworker.py): each record
once, with the job's context, whatever the project's LOGGING."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading

from django_cogworker import joblog


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


