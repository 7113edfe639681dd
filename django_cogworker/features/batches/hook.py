"""Batches on the job's path: a job of a batch (its payload carries a ``bid``) settles its batch
step before its ack or filing (steps.py's BatchStep, run by BatchSteps: the Settler looks the
runner up by the step's type).

A success with no result to keep is a holdable step: it waits with the acks for the fetcher's next
round trip, where the steps held run together, one script per batch. A job whose payload asks
for its result to be kept (``keep_result``: read by the next step of a chain) has its return value
kept as JSON (one JSON can't hold fails the job), written with its step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.hooks import AsyncCall, Call, Decision, Feature, JobRun, Outcome
from ...engine.settle.retry import Filing
from ...engine.settle.settlement import StepRunner
from ..results.writer import encode_return
from . import delivery
from .steps import BatchStep, BatchSteps, step_for


class Batches(Feature):
    """Every class: whether a job is in a batch is its payload's to say (a field read per job)."""

    name = "batches"
    fields = ("bid",)

    def __init__(self, redis: RedisClient, keys: Keys, ttl: float, monotonic: Callable[[], float] = time.monotonic):
        self.steps = BatchSteps(redis, keys, ttl)
        self.redis, self.keys, self.ttl = redis, keys, ttl
        self.monotonic = monotonic
        self._next_closings = 0.0  # (monotonic) the first round sweeps at once

    def housekeeping(self) -> Sequence[tuple[str, Callable[[], object]]]:
        return (("batch closings", self.sweep_closings),)

    def sweep_closings(self) -> int:
        """Deliver the callbacks a jobs() block's close fired whose pusher died before it delivered
        them (delivery.py); every CLOSING_GRACE / 2 at most: a closing is looked at only once it is that old."""
        if self.monotonic() < self._next_closings:
            return 0
        self._next_closings = self.monotonic() + delivery.CLOSING_GRACE / 2
        return delivery.sweep_closing(self.redis, self.keys, self.ttl, time.time())

    def step_runners(self) -> Mapping[type, StepRunner]:
        return {BatchStep: self.steps}

    def around(self, run: JobRun, call: Call) -> Any:
        return self._kept(run, call())

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        return self._kept(run, await call())

    def _kept(self, run: JobRun, value: Any) -> Any:
        if run.payload.get("keep_result") and run.payload.get("bid") is not None:
            # (Read by the next step of a chain; a class keeping results returned it as JSON already.)
            cls = run.job_class
            return value if cls is not None and cls.result_ttl is not None else encode_return(value)
        return value

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        payload = run.payload
        if not isinstance(payload.get("bid"), str) or decision.outcome is Outcome.RESCHEDULED:
            return decision
        end = decision.settlement.end
        if decision.outcome is Outcome.SUCCESS:
            step = step_for(payload, "success", result=run.value if payload.get("keep_result") else None)
        else:
            # (A job the core failed counts as dead only once filed in dead; one a death handler
            # discarded, as a failure. One a feature dropped or ended (expired, cancelled) is dead.)
            died = isinstance(end, Filing) and end.target == "dead" if decision.failure else True
            step = step_for(payload, "dead" if died else "failure", exc=decision.error)
        decision.settlement = decision.settlement.first(step)
        return decision
