"""The object model (``django_cogworker.api``) the admin is built on, against the suite's real Redis.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_api_model.py.
"""

from __future__ import annotations

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import api


def test_quiet_reaches_a_real_worker(rb):
    with Worker("-c", "1", env=FAST_ENV) as worker:
        identity = worker.wait_ready()
        (process,) = [p for p in api.ProcessSet() if p.identity == identity]
        assert not process.is_quiet and process.pid == worker.pid
        process.quiet()
        wait_until(lambda: api.ProcessSet().get(identity).is_quiet, timeout=10, message="process quiet")
        assert worker.alive
