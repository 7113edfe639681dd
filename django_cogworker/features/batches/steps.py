"""The worker's side of batches: a job of a batch settles its batch step before its ack or filing.

The batches feature adds a :class:`BatchStep` to the settlement of a job whose payload carries a
``bid``; the Settler (engine/settle/settling.py) runs :meth:`BatchSteps.run` first, then the ack or
the filing, and keeps what is left as a pending settlement while Redis refuses it. A success
(without a result to keep) is held with the acks instead (engine/settle/queue.py): the steps held
ride the fetcher's next round trip, grouped by batch (:meth:`BatchSteps.queue`, on its pipeline),
and their acks the fetch after. One script per batch and fetch, not two round trips per job: a job of a
batch cost three times a plain one's worker CPU when each ran its own step and sent its own ack.
A process killed between the step and the ack has the job recovered and run again: its step
moves no counter twice (the scripts are idempotent by jid), and delivers what the first left on
the outbox. At shutdown a job whose step still fails stays on the in-progress list for orphan
recovery: acked without its step, its batch would wait for it forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from ...broker.keys import Keys
from ...broker.quarantine import is_wrong_type, run_script
from ...push import payload as payloads
from ...push.job import Job
from ..tracing.carried import FIELD, LINKS_MAX, TRACEPARENT
from . import delivery, scripts

logger = logging.getLogger(__name__)


class BatchStep(NamedTuple):
    """A step of a settlement: the batch step of a job (``outcome``: "success", "failure" or "dead")."""

    bid: str
    jid: str
    outcome: str
    record: str  # the failure's record (JSON), or the kept result ("" for none)
    trace: str = ""  # the job's trace context (traced_by), kept for the callbacks' links

    @property
    def holdable(self) -> bool:
        """A success with no result to write first: it may wait with the acks for the next fetch."""
        return self.outcome == "success" and not self.record


class BatchSteps:
    """Runs batch steps for one worker process (created by the Launcher; stateless, thread-safe)."""

    def __init__(self, redis: Any, keys: Keys, ttl: float):
        self.redis = redis
        self.keys = keys
        self.ttl = ttl

    def run(self, step: BatchStep) -> None:
        """Move the batch's counters for this job, then deliver what fired. Raises when Redis refuses."""
        settle(self.redis, self.keys, step.bid, step.jid, step.outcome, step.record, self.ttl, step.trace)

    # Held steps ride the fetch's round trip (engine/settle/outgoing.py), ordered: a job's
    # ack goes with the next fetch, once its step is known to have gone through.
    ordered = True

    def run_many(self, steps: Sequence[BatchStep]) -> None:
        """The steps of jobs that succeeded without a result to keep: one BATCH_SUCCEED per batch,
        all in one round trip, then deliver what fired. Raises when Redis refuses any (each step is
        idempotent by jid: running them all again moves nothing twice)."""
        calls, now, ttl = self._calls(steps)
        if len(calls) == 1:
            replies = [self._succeed(*calls[0], now, ttl)]
        else:
            pipe = self.redis.pipeline(transaction=False)
            for bid, jids, traces in calls:
                scripts.BATCH_SUCCEED.in_pipeline(pipe, self.keys.batch(bid), [bid, now, ttl, traces, *jids])
            replies = pipe.execute(raise_on_error=False)
        self._landed(calls, replies, now, ttl)

    def queue(self, pipe: Any, steps: Sequence[BatchStep]) -> int:
        """Queue the steps' BATCH_SUCCEED calls on the fetch's pipeline (one per batch)."""
        calls, now, ttl = self._calls(steps)
        for bid, jids, traces in calls:
            scripts.BATCH_SUCCEED.in_pipeline_by_sha(pipe, self.keys.batch(bid), [bid, now, ttl, traces, *jids])
        return len(calls)

    def landed(self, steps: Sequence[BatchStep], replies: Sequence[Any]) -> None:
        """Their replies, from the fetch's pipeline; raises when Redis refused any."""
        calls, now, ttl = self._calls(steps)
        self._landed(calls, replies, now, ttl)

    def _calls(self, steps: Sequence[BatchStep]) -> tuple[list[tuple[str, list[str], str]], str, str]:
        by_bid: dict[str, list[str]] = {}
        traced: dict[str, dict[str, None]] = {}
        for step in steps:
            by_bid.setdefault(step.bid, []).append(step.jid)
            if step.trace:
                traced.setdefault(step.bid, {})[step.trace] = None
        calls = [(bid, jids[start:start + 1000], " ".join(list(traced.get(bid, ()))[:LINKS_MAX]) if not start else "")
                 for bid, jids in by_bid.items() for start in range(0, len(jids), 1000)]
        return calls, repr(time.time()), str(max(1, int(self.ttl)))

    def _landed(self, calls: list[tuple[str, list[str], str]], replies: Sequence[Any], now: str, ttl: str) -> None:
        # A batch's key of the wrong type, or a script Redis forgot (NOSCRIPT, on a fetch's pipeline):
        # that batch's step again, alone, which moves the key aside or loads the script.
        replies = [self._succeed(bid, jids, traces, now, ttl) if isinstance(reply, Exception) and (
            is_wrong_type(reply) or isinstance(reply, NoScriptError)) else reply
            for (bid, jids, traces), reply in zip(calls, replies, strict=True)]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        for (bid, jids, _), waiting in zip(calls, replies, strict=True):
            if int(waiting) == -1:
                logger.warning("%d job(s) of batch %s: the batch is gone (expired: BATCH_TTL); settled without it",
                               len(jids), payloads.printable(bid))
            elif int(waiting) > 0:
                delivery.deliver(self.redis, self.keys, bid, self.ttl)

    def _succeed(self, bid: str, jids: list[str], traces: str, now: str, ttl: str) -> Any:
        bk = self.keys.batch(bid)
        return run_script(scripts.BATCH_SUCCEED, self.redis, self.keys, bk, [bid, now, ttl, traces, *jids],
                          lambda: bk.expected(self.ttl))


def step_for(payload: dict[str, Any], outcome: str, exc: BaseException | None = None,
             result: str | None = None) -> BatchStep:
    """The BatchStep of a settled job of a batch (``exc``: its failure)."""
    if exc is not None:
        record = payloads.encode({"class": payloads.safe_string(str(payload.get("class")), 200),
                                  "error": payloads.error_class(exc),
                                  "message": payloads.safe_string(payloads.error_message(exc), 1000),
                                  "at": time.time()})
    else:
        record = result or ""
    return BatchStep(str(payload["bid"]), str(payload.get("jid")), outcome, record, traced_by(payload))


def traced_by(payload: dict[str, Any]) -> str:
    """The job's trace context (its push's traceparent, features/tracing/), "" for none or one of
    another shape (the scripts keep no other: they count and split on TRACEPARENT_LENGTH characters
    with no space): what a callback of its batch links to."""
    carried = payload.get(FIELD)
    parent = carried.get("traceparent") if type(carried) is dict else None
    return parent if type(parent) is str and TRACEPARENT.fullmatch(parent) else ""


def settle(redis: Any, keys: Keys, bid: str, jid: str, outcome: str, record: str, ttl: float,
           trace: str = "") -> None:
    """One job's (or child batch's, ``b:<bid>``) step in batch ``bid``; deliver what it fired."""
    bk = keys.batch(bid)
    success = outcome == "success"
    waiting = int(run_script(scripts.BATCH_SETTLE, redis, keys, bk,
                             [bid, repr(time.time()), str(max(1, int(ttl))), jid, outcome,
                              "" if success else record, record if success else "", trace], lambda: bk.expected(ttl)))
    if waiting == -1:
        logger.warning("jid=%s: its batch %s is gone (expired: BATCH_TTL); settled without it",
                       payloads.printable(jid), payloads.printable(bid))
    elif waiting > 0:
        delivery.deliver(redis, keys, bid, ttl)


def died(redis: Any, keys: Keys, payload: dict[str, Any], error: str, message: str, ttl: float) -> None:
    """Tell a job's batch it went to dead other than by its run (orphaned too often, killed from the
    admin): its death fires, once. Nothing for a job of no batch. Run before the move to dead (an
    interrupted move has it stepped again, moving nothing twice)."""
    bid = payload.get("bid")
    if isinstance(bid, str):
        record = payloads.encode({"class": payloads.safe_string(str(payload.get("class")), 200), "error": error,
                                  "message": message, "at": time.time()})
        settle(redis, keys, bid, str(payload.get("jid")), "dead", record, ttl, traced_by(payload))


def handed_over(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The batch status and the options a callback's payload carries (empty where it has none)."""
    args, kwargs = payload.get("args"), payload.get("kwargs")
    status = args[0] if isinstance(args, list) and args and isinstance(args[0], dict) else {}
    return status, kwargs if isinstance(kwargs, dict) else {}


class BatchChildDone(Job):
    """Tells a parent batch that a child batch completed, succeeded or had a job die: the child's
    ``b:<bid>`` member of the parent settles as a job would (pushed by the child's step, once)."""

    name = "django_cogworker.batch_child_done"
    _cogworker_handover = True  # (pushed where the batch's hand-overs go: batch.handover_queue)
    cancellable = False  # (its parent batch waits for it: see cancel_refusal)

    @classmethod
    def cancel_refusal(cls, payload: dict[str, Any]) -> str:
        status, options = handed_over(payload)
        return (f"job {payload.get('jid')!r} is batch {options.get('parent')!r}'s own bookkeeping ({cls.name}): it "
                f"tells that batch its child batch {status.get('bid')!r} is done; cancelled, batch "
                f"{options.get('parent')!r} would wait for it for ever and never fire its callbacks. To stop the "
                f"work, cancel the jobs of the batches instead")

    def perform(self, status: dict[str, Any], parent: str, step: bool = False) -> None:
        from ...broker.keys import for_config
        from ...push import runtime

        config = runtime.get_config()
        event = status["event"]
        if event == "success":
            outcome = "success"
        elif event == "death":
            # (The child fails its parent once it completes, as its other jobs may still run; a
            # chain's step that completed before this death was not failing its chain: it is now.)
            outcome = "dead" if step and status.get("pending") == status.get("failures") else "death"
        elif status.get("failures") and (not step or status.get("dead")):
            # (A chain's step fails its chain only with a dead job: a failing one may yet succeed,
            # and the chain's later steps have not run.)
            outcome = "failure"
        else:
            return  # (complete without failures: its success follows)
        record = payloads.encode({"class": "batch", "error": f"batch {event}",
                                  "message": f"{status.get('failures', 0)} failing job(s) in child batch",
                                  "at": time.time()})
        settle(runtime.get_redis(), for_config(config), parent, f"b:{status['bid']}", outcome, record,
               config.batch_ttl)
