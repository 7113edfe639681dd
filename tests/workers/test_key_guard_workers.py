"""The key guard: keys of the wrong type are moved to quarantine, logged, and work carries on.

In-process tests drive KeyGuard against the suite's Redis; the end-to-end test plants a wrong
type on every fixed key and on a queue key in turn under a running `runcogworker`.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_key_guard.py.
"""

from __future__ import annotations

import re
import time

import redis
from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_key_guard import FIXED, plant, quarantined

from django_cogworker.broker.keys import Keys
from django_cogworker.broker.quarantine import QUARANTINE_TTL

K = Keys()


def _beat_stamp(r, identity: str) -> tuple[str | None, str | None]:
    try:
        last = r.hget(K.last_beat, identity)
    except redis.ResponseError:
        last = None
    return last, r.hget(K.process(identity), "beat")


def test_wrong_types_under_a_running_worker_are_quarantined_and_work_continues(r, tmp_path):
    env = {**FAST_ENV, "COGWORKER_KEY_GUARD_INTERVAL": "0.3", "COGWORKER_CONCURRENCY": "2"}
    targets = [*sorted(FIXED.items()), (K.queue("default"), "list")]
    timings = []
    with Worker(env=env, log_path=tmp_path / "worker.log") as w:
        identity = w.wait_ready()
        for n, (key, expected) in enumerate(targets):
            planted_at = time.monotonic()
            plant(r, key, expected)
            wait_until(lambda key=key: quarantined(r, key), timeout=15, message=f"{key} quarantined")
            timings.append(time.monotonic() - planted_at)
            [name] = quarantined(r, key)
            assert r.ttl(name) > QUARANTINE_TTL - 120
            assert r.type(key) in ("none", expected)
            # Work continues: a job pushed now runs.
            from testproject.demo.jobs import RecordJob

            RecordJob.perform_async("ran", f"after-{n}")
            wait_until(lambda n=n: f"after-{n}" in r.lrange("ran", 0, -1), timeout=15,
                       message=f"a job runs after {key} was quarantined")
            # Heartbeats continue: the process hash and the last-beat stamp move on.
            before = _beat_stamp(r, identity)
            wait_until(lambda before=before: all(a and a != b for a, b in zip(_beat_stamp(r, identity), before,
                                                                                 strict=True)),
                       timeout=10, message=f"heartbeats continue after {key}")
        assert w.alive
        w.term()
        assert w.wait(30) == 0
    log = w.log()
    for key, _ in targets:
        # Logged by whatever met it first: the key guard's round, or (a counter) the stats flush that
        # follows a beat, which meets a key planted just after that beat and moves it aside itself.
        assert re.search(rf"ERROR .*{re.escape(key)} (held a \w+, not a \w+|can't be counted on \(WRONGTYPE "
                         rf"[^)]*\)): moved to {re.escape(K.quarantine_prefix + key)}:", log), key
    print(f"\nFIGURES key guard e2e: {len(targets)} keys quarantined, plant->quarantine "
          f"max {max(timings):.2f}s mean {sum(timings) / len(timings):.2f}s")
    assert not r.exists(K.process(identity))  # left the registry at exit
