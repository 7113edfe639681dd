"""OpenTelemetry spans written to a JSON-lines file: how tests/workers/test_tracing_workers.py reads
a real worker's spans. Installed by the settings only when ``COGWORKER_TEST_SPANS_FILE`` names the
file (testproject/settings.py), never in the default path: a project configures its own SDK and
exporter (docs/observability.md#traces).

Each line is one finished span: name, kind, trace and span ids (hex), its parent's span id, its
links' (trace id, span id), attributes and status. Written as each span ends (SimpleSpanProcessor,
no thread to lose at a fork or a kill), appended with O_APPEND: a supervisor's children share the file.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(shown(span)) + "\n" for span in spans)
        with self.lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def shown(span: ReadableSpan) -> dict:
    """One span as a line of the file."""
    return {
        "name": span.name, "kind": span.kind.name, "pid": os.getpid(),
        "trace_id": f"{span.context.trace_id:032x}", "span_id": f"{span.context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [[f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}"] for link in span.links],
        "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
    }


def install(path: str) -> None:
    """This process's tracer provider: the SDK's, each span written to ``path`` as it ends."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)
