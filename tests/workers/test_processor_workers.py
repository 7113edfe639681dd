"""Processors (engine/run/processor.py) through a real in-process Launcher: run, settle, survive.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_processor.py.
"""

from __future__ import annotations

import os
import time

from engine_fixtures import (
    launcher_factory_fixture,  # noqa: F401, F811 - the launcher_factory fixture
)
from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_processor import dead_entries, retry_entries

from django_cogworker.broker.keys import Keys
from django_cogworker.push import payload as payloads
from testproject.demo.jobs import ListFolderJob

K = Keys()


def test_a_worker_files_a_failure_whose_message_names_a_file_that_is_not_utf8(tmp_path, r):
    # os.listdir gives "caf\udce9.bad" for the file b"caf\xe9.bad": its failure message, UTF-8 can't
    # carry it. Its filing raised on every try, taken for an outage: the job sat on the in-progress
    # list, "pending settlement still fails" every beat, couldn't be handed over at TERM, and died
    # "orphaned N times", its real error lost.
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / os.fsdecode(b"caf\xe9.bad")).touch()
    for jid, retry in (("listing", 1), ("listing-no-retry", 0)):
        r.lpush(K.queue("default"), payloads.encode({"jid": jid, "class": ListFolderJob.name, "args": [str(folder)],
                                                     "kwargs": {}, "queue": "default", "retry": retry,
                                                     "backtrace": True}))

    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        identity = w.wait_ready()
        wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1, timeout=20, message="filed")
        wait_until(lambda: r.llen(K.in_progress(identity)) == 0, message="acknowledged")
        time.sleep(1.5)  # three beats
        w.term()
        assert w.wait(30) == 0

    (retried,), (dead,) = retry_entries(r), dead_entries(r)
    assert (retried["jid"], dead["jid"]) == ("listing", "listing-no-retry")
    for filed in (retried, dead):
        assert (filed["error_class"], filed["error_message"]) == ("ValueError", "cannot process caf\\udce9.bad")
        assert filed["error_backtrace"][-1] == "ValueError: cannot process caf\\udce9.bad"
    assert dead["dead_reason"] == "retries exhausted"
    log = w.log()
    assert "class=testproject.demo.jobs.ListFolderJob jid=listing django_cogworker.engine.run.processor: fail" in log
    assert "still fails" not in log and "kept in memory" not in log
    assert r.llen(K.unsettled) == 0 and not r.exists(K.in_progress(identity))
