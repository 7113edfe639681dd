"""joblog: the running job's jid and class on the records logged while it runs."""

from __future__ import annotations

import asyncio
import logging
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
