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




def test_a_line_about_a_job_names_it_once_whatever_each_handler_s_format():
    # The processor's start, done and fail lines name the job with a Mention: under a format that
    # shows the job's context (runcogworker's own, a project's with %(job_context)s) they had the jid
    # and class twice; under one that doesn't, the message alone names the job.
    shown, plain, dropping, unfiltered = (io.StringIO() for _ in range(4))
    with_context = logging.StreamHandler(shown)
    with_context.setFormatter(logging.Formatter("%(levelname)s%(job_context)s %(name)s: %(message)s"))
    without = logging.StreamHandler(plain)
    without.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    # (Its format shows the job, but its own filter drops the record: the next handler isn't affected.)
    drops = logging.StreamHandler(dropping)
    drops.setFormatter(logging.Formatter("[%(job_class)s %(jid)s] %(message)s"))
    drops.addFilter(lambda record: False)
    bare = logging.StreamHandler(unfiltered)  # (no JobContextFilter: pytest's caplog, a handler added later)
    logger = logging.getLogger("joblogmention")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handlers = [with_context, drops, without, bare]
    for handler in handlers:
        logger.addHandler(handler)
    joblog.add_context([with_context, drops, without])
    token = joblog.enter("abc123", "orders.jobs.Hello")
    try:
        logger.info("start%s", joblog.Mention("abc123", "orders.jobs.Hello"))
        logger.info("done%s elapsed=%.3fs", joblog.Mention("abc123", "orders.jobs.Hello"), 0.004)
    finally:
        joblog.leave(token)
        for handler in handlers:
            logger.removeHandler(handler)
        logger.propagate = True
    assert shown.getvalue().splitlines() == [
        "INFO class=orders.jobs.Hello jid=abc123 joblogmention: start",
        "INFO class=orders.jobs.Hello jid=abc123 joblogmention: done elapsed=0.004s"]
    assert plain.getvalue().splitlines() == [
        "INFO joblogmention: start jid=abc123 class=orders.jobs.Hello",
        "INFO joblogmention: done jid=abc123 class=orders.jobs.Hello elapsed=0.004s"]
    assert unfiltered.getvalue().splitlines() == [
        "start jid=abc123 class=orders.jobs.Hello", "done jid=abc123 class=orders.jobs.Hello elapsed=0.004s"]
    assert dropping.getvalue() == ""


def test_a_handler_shows_the_job_when_its_format_uses_the_context_or_both_fields():
    def handler(fmt: str | None, style: str = "%") -> logging.Handler:
        made = logging.StreamHandler(io.StringIO())
        if fmt is not None:
            made.setFormatter(logging.Formatter(fmt, style=style))  # type: ignore[arg-type]
        return made

    assert [joblog.shows_job(h) for h in (
        handler("%(levelname)s%(job_context)s %(message)s"), handler("[%(job_class)s %(jid)s] %(message)s"),
        handler("{levelname} {jid} {job_class} {message}", style="{"), handler("%(jid)s %(message)s"),
        handler("%(message)s"), handler(None))] == [True, True, True, False, False, False]
