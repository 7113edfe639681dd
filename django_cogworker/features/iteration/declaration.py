"""What the iteration feature declares (django_cogworker/declarations.py): the class options an
:class:`~.job.IterableJob` reads, with their defaults and checks (a bad value fails as the class is
defined, naming it).

``iteration_checkpoint``: seconds between two saves of the cursor while it runs (None: the
setting ITERATION_CHECKPOINT, 1.0 by default). ``checkpoint_every``: also save every N items (None:
by time only). ``max_iteration_runtime``: seconds a run may iterate before the job goes back to
its queue with its cursor, to take turns with other jobs (None: no limit). ``throttle_on``: a list
of ``(condition, backoff)`` pairs (throttle.py): a callable condition that holds, or a Limiter that
refuses, sends the job back to the schedule after ``backoff`` seconds with its cursor, its thread
given back. Declared for every class, read only by an IterableJob.
"""

from __future__ import annotations

from typing import Any

from ...bounds import check_seconds, check_size
from ...declarations import Declaration, Option
from .throttle import check_throttles


def _seconds(value: Any, where: str) -> Any:
    check_seconds(value, where)
    return value


def _count(value: Any, where: str) -> Any:
    return None if value is None else check_size(value, where)


DECLARATION = Declaration("iteration", options=(
    Option("iteration_checkpoint", None, _seconds),
    Option("checkpoint_every", None, _count),
    Option("max_iteration_runtime", None, _seconds),
    Option("throttle_on", (), check_throttles),
))
