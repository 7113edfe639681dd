"""OpenTelemetry traces (features/tracing/, issue 46 point 1): a push's PRODUCER span, a child of
the span current where it was pushed, whose context the payload carries; a run's CONSUMER span, the
producer's child and linked to it, with the messaging attributes; a failure's status, a retry, a
bulk push, a scheduled job, a batch's callback, a job the outbox relays, a sealed job, a garbage
trace context, TRACING=False, and no OpenTelemetry at all.

Spans go to the SDK's in-memory exporter (tracing_fixtures' ``spans``); jobs are
pushed through the real client and run by a processor called on the test's thread
(engine_fixtures' ``make_processor``), on the suite's Redis.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from engine_fixtures import Note, make_processor_fixture, new_token, runs  # noqa: F401 - make_processor
from helpers import RedisServer
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode
from tracing_fixtures import REQUEST, of_kind, spans_fixture, traceparent  # noqa: F401 - the spans fixture

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run.hooks import Outcome
from django_cogworker.features.tracing import carried
from django_cogworker.features.tracing import spans as tracing_spans
from django_cogworker.outbox.relay import relay_once
from django_cogworker.push import payload as payloads
from django_cogworker.push import runtime
from django_cogworker.push.job import Job, JobSetter

K = Keys()
KEY = "vNqTyDuuTpNypJIfqoHg4Ykw8jKPm6TjirDDEzuKLvQ="  # (testproject/settings.py's: what a push seals with)
FAILED: set[str] = set()


class FailsOnce(Job):
    """Fails its first attempt (RuntimeError), succeeds after; retried at once."""

    def perform(self, token: str) -> None:
        if token not in FAILED:
            FAILED.add(token)
            raise RuntimeError("first attempt")

    def retry_in(self, count: int, exc: BaseException) -> float:
        return 0


class Sealed(Job):
    encrypt = True

    def perform(self, secret: str) -> None:
        pass


def test_a_run_is_a_consumer_span_child_of_its_push_s_producer_span_in_the_request_s_trace(make_processor, spans):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("GET /checkout") as request:
        pushed = called.push(Note, token)
    run = called.run_next()
    assert run is not None and run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    [producer], [consumer] = of_kind(spans, SpanKind.PRODUCER), of_kind(spans, SpanKind.CONSUMER)
    assert producer.name == "send default"
    assert producer.parent is not None and producer.parent.span_id == request.get_span_context().span_id
    assert producer.context.trace_id == request.get_span_context().trace_id
    assert pushed["trace"] == {"traceparent": traceparent(producer)}  # (the W3C header, outside args)
    assert dict(producer.attributes or {}) == {
        "messaging.system": "cogworker", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "default", "messaging.message.id": pushed["jid"],
        "cogworker.job.class": Note.name}
    assert consumer.name == "process default"
    assert consumer.context.trace_id == request.get_span_context().trace_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    assert dict(consumer.attributes or {}) == {
        "messaging.system": "cogworker", "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": "default", "messaging.message.id": pushed["jid"],
        "cogworker.job.class": Note.name, "cogworker.job.attempt": 1}
    assert consumer.status.status_code is StatusCode.UNSET
    assert runs(token) == [(pushed["jid"], [])]


def test_what_a_job_pushes_is_a_child_of_its_run_and_baggage_travels_with_the_job(make_processor, spans):
    seen: dict[str, Any] = {}

    class Parent(Job):
        def perform(self, token: str) -> None:
            seen["baggage"] = baggage.get_baggage("tenant")
            seen["child"] = called.push(Note, token)

    called = make_processor()
    token = new_token()
    attached = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with REQUEST.start_as_current_span("POST /orders"):
            pushed = called.push(Parent, token)
    finally:
        otel_context.detach(attached)
    assert pushed["trace"]["baggage"] == "tenant=acme"
    called.run_next()
    assert seen["baggage"] == "acme"
    [parent_run] = of_kind(spans, SpanKind.CONSUMER)
    child_send = next(s for s in of_kind(spans, SpanKind.PRODUCER)
                      if (s.attributes or {}).get("messaging.message.id") == seen["child"]["jid"])
    assert child_send.parent is not None and child_send.parent.span_id == parent_run.context.span_id
    called.run_next()
    child_run = next(s for s in of_kind(spans, SpanKind.CONSUMER) if s is not parent_run)
    assert child_run.context.trace_id == parent_run.context.trace_id


def test_a_failure_sets_status_error_its_type_and_the_exception_and_the_retry_continues_the_trace(
        make_processor, spans, r):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("GET /flaky"):
        pushed = called.push(FailsOnce, token)
    first = called.run_next()
    assert first is not None and first.decision is not None and first.decision.outcome is Outcome.RETRY
    [failed] = of_kind(spans, SpanKind.CONSUMER)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "RuntimeError: first attempt"
    assert (failed.attributes or {})["error.type"] == "RuntimeError"
    assert [(e.name, (e.attributes or {})["exception.type"]) for e in failed.events] == [
        ("exception", "RuntimeError")]
    assert called.sweep() == 1  # (retry_in 0: due now)
    second = called.run_next()
    assert second is not None and second.decision is not None and second.decision.outcome is Outcome.SUCCESS
    assert second.payload["trace"] == pushed["trace"]  # (the payload, filed in retry and back, kept it)
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    retried = next(s for s in of_kind(spans, SpanKind.CONSUMER) if s is not failed)
    assert retried.context.trace_id == producer.context.trace_id
    assert retried.parent is not None and retried.parent.span_id == producer.context.span_id
    assert (retried.attributes or {})["cogworker.job.attempt"] == 2
    assert retried.status.status_code is StatusCode.UNSET


def test_a_scheduled_job_continues_the_trace_of_its_push(make_processor, spans, r):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("GET /later") as request:
        Note.perform_in(3600, token)
    [raw] = r.zrange(K.schedule, 0, -1)
    r.zadd(K.schedule, {raw: 1.0})  # (an hour later: due)
    assert called.sweep() == 1
    called.run_next()
    [consumer] = of_kind(spans, SpanKind.CONSUMER)
    assert consumer.context.trace_id == request.get_span_context().trace_id


def test_a_bulk_push_is_one_span_with_its_message_count_and_each_job_carries_its_context(make_processor, spans, r):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("POST /import") as request:
        jids = Note.perform_bulk([[token, i] for i in range(3)])
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    assert producer.parent is not None and producer.parent.span_id == request.get_span_context().span_id
    attributes = dict(producer.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3 and "messaging.message.id" not in attributes
    waiting = [payloads.decode(raw) for raw in r.lrange(K.queue("default"), 0, -1)]
    assert sorted(p["jid"] for p in waiting) == sorted(jids)
    assert {p["trace"]["traceparent"] for p in waiting} == {traceparent(producer)}
    called.drain()
    consumers = of_kind(spans, SpanKind.CONSUMER)
    assert sorted((s.attributes or {})["messaging.message.id"] for s in consumers) == sorted(jids)
    assert {s.parent.span_id for s in consumers if s.parent} == {producer.context.span_id}


def test_a_sealed_job_keeps_its_trace_context_clear_outside_the_seal(make_processor, spans):
    called = make_processor(ENCRYPTION_KEYS=[KEY])
    with REQUEST.start_as_current_span("POST /secret"):
        pushed = called.push(Sealed, "hunter2")
    assert "encrypted" in pushed and pushed["args"] == [] and "hunter2" not in json.dumps(pushed)
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    assert pushed["trace"] == {"traceparent": traceparent(producer)}
    run = called.run_next()
    assert run is not None and run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    [consumer] = of_kind(spans, SpanKind.CONSUMER)
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id


@pytest.mark.parametrize("garbage", [{"traceparent": "00-zz-not-a-trace"}, {"traceparent": 42}, "00-abc", [1]])
def test_a_garbage_trace_context_is_ignored_and_logged_once_per_process(make_processor, spans, caplog, monkeypatch,
                                                                        garbage):
    monkeypatch.setattr(tracing_spans, "_warned", False)
    called = make_processor()
    token = new_token()
    for _ in range(2):
        payload = JobSetter(Note, {}).build([token], {})
        payload["trace"] = garbage
        called.client.push(payload)
    with caplog.at_level(logging.WARNING, logger="django_cogworker.features.tracing.spans"):
        first, second = called.drain()
    assert first is not None and first.decision is not None and first.decision.outcome is Outcome.SUCCESS
    assert second is not None and second.decision is not None and second.decision.outcome is Outcome.SUCCESS
    consumers = of_kind(spans, SpanKind.CONSUMER)
    assert len(consumers) == 2 and all(s.parent is None and not s.links for s in consumers)
    assert len({s.context.trace_id for s in consumers}) == 2  # (each run a trace of its own)
    warned = [rec.getMessage() for rec in caplog.records if "trace context ignored" in rec.getMessage()]
    assert len(warned) == 1 and f"jid={first.jid}" in warned[0]


@pytest.mark.parametrize("header", [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # (a zero trace id: refused by both)
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",  # (the propagator's own reading)
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
])
def test_a_run_reads_a_lone_traceparent_as_the_default_w3c_propagator_does(header):
    # The run's quick reading of a lone traceparent (spans._traceparent) stands in for the default
    # propagator's: the same parent span context, or none, for what the W3C propagator accepts or refuses.
    from opentelemetry import propagate, trace

    context, producer = tracing_spans.received({"jid": "j", "trace": {"traceparent": header}})
    expected = trace.get_current_span(propagate.extract({"traceparent": header})).get_span_context()
    got = trace.get_current_span(context).get_span_context() if context is not None else None
    if expected.is_valid:
        assert producer == expected and got == expected
    else:
        assert producer is None and (got is None or not got.is_valid)


def test_a_project_s_own_propagator_reads_every_run_s_trace_context(make_processor, spans, monkeypatch):
    # A propagator the project set (set_global_textmap) is asked for every run, a lone traceparent
    # too: the quick reading is only the default propagator's.
    from opentelemetry import propagate
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    asked: list[dict] = []

    class Counting(TraceContextTextMapPropagator):
        def extract(self, carrier, context=None, getter=None):
            asked.append(dict(carrier))
            return super().extract(carrier, context) if getter is None else super().extract(carrier, context, getter)

    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", CompositePropagator([Counting()]))
    called = make_processor()
    Note.perform_async(new_token())
    run = called.run_next()
    assert run is not None and run.decision.outcome is Outcome.SUCCESS
    assert [c.get("traceparent") for c in asked] == [run.payload["trace"]["traceparent"]]
    [producer], [consumer] = of_kind(spans, SpanKind.PRODUCER), of_kind(spans, SpanKind.CONSUMER)
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id


def test_a_propagator_that_raises_at_a_push_leaves_the_push_and_its_run_untraced_and_logged_once(
        make_processor, spans, caplog, monkeypatch):
    # A project's own propagator (set_global_textmap) that raises on inject: the push failed with it.
    class Raising:
        def inject(self, carrier, context=None, setter=None):
            raise RuntimeError("broken propagator")

    monkeypatch.setattr(tracing_spans, "_warned", False)
    monkeypatch.setattr(tracing_spans.propagate, "inject", Raising().inject)
    called = make_processor()
    with caplog.at_level(logging.WARNING, logger="django_cogworker.features.tracing.spans"):
        jid = Note.perform_async(new_token())
        Note.perform_async(new_token())
    [(run, second)] = [called.drain()]
    assert run.payload["jid"] == jid and "trace" not in run.payload
    assert run.decision.outcome is Outcome.SUCCESS and second.decision.outcome is Outcome.SUCCESS
    assert len(of_kind(spans, SpanKind.PRODUCER)) == 2  # (each push's span ended all the same)
    warned = [rec.getMessage() for rec in caplog.records if "broken propagator" in rec.getMessage()]
    assert len(warned) == 1


def test_tracing_false_makes_no_span_and_puts_no_context_in_the_payload(make_processor, spans, settings):
    settings.COGWORKER = {**settings.COGWORKER, "TRACING": False}
    called = make_processor(TRACING=False)
    token = new_token()
    with REQUEST.start_as_current_span("GET /quiet"):
        pushed = called.push(Note, token)
        [jid] = Note.perform_bulk([[token]])
    run = called.run_next()
    assert run is not None and run.decision is not None and run.decision.outcome is Outcome.SUCCESS
    called.run_next()
    assert "trace" not in pushed
    assert [s.name for s in spans.get_finished_spans()] == ["GET /quiet"]
    assert runs(token) == [(pushed["jid"], []), (jid, [])]


def test_tracing_is_a_setting_that_must_be_true_or_false(redis_url):
    from django_cogworker.conf import build_config
    from django_cogworker.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        build_config({"TRACING": "off"})
    assert caught.value.errors == ['COGWORKER["TRACING"] must be True or False, got \'off\'']


# Hides OpenTelemetry from the process (as a project without the extra), pushes a job and runs it
# through the test helpers (fake mode's drain: the worker's own path, the features' hooks), and says what was imported.
_WITHOUT_OTEL = textwrap.dedent("""
    import importlib.abc, json, sys

    class Hidden(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hidden())
    import django
    django.setup()
    from django_cogworker import testing
    from testproject.demo.jobs import ScheduledHello

    with testing.fake() as jobs:
        ScheduledHello.perform_async("you")
        ScheduledHello.perform_bulk([["them"]])
        pushed = [sorted(p) for p in jobs.jobs(ScheduledHello)]
        ran = jobs.drain()
    try:
        import opentelemetry  # noqa: F401
        hidden = False
    except ImportError:
        hidden = True
    print(json.dumps({"ran": ran, "hidden": hidden, "pushed": pushed,
                      "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
""")


def test_without_opentelemetry_a_push_and_a_run_import_none_of_it():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.suite_settings"}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hidden"] is True and seen["ran"] == 2
    assert seen["otel"] == []
    assert all("trace" not in fields for fields in seen["pushed"])


class Done(Job):
    """A batch's callback."""

    def perform(self, status: dict[str, Any]) -> None:
        pass


def test_a_batch_callback_continues_the_trace_of_the_code_that_opened_the_batch(make_processor, spans):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("POST /import") as request:
        batch = Batch(description="traced")
        batch.on("success", Done)
        with batch.jobs():
            Note.perform_async(token)
            Note.perform_async(token)
    called.drain()  # (the members, then the callback their last step pushed)
    called.drain()
    consumers = of_kind(spans, SpanKind.CONSUMER)
    assert sorted(map(class_of, consumers)) == sorted([Done.name, Note.name, Note.name])
    assert {s.context.trace_id for s in consumers} == {request.get_span_context().trace_id}
    members = [s for s in consumers if class_of(s) == Note.name]
    assert {(s.attributes or {})["cogworker.batch.id"] for s in members} == {batch.bid}
    sends = {s.context.span_id: s for s in of_kind(spans, SpanKind.PRODUCER)}
    assert all(s.parent is not None and s.parent.span_id in sends for s in consumers)


def class_of(span: Any) -> str:
    return str((span.attributes or {})["cogworker.job.class"])


def test_a_batch_callback_links_to_each_member_s_trace_once_a_retried_member_included(make_processor, spans):
    called = make_processor()
    token = new_token()
    with REQUEST.start_as_current_span("POST /import") as opened:
        batch = Batch(description="linked")
        batch.on("success", Done)
        with batch.jobs():
            Note.perform_async(token)
    with REQUEST.start_as_current_span("POST /more"):  # (a member of another trace)
        with batch.jobs():
            FailsOnce.perform_async(token)
    called.drain()  # (the Note, and the first attempt of FailsOnce: its step a failure)
    assert called.sweep() == 1
    called.drain()  # (FailsOnce again, its success firing the callback)
    called.drain()
    [callback] = [s for s in of_kind(spans, SpanKind.CONSUMER) if class_of(s) == Done.name]
    sends = of_kind(spans, SpanKind.PRODUCER)
    members = [s for s in sends if (s.attributes or {})["cogworker.job.class"] != Done.name]
    own = next(s for s in sends if (s.attributes or {})["cogworker.job.class"] == Done.name)
    assert callback.parent is not None and callback.parent.span_id == own.context.span_id
    assert callback.context.trace_id == opened.get_span_context().trace_id
    linked = [(link.context.trace_id, link.context.span_id) for link in callback.links]
    assert linked[0] == (own.context.trace_id, own.context.span_id)
    assert sorted(linked[1:]) == sorted((s.context.trace_id, s.context.span_id) for s in members)
    assert len({trace_id for trace_id, _ in linked}) == 2  # (the opener's trace and the other request's)


def test_a_batch_callback_links_to_at_most_32_members_traces(make_processor, spans):
    called = make_processor()
    token = new_token()
    batch = Batch(description="many")
    batch.on("complete", Done)
    for i in range(40):
        with REQUEST.start_as_current_span(f"POST /{i}"):  # (each member a trace of its own)
            with batch.jobs():
                Note.perform_async(token)
    called.drain()
    called.drain()
    [callback] = [s for s in of_kind(spans, SpanKind.CONSUMER) if class_of(s) == Done.name]
    members = {(s.context.trace_id, s.context.span_id) for s in of_kind(spans, SpanKind.PRODUCER)
               if (s.attributes or {})["cogworker.job.class"] == Note.name}
    linked = [(link.context.trace_id, link.context.span_id) for link in callback.links]
    assert len(members) == 40 and len(linked) == 1 + carried.LINKS_MAX == 33
    assert set(linked[1:]) < members and len(set(linked[1:])) == 32


@pytest.mark.django_db(transaction=True)
def test_a_job_the_outbox_relays_continues_the_trace_of_its_push(make_processor, spans, settings, tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    try:
        settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": server.url,
                              "REDIS_OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 2}}
        token = new_token()
        with REQUEST.start_as_current_span("POST /orders") as request:
            with transaction.atomic():
                jid = Note.perform_async(token)
                server.kill()  # (the commit finds Redis away: the row waits for the relay)
        server.restart()
        client = runtime.get_client()
        assert relay_once("default", client.hand_over, runtime.get_redis(), K, now=time.time(), fresh=0) == 1
        run = make_processor(url=server.url).run_next()
        assert run is not None and run.jid == jid
        [producer], [consumer] = of_kind(spans, SpanKind.PRODUCER), of_kind(spans, SpanKind.CONSUMER)
        assert producer.context.trace_id == consumer.context.trace_id == request.get_span_context().trace_id
        assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    finally:
        runtime.reset()
        server.cleanup()


def test_the_test_project_asks_for_the_otlp_exporter_by_name_when_its_endpoint_is_set_without_it(tmp_path):
    # The test project sends its traces to an OTLP backend when OTEL_EXPORTER_OTLP_ENDPOINT is set
    # (testproject/demo/otlp.py, docs/observability.md); without the exporter installed (the suite's
    # venv has none), its manage.py says which package to install instead of an ImportError's trace.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"}
    done = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode != 0
    assert "ImproperlyConfigured: OTEL_EXPORTER_OTLP_ENDPOINT is set (http://127.0.0.1:9) but" in done.stderr
    assert "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http" in done.stderr
