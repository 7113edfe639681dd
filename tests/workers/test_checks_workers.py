"""Config problems surface before anything runs: ``manage.py check`` and the start of ``runcogworker``.

Each names the setting and the value given, and never shows a Redis password.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_checks.py.
"""

from __future__ import annotations

from helpers import free_port
from limiter_fixtures import fresh_limiters, unique  # noqa: F401, F811 - the fresh_limiters fixture

# Helpers shared with this subject's fast tests, defined there once.
from test_checks import PASSWORD, run_manage


def test_manage_py_runcogworker_bad_option_exits_with_the_setting_named():
    result = run_manage("runcogworker", "-c", "0",
                        env={"COGWORKER_REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert 'COGWORKER["CONCURRENCY"] must be a positive integer, got 0' in output
    assert "Traceback" not in output and PASSWORD not in output
