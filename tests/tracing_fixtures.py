"""The test process's OpenTelemetry spans, kept in memory: the SDK's InMemorySpanExporter on a
TracerProvider that is this process's only while a test that takes ``spans`` runs.

    from tracing_fixtures import spans_fixture  # noqa: F401 - the spans fixture

    def test_x(spans):
        ...
        [producer] = of_kind(spans, SpanKind.PRODUCER)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from django_cogworker.features.tracing import spans as tracing_spans

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))

# The spans a test makes itself (a request's, around its pushes).
REQUEST = PROVIDER.get_tracer("tests.request")


@pytest.fixture(name="spans")
def spans_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The exporter, empty, with PROVIDER this process's tracer provider for the test only.

    OpenTelemetry lets a process set its provider once; the API's global is swapped for the test
    instead (as OpenTelemetry's own test utilities do), and the package's tracer looked up afresh:
    set for good, every later test's pushes carried a ``trace`` field (test_client's payloads)."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", PROVIDER)
    monkeypatch.setattr(tracing_spans, "_tracer", None)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def of_kind(spans: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    """The finished spans of ``kind``, in the order they ended."""
    return [s for s in spans.get_finished_spans() if s.kind is kind]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent header naming ``span``."""
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{int(span.context.trace_flags):02x}"
