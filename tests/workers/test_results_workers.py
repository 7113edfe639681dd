"""Job results (django_cogworker/features/results/records.py, writer.py): the opt-in record of a class job
with ``result_ttl``, nothing for a job without it, and the record on the admin's job page.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_results.py.
"""

from __future__ import annotations

from helpers import FAST_ENV, Worker, wait_until

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from django_cogworker.features.results.records import SUCCESSFUL, get_result
from testproject.demo.jobs import RecordJob, ResultJob

K = Keys()


def test_a_result_ttl_job_keeps_its_result_and_a_plain_job_none(tmp_path, r):
    jid = ResultJob.perform_async(2, 3)
    plain = RecordJob.perform_async("recorded")
    assert get_result(jid) is None  # a class job's record is made when it starts: its push pays nothing
    with Worker(env=FAST_ENV, log_path=tmp_path / "worker.log") as w:
        identity = w.wait_ready()
        wait_until(lambda: getattr(get_result(jid), "status", None) == SUCCESSFUL, message="result recorded")
        wait_until(lambda: r.llen("recorded") == 1, message="plain job ran")
        w.term()
        w.wait(30)
    result = get_result(jid)
    assert result.return_value == {"sum": 5} and result.args == [2, 3] and result.queue == "default"
    assert result.worker_ids == [identity] and result.name == "testproject.demo.jobs.ResultJob"
    assert result.finished_at >= result.started_at
    assert 3000 < r.ttl(K.result(jid)) <= 3600
    assert r.keys(K.result("*")) == [K.result(jid)]  # the plain job left no record
    assert api.job_result(plain) is None
