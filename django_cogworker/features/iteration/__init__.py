"""Iterable jobs (issue 45): a long job that walks an enumerator item by item and saves its cursor,
so that a deploy's TERM, a kill -9, a retry, a throttle or its own time limit never has it start
over.

    job.py          IterableJob: build_enumerator, each_iteration, the hooks, the enumerator methods
    enumerators.py  a list, a range, a QuerySet by keyset (one row or a batch an item), a CSV file
    loop.py         one run: items walked, the reasons to stop asked between two, the cursor saved
    state.py        ``iteration:<jid>`` (the saved cursor) and ``iteration:longest`` in Redis
    throttle.py     ``throttle_on``: conditions and limiters that send the job back to wait
    hook.py         the worker's side: a run's state made, an interrupted run back to the schedule
                    (RESCHEDULED), the state deleted when the job is done, the startup warning
    declaration.py  the class options it reads
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (for type checkers and editors: at run time, __getattr__ below)
    from .errors import IterationError
    from .job import IterableJob

__all__ = ["IterableJob", "IterationError"]


def __getattr__(name: str) -> Any:
    # Served on first use: the declarations (declaration.py) are read while a Job class is being
    # defined, and defining IterableJob then, as this package is imported, read them again under
    # their lock (a deadlock at Django's startup).
    if name == "IterableJob":
        from .job import IterableJob

        return IterableJob
    if name == "IterationError":
        from .errors import IterationError

        return IterationError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
