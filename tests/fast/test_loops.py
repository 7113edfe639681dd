"""loops: the watchdog's base, ``run_each`` (each step on its own) and ``redis_time``."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from django_cogworker.engine.loops import redis_time, run_each

logger = logging.getLogger("django_cogworker.tests")


def test_run_each_runs_every_step_and_logs_the_ones_that_fail(caplog):
    ran = []

    def bug():
        ran.append("bug")
        raise RuntimeError("a bug in this step")

    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        run_each((("first", bug), ("second", lambda: ran.append("second"))), "poller: %s failed", log=logger)

    assert ran == ["bug", "second"]
    assert [(rec.getMessage(), rec.exc_info is not None) for rec in caplog.records] == [
        ("poller: first failed", True)]


def test_run_each_reraises_an_outage_at_once_unless_told_not_to(caplog):
    ran = []

    def outage():
        raise redis.ConnectionError("gone")

    with pytest.raises(redis.ConnectionError):
        run_each((("first", outage), ("second", lambda: ran.append("second"))), "%s failed")
    assert ran == []

    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        run_each((("stats", outage), ("registry", lambda: ran.append("registry"))), "at shutdown, %s not written",
                 log=logger, raise_outage=False, traceback=False)
    assert ran == ["registry"]
    assert [(rec.getMessage(), rec.exc_info) for rec in caplog.records] == [
        ("at shutdown, stats not written: ConnectionError: gone", None)]


class NoTime:
    """A client whose TIME is refused, as some proxies and ACLs do."""

    def time(self):
        raise redis.ResponseError("NOPERM this user has no permissions to run the 'time' command")


class Gone:
    def time(self):
        raise redis.ConnectionError("gone")


def test_redis_time_is_redis_clock_and_falls_back_to_the_hosts_where_refused(rb):
    seconds, micros = rb.time()
    assert redis_time(rb) == pytest.approx(seconds + micros / 1e6, abs=1.0)
    before = time.time()
    assert before <= redis_time(NoTime()) <= time.time()
    with pytest.raises(redis.ConnectionError):  # an outage is not hidden behind the host's clock
        redis_time(Gone())
