"""The metrics history written by a real worker (features/history/): runs of known duration and
failures, read back through the API, the CLI's JSON and Prometheus."""

from __future__ import annotations

import io
import json

from django.core.management import call_command
from helpers import FAST_ENV, Worker, wait_until

from django_cogworker.features.history import api
from django_cogworker.features.history.buckets import bucket_of
from testproject.demo.jobs import FailJob, SleepJob

SLEEP, FAIL = "testproject.demo.jobs.SleepJob", "testproject.demo.jobs.FailJob"


def counted() -> dict[str, api.ClassHistory]:
    return api.read(10).classes


def test_a_worker_writes_runs_of_known_duration_and_its_failures_into_the_history(r, tmp_path):
    with Worker("-c", "3", env=FAST_ENV, log_path=tmp_path / "worker.log") as worker:
        worker.wait_ready()
        for _ in range(3):
            SleepJob.perform_async(0.15, "slept")  # (100-250 ms: room on a loaded box either side)
        for n in range(2):
            FailJob.perform_async(f"on purpose {n}")  # (retried 15 s or more later: after this test)
        wait_until(lambda: r.llen("slept") == 6 and r.zcard("cogworker:retry") == 2, timeout=20,
                   message="the jobs ran")
        # Written by the feature's chore after a beat (every 0.5 s here).
        wait_until(lambda: SLEEP in counted() and counted()[SLEEP].processed == 3 and FAIL in counted()
                   and counted()[FAIL].failed == 2, timeout=10, message="the history counted them")
    history = counted()
    slept, failed = history[SLEEP], history[FAIL]
    assert (slept.processed, slept.failed) == (3, 0) and (failed.processed, failed.failed) == (2, 2)
    assert slept.buckets[bucket_of(150)] == 3 and sum(slept.buckets) == 3
    assert 3 * 150 <= slept.ms_total < 3 * 250
    assert (slept.p50, slept.p95) == (175.0, 242.5)  # interpolated in (100, 250] ms
    assert sum(p.processed for p in slept.series) == 3
    out = io.StringIO()
    call_command("cogworker", "metrics", "--minutes", "10", "--json", stdout=out)
    assert json.loads(out.getvalue())["classes"][SLEEP]["processed"] == 3
