"""What talks to OpenTelemetry: the spans of a push and of a run, their attributes (the OpenTelemetry
messaging conventions, ``messaging.*``, and the job's own, ``cogworker.*``), and the trace context
written into a payload and read back from it.

Imported only when tracing is on (features/tracing/__init__.py): this module imports the API.
Spans go through the global tracer provider the project configured (none: the API's no-op one,
which records nothing), the context through its global propagator (W3C trace context and baggage
by default), each looked up as used: a provider set after the first push is the one used next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ...push import payload as payloads
from ...push import scope as push_scope
from .carried import FIELD, LINKS_FIELD, LINKS_MAX, TRACEPARENT

logger = logging.getLogger(__name__)

SYSTEM = "cogworker"
# The headers a payload's ``trace`` may hold, and the longest value of each taken (a W3C traceparent
# is 55 characters; tracestate is at most 32 entries; baggage 8192 bytes by the W3C's limit).
HEADERS = {"traceparent": 256, "tracestate": 4096, "baggage": 8192}

# The attributes every span of a kind has (copied into each span's own, never shared).
_SEND = {"messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "send"}
_PROCESS = {"messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process"}

_tracer: trace.Tracer | None = None
_warned = False
_warned_lock = threading.Lock()


def tracer() -> trace.Tracer:
    """The package's tracer (a proxy until the project sets a provider, then that provider's)."""
    global _tracer
    if _tracer is None:
        from importlib import metadata

        try:
            version: str | None = metadata.version("django-cogworker")
        except metadata.PackageNotFoundError:  # (run from a checkout never installed)
            version = None
        _tracer = trace.get_tracer("django_cogworker", version)
    return _tracer


# -- the push side ------------------------------------------------------------------------------------


def send(items: Sequence[dict[str, Any]], bulk: bool = False) -> None:
    """One PRODUCER span ``send <queue>`` for ``items`` (one payload, or a ``bulk`` push's), a child of
    the current span, whose context each payload carries in its ``trace`` field."""
    if not items:
        return
    first = items[0]
    queue = str(first.get("queue"))
    # The attributes go to start_span, as the conventions ask (a sampler sees them): a span the
    # sampler drops never reads them, and the SDK cleans them once, not per set_attribute.
    attributes: dict[str, Any] = {**_SEND, "messaging.destination.name": queue,
                                  "cogworker.job.class": str(first.get("class"))}
    batch = push_scope.batch.get()
    if batch is not None:  # (pushed in a jobs() block: its jid is the batch's to give, at the write)
        attributes["cogworker.batch.id"] = str(batch.bid)
    if bulk:
        attributes["messaging.batch.message_count"] = len(items)
    elif batch is None:
        attributes["messaging.message.id"] = str(first.get("jid"))
    span = tracer().start_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes)
    carrier: dict[str, str] = {}
    # Injected from a context naming the span, never made current: attaching it (and detaching) for
    # an inject was a fifth of a push's tracing (docs/observability.md#what-tracing-costs).
    try:
        propagate.inject(carrier, context=trace.set_span_in_context(span))
    except Exception as exc:  # (a project's own propagator that raises: the push goes on, untraced)
        _garbage(first, f"its propagator raised {type(exc).__name__}: {exc} as it was pushed")
        carrier = {}
    finally:
        span.end()
    if carrier:  # (no provider configured: the no-op span has no context to carry)
        for item in items:
            item[FIELD] = dict(carrier)


# -- the run side -------------------------------------------------------------------------------------


def received(payload: dict[str, Any]) -> tuple[otel_context.Context | None, trace.SpanContext | None]:
    """The context a run continues (its baggage with it) and its producer span's, from ``payload``'s
    ``trace``; (None, None) when it has none. One that can't be read is ignored: logged once per
    process, and the run starts a trace of its own."""
    carried = payload.get(FIELD)
    if carried is None:
        return None, None
    if not isinstance(carried, dict):
        _garbage(payload, f"its {FIELD!r} field is not an object")
        return None, None
    carrier = {name: value for name, value in carried.items()
               if name in HEADERS and isinstance(value, str) and len(value) <= HEADERS[name]}
    if len(carrier) == 1 and "traceparent" in carrier and _default_propagator():
        quick = _traceparent(carrier["traceparent"])
        if quick is not None:
            return trace.set_span_in_context(trace.NonRecordingSpan(quick)), quick
    try:
        extracted = propagate.extract(carrier)
    except Exception as exc:  # (a project's own propagator that raises on what it can't read)
        _garbage(payload, f"its propagator raised {type(exc).__name__}: {exc}")
        return None, None
    producer = trace.get_current_span(extracted).get_span_context()
    if not producer.is_valid:
        if "traceparent" in carried:
            _garbage(payload, f"its traceparent {str(carried.get('traceparent'))[:80]!r} is not a W3C trace context")
        return extracted, None
    return extracted, producer


def _traceparent(text: str) -> SpanContext | None:
    """A version-00 W3C ``traceparent``'s span context, as the W3C propagator reads it (None: let the
    propagator read it, and refuse it as it does)."""
    parts = TRACEPARENT.fullmatch(text)
    if parts is None:
        return None
    trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    if not (trace_id and span_id):
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(parts[3], 16)))


_default: tuple[Any, bool] = (None, False)


def _default_propagator() -> bool:
    """Whether the global propagator is still OpenTelemetry's default (W3C trace context, then
    baggage), which reads a lone ``traceparent`` as ``_traceparent`` does: the run's extract then
    skips its composite, its regex search and its empty tracestate and baggage (4 of a run's 24 µs
    with a recording SDK, bench/tracing_stages.py). Asked per run (a project may set its own at any
    time), answered once per propagator object."""
    global _default
    current = propagate.get_global_textmap()
    seen, answer = _default
    if current is not seen:
        inner = getattr(current, "_propagators", None)
        answer = (type(current) is CompositePropagator and isinstance(inner, list)
                  and [type(p) for p in inner] == [TraceContextTextMapPropagator, W3CBaggagePropagator])
        _default = (current, answer)
    return answer


def _garbage(payload: dict[str, Any], why: str) -> None:
    """Log, once per process, a trace context that can't be read (the next are ignored quietly)."""
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    logger.warning("jid=%s: trace context ignored, %s; its run starts a trace of its own (logged once per process)",
                   payloads.printable(payload.get("jid")), payloads.printable(why))


def attempt(payload: dict[str, Any]) -> int:
    """The attempt this run is: 1, then 2 for the run after the first failure (``retry_count`` 0)."""
    count = payload.get("retry_count")
    return count + 2 if type(count) is int and count >= 0 else 1


def process(payload: dict[str, Any], call: Callable[[], Any], links: Sequence[trace.SpanContext] = ()) -> Any:
    """``call()`` (the run) inside the CONSUMER span ``process <queue>``, current within (what the job
    pushes is its child), a child of the producer span the payload names and linked to it (and to
    ``links`` and the members' traces a batch callback names, up to LINKS_MAX more). A failure that
    escapes sets its status ERROR, ``error.type`` and records it (on a span that records: one the
    sampler dropped skips that work)."""
    span, token = _open(payload, links)
    try:
        return call()
    except BaseException as exc:
        if span.is_recording():
            failed(span, exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()


async def process_async(payload: dict[str, Any], call: Callable[[], Awaitable[Any]]) -> Any:
    """``process`` around a run on the event loop (the context attached in the job's task: its own)."""
    span, token = _open(payload, ())
    try:
        return await call()
    except BaseException as exc:
        if span.is_recording():
            failed(span, exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _open(payload: dict[str, Any], links: Sequence[trace.SpanContext]) -> tuple[Any, Any]:
    """The run's span, started, and the token of the context attached with it current."""
    parent, producer = received(payload)
    queue = str(payload.get("queue"))
    attributes: dict[str, Any] = {
        **_PROCESS, "messaging.destination.name": queue, "messaging.message.id": str(payload.get("jid")),
        "cogworker.job.class": str(payload.get("class")), "cogworker.job.attempt": attempt(payload),
    }
    bid = payload.get("bid")
    if isinstance(bid, str):
        attributes["cogworker.batch.id"] = bid
    linked = [Link(producer)] if producer is not None else []
    if LINKS_FIELD in payload:
        links = [*links, *members(payload)]
    if links:
        linked.extend(Link(c) for c in links[:LINKS_MAX])
    span = tracer().start_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                               attributes=attributes, links=linked)
    # One context attached for the run: the span's, on the carried one (its baggage current in the
    # run too); attaching the carried context and then the span's on it was two of each.
    return span, otel_context.attach(trace.set_span_in_context(span, parent))


def members(payload: dict[str, Any]) -> list[trace.SpanContext]:
    """The members' trace contexts a batch callback's payload names (LINKS_FIELD), at most LINKS_MAX;
    any that can't be read is left out."""
    carried = payload.get(LINKS_FIELD)
    if type(carried) is not str:
        return []
    found = []
    for text in carried.split()[:LINKS_MAX]:
        context = _traceparent(text)
        if context is not None:
            found.append(context)
    return found


def failed(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: status ERROR, ``error.type`` (its class, as a failed job's
    ``error_class``), the exception recorded."""
    error_type = payloads.error_class(exc)
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, f"{error_type}: {payloads.error_message(exc)}"[:1024]))
    span.record_exception(exc)
