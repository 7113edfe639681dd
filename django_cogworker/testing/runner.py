"""How the test helpers run a job: through the worker's own Processor, called on the caller's thread.

A job run by ``drain`` (fake) or at its push (inline) goes through the path a worker's goes
through (engine/run/processor.py): its class's Plan of the features' hooks (a batch's step, an
encrypted job's arguments opened, a project's own ``COGWORKER["FEATURES"]``), the decision, the
settlement, the ``after`` hooks. A feature has one implementation, and the helpers run it. What
differs is what the helpers keep no state for:

* the job came from no queue: its ack writes nothing, and neither does its filing (no retry or
  dead set); a feature's step (a batch's) is run at once, against the project's Redis, and what
  refuses it is raised, not kept for a heartbeat that never comes;
* nothing is retried: a failure is final (dead, for its batch: its death and complete fire), and
  is raised to the caller;
* the features whose state a push under the helpers never made are left out (:data:`LEFT_OUT`);
* the server middleware is not run (Django's ``close_old_connections`` would close a test's
  connection inside its transaction), nor is a timeout armed (no watcher thread).

Built on the first job run (a plain job reaches no Redis: its Plan has no hook that writes; a
workflow's jobs need the project's Redis, as its batches live there).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, cast

from .. import joblog
from ..broker.keys import for_config
from ..engine.fetch.contract import Fetch, Unit
from ..engine.fetch.ledger import Ledger
from ..engine.process.launcher import run_job
from ..engine.run.factories import build_features, load_features, step_runners
from ..engine.run.hooks import Feature, JobRun, Plans, WorkerParts
from ..engine.run.processor import Processor
from ..engine.settle.queue import SettlementQueue
from ..engine.settle.retry import Filing, RetryPolicy
from ..engine.settle.settlement import Settlement
from ..engine.settle.settling import Settler
from ..engine.settle.stats import Stats
from ..features.iteration.hook import Iteration
from ..features.limits.hook import ClassLimits, InlineLimits
from ..features.locks.hook import RunLockRelease
from ..features.profiling.hook import Profiling
from ..features.progress.hook import Progress
from ..features.results.hook import Results
from ..push import payload as payloads
from ..push import runtime
from ..push import scope as _scope

# The features the helpers leave out, each for state a push under them never made:
LEFT_OUT: tuple[type[Feature], ...] = (
    ClassLimits, InlineLimits,  # places in a limiter: a job over one has no schedule to wait in
    RunLockRelease,  # unique and periodic locks: the helpers take none at push
    Results,  # result records: the helpers write no READY record at push (tasks/backend.py)
    Progress,  # progress keys: the helpers record each report in memory (stand_ins.py), write none
    Iteration,  # saved cursors: an iterable job runs to its end in one go (no TERM, no schedule to wait in)
    Profiling,  # profiles kept in Redis: a job pushed with set(profile=...) runs unprofiled (needs no Redis)
)


class Runner:
    """Runs payloads through one Processor built for a helper (per ``fake()`` / ``inline()``)."""

    def __init__(self) -> None:
        self._processor: Processor | None = None
        self._lock = threading.Lock()

    def run(self, payload: dict[str, Any]) -> JobRun | None:
        """Run ``payload`` (a dict JSON can hold) as a worker would, and settle it; raise what the job raised."""
        payload = {key: value for key, value in payload.items() if key != "at"}  # (a worker's has none)
        unit = Unit(payloads.encode(payload).encode(), str(payload.get("queue", "")))
        # (Outside the caller's jobs() block, if one is open, as on a worker's thread: inline runs a
        # job pushed in one at once, and its pushes, and the callbacks its step fires, joined that batch.)
        outside = _scope.batch.set(None)
        try:
            run = self.processor().process(unit)
        finally:
            _scope.batch.reset(outside)
        if run is not None and run.error is not None:
            _raise(run)
        return run

    def processor(self) -> Processor:
        # (Built once, under a lock: inline mode may be used by several threads, a live server's.)
        with self._lock:
            if self._processor is None:
                self._processor = _build()
            return self._processor


def _build() -> Processor:
    """A Processor called, not started: the worker's features (but LEFT_OUT), settled at once."""
    # A project's handler that shows the job (its LOGGING's format with %(job_context)s and the
    # JobContextFilter) printed each start and done line with the jid and class twice here, as
    # runcogworker's did (issue 42): runcogworker marks such handlers, and so do the helpers.
    joblog.name_once(joblog.configured_handlers())
    config = runtime.get_config()
    redis = runtime.get_shared_redis()  # (no connection made until a command needs one)
    keys = for_config(config)
    retry = Final(config)
    parts = WorkerParts(config=config, redis=redis, keys=keys, identity=f"testing:{os.getpid()}", retry=retry)
    features = [f for f in build_features(load_features(config), parts) if not isinstance(f, LEFT_OUT)]
    settler = AtOnce(cast(Fetch, Nowhere()), retry,
                     runners=step_runners(features))
    return Processor(0, ledger=Ledger(), settlements=SettlementQueue(settler), retry=retry, stats=Stats(keys),
                     server_chain=run_job, plans=Plans(features))


def _raise(run: JobRun) -> None:
    """Raise the job's error; a task is told of its failure first (a final one: nothing is retried),
    inside the handler of it, as a worker tells it (features/results/hook.py), so that Django's
    receiver logs its traceback."""
    error = cast(BaseException, run.error)
    try:
        raise error
    except BaseException:
        failed = getattr(run.job, "_cogworker_failed", None)
        if failed is not None:
            failed(retried=False)
        raise


class Final(RetryPolicy):
    """Retries nothing: under the helpers a job runs once, and its failure is final (filed dead,
    which Nowhere writes nowhere; a batch counts the job dead)."""

    def filing(self, payload: dict[str, Any], exc: BaseException, job: Any = None, *rest: Any) -> Filing | None:
        return super().filing({**payload, "retry": 0}, exc, job, *rest)


class Nowhere:
    """The fetch a helper's job settles through: it came from no queue, so its ack and its filing
    (retry and dead set: the helpers keep neither) write nothing."""

    def ack(self, raw: bytes) -> None:
        return None

    def file(self, raw: bytes, filing: Filing, trim: Any = None) -> None:
        return None

    def ack_many(self, raws: Sequence[bytes]) -> None:
        return None


class AtOnce(Settler):
    """Settles at once and raises what refused it (Redis away): no heartbeat will try it again."""

    def settle(self, raw: bytes, settlement: Settlement) -> None:
        _left, error = self._settle_once(raw, settlement)
        if error is not None:
            raise error
