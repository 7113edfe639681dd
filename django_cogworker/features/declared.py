"""The package's features' declarations (django_cogworker/declarations.py reads ``STANDARD`` by its dotted path on
first use): the class options each reads, what each does to a payload as it is pushed, and what each
provides the core. In the order their options are checked and their push hooks run (the expiry's
``expires_at`` before the encryption's seal). Each folder's ``declaration.py`` holds its own; the
batches', which declares no option, is here (its folder holds a dozen modules already)."""

from __future__ import annotations

from typing import Any

from ..declarations import Declaration
from .cancellation.declaration import DECLARATION as CANCELLATION
from .collapse.declaration import DECLARATION as COLLAPSE
from .encryption.declaration import DECLARATION as ENCRYPTION
from .expiry.declaration import DECLARATION as EXPIRY
from .fairness.declaration import DECLARATION as FAIRNESS
from .iteration.declaration import DECLARATION as ITERATION
from .limits.declaration import DECLARATION as LIMITS
from .profiling.declaration import DECLARATION as PROFILING
from .progress.declaration import DECLARATION as PROGRESS
from .results.declaration import DECLARATION as RESULTS
from .tracing.declaration import DECLARATION as TRACING


def _open_batch(bid: str) -> Any:
    """``Job.batch``: the batch ``bid``."""
    from .batches.batch import Batch  # (imported with the package anyway: read on the first Job.batch)

    return Batch(bid=bid)


def _signature(job_class: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``Job.s``: a workflow step of ``job_class`` with these arguments."""
    from .batches.signature import Signature

    return Signature(job_class, args, kwargs)


def _died(redis: Any, keys: Any, payload: dict[str, Any], error: str, message: str, ttl: float) -> None:
    """A job of a batch that died off the job's path (orphaned too often, killed from the admin): its
    batch counts it dead (batches/steps.py's ``died``)."""
    if isinstance(payload.get("bid"), str):  # (a job of no batch: nothing imported, nothing done)
        from .batches.steps import died

        died(redis, keys, payload, error, message, ttl)


BATCHES = Declaration("batches", died=_died, provides={"open_batch": _open_batch, "signature": _signature})

# (The collapse's digest is of the clear arguments: its hook before the encryption's seal; the fairness's
# reads a class's group from the clear arguments too, and puts ``group`` first, which nothing after reorders.)
STANDARD = (RESULTS, EXPIRY, LIMITS, COLLAPSE, FAIRNESS, ENCRYPTION, CANCELLATION, BATCHES, PROGRESS, ITERATION,
            TRACING, PROFILING)
