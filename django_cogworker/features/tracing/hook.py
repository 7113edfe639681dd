"""Tracing on the job's path: each run is a CONSUMER span ``process <queue>``, the child of its
push's PRODUCER span (the payload's ``trace``) and linked to it, current while the job runs (what
it pushes is its child: a workflow's next step continues the trace).

The span is the outermost ``around`` (features/standard.py puts this feature first): it holds the
other features' work around the run (a result written, a limit's wait) and the job's own. A job
settled before it runs (expired, cancelled while waiting, over a limit) has no run and no span.
"""

from __future__ import annotations

from typing import Any

from ...engine.run.hooks import AsyncCall, Call, Feature, JobRun
from .spans import process, process_async


class Tracing(Feature):
    """Every class: a job pushed without a trace context (by a process without OpenTelemetry)
    starts a trace of its own."""

    name = "tracing"

    def around(self, run: JobRun, call: Call) -> Any:
        return process(run.payload, call)

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        return await process_async(run.payload, call)
