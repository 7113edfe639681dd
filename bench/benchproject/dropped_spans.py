"""The tracing section's SDK (bench/sections/tracing.py): OpenTelemetry's TracerProvider, every span
made, recorded and ended, then dropped by its one span processor: the cost of tracing to the job
system, without an exporter's."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider


class BareSpan:
    """A server middleware (SERVER_MIDDLEWARE) making one span per run with OpenTelemetry's SDK,
    started and ended around it, no attribute, no context read or attached: the least any tracing
    of a run through the SDK pays, the tracing section's floor ("bare"), against which the tracing
    feature's own span (attributes, its producer's context read and linked, made current) is set."""

    def __init__(self, run):
        self.run = run
        self.tracer = trace.get_tracer("bench")

    def __call__(self, job, payload):
        span = self.tracer.start_span("process")
        try:
            return self.run(job, payload)
        finally:
            span.end()


class Dropped(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        return None


def install() -> None:
    provider = TracerProvider()
    provider.add_span_processor(Dropped())
    trace.set_tracer_provider(provider)
