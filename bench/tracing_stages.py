"""Tracing's cost per stage, in one process (bench/sections/tracing.py measures it end to end): the
push hook (features/tracing/declaration.py) on one payload and a run's span (spans.process)
around a no-op, each timed alone (no Redis: only what tracing adds to a push and to a run), with
TRACING off, with the SDK recording and its one span processor dropping every span, and with the
SDK's sampler sampling nothing (ParentBased(TraceIdRatioBased(0))).

    .venv/bin/python bench/tracing_stages.py [N]            # µs per push and per run, each way
    .venv/bin/python bench/tracing_stages.py N --profile    # and cProfile's top functions, each way
    .venv/bin/python bench/tracing_stages.py N --stages     # each piece (span, inject, extract, attach) alone
    COGWORKER_CODE=/old/checkout .venv/bin/python bench/tracing_stages.py   # another checkout's code
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# COGWORKER_CODE: another checkout's package to time (an older commit's, against this one's).
sys.path[:0] = [os.environ.get("COGWORKER_CODE", str(ROOT))]

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(COGWORKER={"TRACING": True}, INSTALLED_APPS=["django_cogworker"])
django.setup()

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider, sampling  # noqa: E402

from django_cogworker.features.tracing import declaration, spans  # noqa: E402
from django_cogworker.push import runtime  # noqa: E402


class Dropped(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        return None


def provider(way: str) -> Any:
    if way == "sampled-none":
        made = TracerProvider(sampler=sampling.ParentBased(sampling.TraceIdRatioBased(0)))
    else:
        made = TracerProvider()
    made.add_span_processor(Dropped())
    return made


def payload() -> dict[str, Any]:
    return {"class": "benchproject.jobs.NoopIncr", "queue": "default", "jid": "0123456789abcdef01234567",
            "args": [0.0], "created_at": 1.0, "enqueued_at": 1.0}


def push(n: int) -> float:
    """µs per push hook call (what perform_async runs for tracing on each payload)."""
    items = [payload() for _ in range(n)]
    send = declaration._send
    t = time.perf_counter()
    for item in items:
        send(item, None, {}, (), None)
    return 1e6 * (time.perf_counter() - t) / n


def _noop() -> None:
    return None


def _processing(item: dict[str, Any], call: Any) -> Any:
    with spans.processing(item):  # (the code before c9b61f3: a context manager)
        return call()


def run(n: int, carried: dict[str, Any]) -> float:
    """µs per run's span around a no-op (Tracing.around's work)."""
    item = payload()
    if carried:
        item["trace"] = carried
    process = getattr(spans, "process", None) or _processing
    t = time.perf_counter()
    for _ in range(n):
        process(item, _noop)
    return 1e6 * (time.perf_counter() - t) / n


def way(name: str, n: int, profile: bool) -> dict[str, float]:
    on = name != "off"
    settings.COGWORKER = {"TRACING": on}
    runtime.reset()
    trace._TRACER_PROVIDER = provider(name)  # (swapped as tests/tracing_fixtures does: one process, three ways)
    spans._tracer = None
    declaration._pushes(None, {})  # (as a setter asks, once)
    sent = payload()
    if on:
        declaration._send(sent, None, {}, (), None)
    carried = sent.get("trace") or {}
    push(200), run(200, carried)  # (warm)
    # Off: the run side has no Tracing feature at all (features() is []); the push hook isn't
    # applied (pushes() is False). Its cost is 0; measured here as what a push asks: pushes().
    if not on:
        t = time.perf_counter()
        for _ in range(n):
            declaration._pushes(None, {})
        return {"push": 1e6 * (time.perf_counter() - t) / n, "run": 0.0}
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        push(n), run(n, carried)
        prof.disable()
        print(f"\n=== {name}: cProfile, {n} pushes + {n} runs")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    best = {"push": min(push(n) for _ in range(5)), "run": min(run(n, carried) for _ in range(5))}
    return best


def stages(name: str, n: int) -> None:
    """Each piece of a push's and a run's tracing timed alone, on the SDK way ``name`` (µs, best of 5)."""
    import timeit

    from opentelemetry import context as otel_context
    from opentelemetry import propagate
    from opentelemetry.trace import Link, SpanKind

    item = payload()
    attrs = {**spans._PROCESS, "messaging.destination.name": "default", "messaging.message.id": item["jid"],
             "cogworker.job.class": item["class"], "cogworker.job.attempt": 1}
    settings.COGWORKER = {"TRACING": True}
    runtime.reset()
    trace._TRACER_PROVIDER = provider(name)
    spans._tracer = None
    tracer = spans.tracer()
    sent = payload()
    declaration._pushes(None, {})
    declaration._send(sent, None, {}, (), None)
    carried = sent["trace"]
    parent, producer = spans.received({"trace": carried})
    span = tracer.start_span("x")
    ctx = trace.set_span_in_context(span)
    cases = {
        "config read (_on)": lambda: declaration._on(),
        "attributes dict (ours)": lambda: {**spans._PROCESS, "messaging.destination.name": str(item["queue"]),
                                           "messaging.message.id": str(item["jid"]),
                                           "cogworker.job.class": str(item["class"]),
                                           "cogworker.job.attempt": spans.attempt(item)},
        "start_span+end, no attributes": lambda: tracer.start_span("s", kind=SpanKind.PRODUCER).end(),
        "start_span+end, 7 attributes": lambda: tracer.start_span("s", kind=SpanKind.PRODUCER,
                                                                  attributes=attrs).end(),
        "start_span+end, 7 attrs + link": lambda: tracer.start_span(
            "s", context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=[Link(producer)]).end(),
        "inject (W3C + baggage)": lambda: propagate.inject({}, context=ctx),
        "received: extract + checks": lambda: spans.received({"trace": carried}),
        "context attach+detach": lambda: otel_context.detach(otel_context.attach(ctx)),
        "set_span_in_context": lambda: trace.set_span_in_context(span, parent),
    }
    print(f"\n{name}: each piece alone, µs")
    for case, fn in cases.items():
        best = min(timeit.repeat(fn, number=n, repeat=5)) * 1e6 / n
        print(f"  {case:34} {best:6.2f}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5000
    profile = "--profile" in sys.argv
    if "--stages" in sys.argv:
        for name in ("recorded-dropped", "sampled-none"):
            stages(name, n)
        return
    rows = {name: way(name, n, profile) for name in ("off", "recorded-dropped", "sampled-none")}
    print(f"\n{n:,} each, best of 5, µs:")
    for name, r in rows.items():
        print(f"  {name:18} push {r['push']:7.2f}   run {r['run']:7.2f}")


if __name__ == "__main__":
    main()
