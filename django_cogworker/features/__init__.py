"""The features, one folder each: what a job can do beyond being pushed, run and settled.

    batches       Batch, and chain, group, chord on it: a job's batch step, delivered callbacks
    limits        Limiter: concurrency, bucket, window and leaky limits across the fleet, and the
                  heartbeat's upkeep of their leases
    cancellation  cancel(jid): a request, then the job taken off where it waits or stopped running
    results       a job's result record (``result:<jid>``) and get_result
    expiry        a job dropped unrun past its ``expires_in``
    locks         a job's unique and periodic locks released when its rule says (start, success, death)
    iteration     IterableJob: a long job walked item by item, its cursor saved, sent back between two items
    progress      Job.progress and get_progress: how far a running job is (``progress:<jid>``)
    tracing       OpenTelemetry spans of every push and run, the trace carried in the payload
    history       the metrics history: per class and minute, runs, failures, run time and its histogram
    profiling     a job pushed with ``set(profile=...)`` run under a profiler, its profile kept a day
    collapse      debounce, throttle, keep_last_if_active: equal pushes collapse into one job
    fairness      group, priority, group_limits: a queue's groups take turns (the core's fetch), paused per group

A folder holds the whole of its feature: its Lua (``scripts.py``), its object model for the admin
and the CLI (``api.py``, re-exported by ``django_cogworker.api``), its admin views
(``admin_views.py``, routed by admin/urls.py), its metrics (``metrics.py``, read by
metrics/collect.py), and the worker's side of it: its hook (``hook.py``), a
:class:`~django_cogworker.engine.run.hooks.Feature` that plugs into the phases of a job's path.
:mod:`.standard` builds the package's features for a worker, in the order their hooks run. Its
templates are the one part elsewhere: Django finds an app's templates in its ``templates/``
folder only, so they are in ``templates/admin/cogworker/<feature>/``.

Features depend on the core (broker/, push/, engine/, api/'s general parts); the core depends on no
feature, and broker/ on nothing above it (tests/fast/test_layout.py holds the rule). A feature may use
another (cancellation reads a batch's hand-over jobs); the Django side (admin/, metrics/, cli/,
checks.py, the root package) gathers them.

A project's own feature subclasses :class:`Feature` (imported from here: the names below are the
public hook interface) and is named in ``COGWORKER["FEATURES"]`` (docs/extending.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (for type checkers and editors: at run time, __getattr__ below)
    from ..engine.run.hooks import Call, Decision, Feature, JobRun, Outcome, WorkerParts
    from ..engine.settle.settlement import ACK

# The public hook interface, for a project's own features (docs/extending.md). Served on first use:
# a web process imports features/ to push (a job's limits, its sealed arguments), never the engine.
__all__ = ["ACK", "Call", "Decision", "Feature", "JobRun", "Outcome", "WorkerParts"]


def __getattr__(name: str) -> Any:
    if name == "ACK":
        from ..engine.settle.settlement import ACK

        return ACK
    if name in __all__:
        from ..engine.run import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
