"""Job timeouts (django_cogworker/engine/run/timeouts.py): JobTimeout raised in the job's thread, a
job that ignores it reported, and under --processes its process replaced; end to end with a
class job (the task's timeout is in test_tasks.py).

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_timeouts.py.
"""

from __future__ import annotations

import json

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import StubbornJob, TimedJob

K = Keys()


def test_a_class_job_past_its_timeout_is_filed_dead_and_a_stubborn_one_replaces_its_process(tmp_path, r):
    timed = TimedJob.perform_async(30)
    stubborn = StubbornJob.perform_async("stubborn")
    env = {**FAST_ENV, "COGWORKER_TIMEOUT_GRACE": "0.5", "COGWORKER_CONCURRENCY": "2"}
    with Worker("--processes", "2", env=env, log_path=tmp_path / "worker.log") as w:
        wait_until(lambda: r.zcard(K.dead) >= 1, timeout=20, message="timed-out job filed")
        wait_until(lambda: "exiting so the supervisor replaces this process" in w.log(), timeout=20,
                   message="stuck process replaced")
        wait_until(lambda: "exited with code 70" in w.log(), timeout=20, message="supervisor saw the exit")
        wait_until(lambda: w.log().count("started worker process") >= 3, timeout=20, message="restarted")
        w.term()
        assert w.wait(60) == 0
    dead = {json.loads(raw)["jid"]: json.loads(raw) for raw in r.zrange(K.dead, 0, -1)}
    assert dead[timed]["error_class"] == "django_cogworker.errors.JobTimeout"
    assert r.lrange("stubborn", 0, -1)[:1] == ["caught"]  # it ignored its JobTimeout...
    # ...and was not filed for it: it follows the orphan rules (run again; dead after MAX_ORPHANINGS)
    assert dead.get(stubborn, {}).get("error_class") != "django_cogworker.errors.JobTimeout"
