"""OpenTelemetry traces through a real worker (features/tracing/, issue 46 point 1): a job pushed
from the test's span runs in a ``runcogworker`` whose SDK writes its spans to a JSON-lines file
(testproject/demo/spans_file.py, switched on by COGWORKER_TEST_SPANS_FILE), and its CONSUMER span
is in the test's trace, the child of the test's PRODUCER span and linked to it; so is its retry's
run, attempt 2.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from helpers import wait_until, worker
from opentelemetry.trace import SpanKind
from tracing_fixtures import REQUEST, of_kind, spans_fixture  # noqa: F401 - the spans fixture

from testproject.demo.jobs import BatchMemberJob, FailJob, RecordJob


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_worker_s_run_is_in_the_pushing_process_s_trace_child_of_its_producer_span(tmp_path, spans, r):
    spans_file = tmp_path / "spans.jsonl"
    with worker(tmp_path, env={"COGWORKER_TEST_SPANS_FILE": str(spans_file)}) as w:
        w.wait_ready()
        with REQUEST.start_as_current_span("GET /checkout") as request:
            jid = RecordJob.perform_async("recorded", "done")
            failed = FailJob.set(retry=False).perform_async("traced failure")
        wait_until(lambda: len([s for s in lines(spans_file) if s["kind"] == "CONSUMER"]) == 2, timeout=20,
                   message="the worker's two consumer spans")
    assert r.lrange("recorded", 0, -1) == ["done"]
    sends = {s.attributes["messaging.message.id"]: s for s in of_kind(spans, SpanKind.PRODUCER)}
    runs = {s["attributes"]["messaging.message.id"]: s for s in lines(spans_file) if s["kind"] == "CONSUMER"}
    trace_id = f"{request.get_span_context().trace_id:032x}"
    for pushed in (jid, failed):
        producer, consumer = sends[pushed], runs[pushed]
        assert consumer["trace_id"] == trace_id
        assert consumer["parent_span_id"] == f"{producer.context.span_id:016x}"
        assert consumer["links"] == [[trace_id, f"{producer.context.span_id:016x}"]]
        assert consumer["name"] == "process default" and consumer["pid"] == w.pid
    assert runs[jid]["status"] == "UNSET" and runs[failed]["status"] == "ERROR"
    assert runs[failed]["attributes"]["error.type"] == "RuntimeError"


def test_a_worker_s_retry_is_attempt_2_in_the_same_trace_child_of_the_same_producer_span(tmp_path, spans, r):
    spans_file = tmp_path / "spans.jsonl"
    key = f"traced-retry-{uuid.uuid4().hex}"
    with worker(tmp_path, env={"COGWORKER_TEST_SPANS_FILE": str(spans_file)}) as w:
        w.wait_ready()
        with REQUEST.start_as_current_span("POST /flaky") as request:
            jid = BatchMemberJob.perform_async(key, 1)  # (fails its first attempt; retried 0.2 s later)
        wait_until(lambda: len([s for s in lines(spans_file) if s["kind"] == "CONSUMER"]) == 2, timeout=30,
                   message="the run and its retry's")
    assert r.hget(f"{key}:done", jid) == "1"
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    runs = sorted((s for s in lines(spans_file) if s["kind"] == "CONSUMER"),
                  key=lambda s: s["attributes"]["cogworker.job.attempt"])
    trace_id, span_id = f"{request.get_span_context().trace_id:032x}", f"{producer.context.span_id:016x}"
    assert [s["attributes"]["cogworker.job.attempt"] for s in runs] == [1, 2]
    for run in runs:
        assert run["attributes"]["messaging.message.id"] == jid
        assert run["trace_id"] == trace_id and run["parent_span_id"] == span_id
        assert run["links"] == [[trace_id, span_id]]
    assert runs[0]["status"] == "ERROR" and runs[0]["attributes"]["error.type"] == "RuntimeError"
    assert runs[1]["status"] == "UNSET" and "error.type" not in runs[1]["attributes"]
