"""The Prometheus metrics view (django_cogworker/metrics/): who may read it, what a scrape shows
(checked with Prometheus's own parser), escaping, bounds with many queues, a Redis away; and the
per-class counts a real worker process writes.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_metrics.py.
"""

from __future__ import annotations

import math

from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_metrics import TOKEN, URL, samples, scrape, token  # noqa: F401, F811 - the token fixture

from testproject.demo.jobs import FailJob, RecordJob


def test_a_real_worker_counts_runs_failures_and_seconds_by_class(r, token):  # noqa: F811 - the fixture imported above
    with Worker("-c", "2", env=FAST_ENV) as worker:
        worker.wait_ready()
        for n in range(3):
            RecordJob.perform_async("seen", n)
        FailJob.perform_async("on purpose")
        wait_until(lambda: r.llen("seen") == 3 and r.zcard("cogworker:retry") == 1, timeout=15)
        record = (("class", "testproject.demo.jobs.RecordJob"),)
        fail = (("class", "testproject.demo.jobs.FailJob"),)
        # Written by the heartbeat's flushes (a beat every 0.5 s here). Waiting for the failing
        # class alone let a flush land between its count and the last RecordJob's (run, "seen"
        # written, not counted yet): 2 runs of 3. Every run is in the totals once one scrape shows
        # 4 (a flush writes a whole snapshot, totals and classes); the next scrape reads them all.
        # (The run-time histogram is the metrics history's, written by a feature's chore of the same
        # beat, on a thread of its own: it can land after the totals.)
        wait_until(lambda: samples(scrape()).get(("cogworker_processed_total", ())) == 4
                   and samples(scrape()).get(("cogworker_job_duration_seconds_count", record)) == 3, timeout=10,
                   message="every run counted")
        got = samples(scrape())
        assert got["cogworker_job_processed_total", record] == 3 and got["cogworker_job_failed_total", record] == 0
        assert got["cogworker_job_failed_total", fail] == 1
        assert got["cogworker_job_duration_seconds_count", record] == 3
        assert 0 < got["cogworker_job_duration_seconds_sum", record] < 10 and math.isfinite(
            got["cogworker_job_duration_seconds_sum", record])
        assert got["cogworker_processes", ()] == 1 and got["cogworker_processed_total", ()] == 4
        worker.term()
        assert worker.wait(30) == 0
