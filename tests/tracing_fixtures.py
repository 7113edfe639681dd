"""The test process's OpenTelemetry spans, kept in memory: the SDK's InMemorySpanExporter, added
once to this process's tracer provider (set here unless one is set already: a process has one).

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

EXPORTER = InMemorySpanExporter()


def _install() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


_install()

# The spans a test makes itself (a request's, around its pushes).
REQUEST = trace.get_tracer("tests.request")


@pytest.fixture(name="spans")
def spans_fixture() -> Iterator[InMemorySpanExporter]:
    """The exporter, emptied before and after the test."""
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def of_kind(spans: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    """The finished spans of ``kind``, in the order they ended."""
    return [s for s in spans.get_finished_spans() if s.kind is kind]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent header naming ``span``."""
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{int(span.context.trace_flags):02x}"
