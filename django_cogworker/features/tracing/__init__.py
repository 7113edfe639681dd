"""OpenTelemetry traces from the push to the run (docs/observability.md#traces).

A push makes a PRODUCER span ``send <queue>``, a child of the span current where it is pushed (a
request's), and puts that span's W3C context in the payload's ``trace`` field (carried.FIELD); a run makes a
CONSUMER span ``process <queue>``, the producer span's child in the same trace, linked to it. A
job's payload is what carries the context, so what runs it again (a retry, a scheduled job coming
due, the outbox's relay, a job handed back at shutdown) continues the trace of the push that made it.

Only when ``opentelemetry-api`` is importable (the ``otel`` extra) and ``COGWORKER["TRACING"]``
isn't False: otherwise nothing of OpenTelemetry is imported (this module asks for its spec, and
only with TRACING on) and a push or a run pays nothing.

    declaration  the push side: ``on_push`` (one payload), ``on_push_bulk`` (one span for a bulk push)
    spans        what talks to OpenTelemetry: the tracer, the attributes, inject and extract
    carried      what a payload carries of a trace (its fields, the traceparent's shape, the links' cap),
                 without OpenTelemetry: the batches feature reads it too
    hook         Tracing: the run side, the core's ``around`` phase
"""

from __future__ import annotations

import importlib.util
from typing import Any

_available: bool | None = None


def available() -> bool:
    """Whether the OpenTelemetry API can be imported; asked once per process (when TRACING is on), importing
    no more than its namespace package."""
    global _available
    if _available is None:
        try:
            _available = (importlib.util.find_spec("opentelemetry") is not None
                          and importlib.util.find_spec("opentelemetry.trace") is not None)
        except (ImportError, ValueError):  # (a parent that isn't a package, a blocked import)
            _available = False
    return _available


def enabled(config: Any) -> bool:
    """Whether ``config`` traces: TRACING on and the API importable."""
    return bool(config.tracing) and available()


def features(config: Any) -> list[Any]:
    """The run side's Feature, when ``config`` traces (features/standard.py puts it first: its span
    is the outermost ``around``, so it holds the other features' work and the job's)."""
    if not enabled(config):
        return []
    from .hook import Tracing

    return [Tracing()]
