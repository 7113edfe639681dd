"""The due sweep (engine/schedule/due.py): due schedule and retry entries to their queues, poison to dead.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_due.py.
"""

from __future__ import annotations

import json
import time

from helpers import FAST_ENV, Worker, wait_until
from poller_fixtures import (
    K,
    bclient_fixture,  # noqa: F401 - the bclient fixture (the poller fixture's)
    poller_fixture,  # noqa: F401, F811 - the poller fixture
)

from django_cogworker.push import payload as payloads
from testproject.demo.jobs import RecordJob


def test_a_worker_sends_poison_to_dead_and_runs_the_scheduled_jobs_and_retries_around_it(tmp_path, r):
    now = time.time()

    def job(jid):
        return payloads.encode({"jid": jid, "class": RecordJob.name, "args": ["ran", jid], "kwargs": {},
                                "queue": "default", "retry": True})

    def poisoned(jid):
        return job(jid).replace(f'"args":["ran","{jid}"]', '"args":["ran",1e309]')

    r.zadd(K.schedule, {poisoned("poison-s"): now - 2, job("scheduled"): now - 1, job("scheduled-later"): now + 1})
    r.zadd(K.retry, {poisoned("poison-r"): now - 2, job("retry"): now - 1})

    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        w.wait_ready()
        wait_until(lambda: sorted(r.lrange("ran", 0, -1)) == ["retry", "scheduled", "scheduled-later"], timeout=20,
                   message="the jobs around the poison ran")
        dead = {json.loads(d)["jid"]: json.loads(d) for d in r.zrange(K.dead, 0, -1)}
        w.term()
        assert w.wait(30) == 0
    assert set(dead) == {"poison-s", "poison-r"}
    assert all("Out of range float" in d["dead_reason"] and d["args"] == ["ran", float("inf")] for d in dead.values())
    assert r.zcard(K.schedule) == r.zcard(K.retry) == 0
