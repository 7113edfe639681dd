"""The tracing section's SDK (bench/sections/tracing.py): OpenTelemetry's TracerProvider, every span
made, recorded and ended, then dropped by its one span processor: the cost of tracing to the job
system, without an exporter's."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider


class Dropped(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        return None


def install() -> None:
    provider = TracerProvider()
    provider.add_span_processor(Dropped())
    trace.set_tracer_provider(provider)
