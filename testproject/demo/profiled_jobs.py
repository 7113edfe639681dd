"""A job with a known hot function, for the profiling tests (tests/workers/test_profiling_admin_browser.py):
a profile of its run must put ``hot`` on top, called five times."""

from __future__ import annotations

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis


def hot() -> int:
    return sum(range(10**6))


class HotJob(Job):
    """Call ``hot`` five times, then RPUSH this job's jid onto the Redis list ``key``; raise
    RuntimeError(``fail``) after, when given."""

    def perform(self, key: str, fail: str | None = None) -> None:
        for _ in range(5):
            hot()
        get_redis().rpush(key, self.jid or "")
        if fail:
            raise RuntimeError(fail)
