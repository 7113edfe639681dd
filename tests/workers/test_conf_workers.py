"""conf: one COGWORKER dict plus the environment -> one validated, frozen Config.

Every bad value is named (setting and value given); a password never shows in an error or the banner.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_conf.py.
"""

from __future__ import annotations

import signal

from helpers import Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_conf import PASSWORD, locked_redis  # noqa: F401, F811 - the locked_redis fixture


def test_worker_banner_and_log_never_show_the_password(locked_redis, tmp_path):  # noqa: F811 - the fixture imported above
    srv, _ = locked_redis
    url = f"redis://:{PASSWORD}@127.0.0.1:{srv.port}/0"
    with Worker("-c", "1", env={"COGWORKER_REDIS_URL": url}, log_path=tmp_path / "worker.log") as worker:
        worker.wait_ready()
        # TERM only once every thread is up: the log line "... ready: ..." comes after them.
        wait_until(lambda: " ready: " in worker.log(), timeout=10, message="worker ready in the log")
        worker.signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    log = worker.log()
    assert f"redis://:***@127.0.0.1:{srv.port}/0" in log
    assert PASSWORD not in log
