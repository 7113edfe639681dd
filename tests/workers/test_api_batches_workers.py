"""api.BatchSet and its reads (django_cogworker/features/batches/api/): the listing newest first and its
pruning of expired batches, one batch's jobs where they are now, its children and its callbacks,
and the bounds, against the suite's Redis.

Batches are made with the real API (``Batch``, ``with batch.jobs(): RecordJob.perform_async``).
A job's outcome comes either from a real worker (``helpers.Worker``, said in the test) or from its
batch step run here as a worker's settlement runs it (``step``: ``BatchSteps.run`` of the
``step_for`` the processor builds), without running the job itself.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_api_batches.py.
"""

from __future__ import annotations

from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_api_batches import made

from django_cogworker import api
from testproject.demo.jobs import FailJob


def test_a_callback_that_raises_is_retried_like_any_job_and_the_detail_shows_where(tmp_path, rb):
    # A real worker runs the batch's two jobs, then its success callback, which raises.
    batch, jids = made("with a broken callback", 2, success=FailJob)
    with Worker("-c", "2", env=FAST_ENV, log_path=tmp_path / "worker.log") as worker:
        worker.wait_ready()

        def callback_in_retry():
            (callback,) = api.BatchSet().get(batch.bid).callbacks
            return callback if callback.where == "retry" else None

        callback = wait_until(callback_in_retry, timeout=30, message="the callback failed and waits in retry")
        worker.term()
        worker.wait(30)
    assert rb.llen("seen") == 2
    assert (callback.event, callback.state, callback.job_class) == ("success", "pushed",
                                                                    "testproject.demo.jobs.FailJob")
    assert callback.entry.jid == callback.jid and callback.entry.error_class == "RuntimeError"
    assert api.RetrySet().find(callback.entry.token) is not None  # (the admin links it by this token)
    detail = api.BatchSet().get(batch.bid)
    assert detail.summary.state == "succeeded" and detail.tally()[3] == ("succeeded", 2, 2)
