"""A receipt of every job that succeeded, written before its ack: a project's feature that adds a
step to the settlement (docs/extending.md).

Named in ``COGWORKER["FEATURES"]`` as ``"testproject.demo.receipts.receipts"``; every worker then
records the jid of each job that succeeded in the sorted set ``<prefix>receipts``, scored by when it
finished. The receipt is a step of the job's settlement: it goes through before the job's ack, and
a job whose receipt Redis refused stays unacknowledged (a pending settlement, tried again on each
beat) until it lands, so a job acked always has its receipt.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

from django_cogworker.features import Decision, Feature, JobRun, Outcome, WorkerParts


@dataclasses.dataclass(frozen=True)
class Receipt:
    """The step: ``jid`` succeeded at ``at`` (seconds since the epoch)."""

    jid: str
    at: float
    # May wait with its job's ack for the fetcher's next round trip (False: sent at once, alone).
    holdable = True


class ReceiptWriter:
    """Runs Receipt steps: one ZADD for all of them; raises when Redis refuses. Idempotent by jid:
    a job run again after a kill -9 writes its receipt again, not a second one."""

    def __init__(self, redis, key: str):
        self.redis = redis
        self.key = key

    def run(self, step: Receipt) -> None:
        self.run_many([step])

    def run_many(self, steps: Sequence[Receipt]) -> None:
        self.redis.zadd(self.key, {step.jid: step.at for step in steps})


class Receipts(Feature):
    name = "receipts"

    def __init__(self, redis, key: str):
        self.writer = ReceiptWriter(redis, key)

    def settling(self, run: JobRun, decision: Decision) -> Decision:
        if decision.outcome is Outcome.SUCCESS:
            decision.settlement = decision.settlement.first(Receipt(str(run.payload["jid"]), time.time()))
        return decision

    def step_runners(self) -> Mapping[type, ReceiptWriter]:
        return {Receipt: self.writer}


def receipts(parts: WorkerParts) -> Receipts:
    return Receipts(parts.redis, parts.keys.prefix + "receipts")
