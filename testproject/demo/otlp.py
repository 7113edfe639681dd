"""Traces of the test project sent to an OpenTelemetry backend over OTLP: installed by the settings
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the exporter's own variable, e.g.
``http://127.0.0.1:6006`` for a local Phoenix or ``http://127.0.0.1:4318`` for a collector or
Jaeger), never otherwise. What docs/observability.md's screenshot was made with: the web process
(its request spans from ``opentelemetry-instrumentation-django``, when installed) and
``runcogworker`` each export their spans, so a request and the job it pushed are one trace.

Needs ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` (not among the test
project's requirements: this is for a developer who wants to look).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def install(service_name: str) -> None:
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set ({os.environ.get('OTEL_EXPORTER_OTLP_ENDPOINT')}) but {exc.name} "
            "is not installed: pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http") from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    # (The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT and adds /v1/traces; a batch a second.)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=1000))
    trace.set_tracer_provider(provider)
    try:
        from opentelemetry.instrumentation.django import DjangoInstrumentor
    except ImportError:  # (no request spans: each push then starts its trace)
        return
    DjangoInstrumentor().instrument()
