"""Periodic entries: declared in settings or with @periodic, validated at startup naming the entry.

`build_entries(settings_list, default_tz)` is what `runcogworker` and `manage.py check` call (with
settings.TIME_ZONE); a bad entry raises ConfigError listing every problem, each naming the entry.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_periodic_entries.py.
"""

from __future__ import annotations

import json

from helpers import Worker

# Helpers shared with this subject's fast tests, defined there once.
from test_periodic_entries import BAD, NAMED


def test_runcogworker_exits_non_zero_naming_each_bad_entry(r):
    worker = Worker(env={"COGWORKER_PERIODIC": json.dumps(BAD)})
    code = worker.wait(60)
    log = worker.log()
    assert code != 0, log
    for fragment in NAMED:
        assert fragment in log, log
    assert not r.keys("cogworker:process*")  # never started
