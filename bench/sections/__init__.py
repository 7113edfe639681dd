"""The bench's sections: one module each, holding what it measures and its part of docs/benchmarks.md.

A section module has::

    NAME = "limits"        # its name for --sections, and its key in the results JSON
    QUICK = True           # whether --quick runs it (False: real_jobs, wakeups)
    PARAMS = {"limits_n": (300, 10_000)}   # optional: its sizes, name -> (quick, default); they are
                           # in bench.p and the results' meta.params, and an argument of run.py of the
                           # same name (--limits-n) overrides one

    def run(bench: session.Bench) -> dict | None:
        '''Measure. The dict returned is stored as results[NAME] (None: the section wrote what it
        measured into bench.results itself, as the drain section does for "drain", "latency" and
        "idle"). An exception is recorded as results["errors"][NAME] and the run goes on.'''

    def report(res: dict) -> str:
        '''Its Markdown for docs/benchmarks.md, from a results dict (a saved one too): "" when
        ``res`` has nothing of it.'''

To add a section: write ``bench/sections/<name>.py`` with the above, then put its name in RUN (the
order runs go in) and in PAGE (where its report goes on the page). Its arguments, if any, go in
run.py's parser; tests/workers/test_bench_quick.py runs the QUICK ones (check its figures there).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# In the order they run: pushing first (no worker has run yet), the drains, then what reads them.
RUN = ("enqueue", "drain", "real_jobs", "async_jobs", "wakeups", "batches", "limits", "fairness", "outbox", "iteration",
       "history", "tracing", "idle", "scheduled", "scale", "memory", "profile")
# In the order of the page: the drains first (the figures most read), the rest after.
PAGE = ("drain", "real_jobs", "async_jobs", "wakeups", "batches", "limits", "fairness", "outbox", "iteration",
        "history", "tracing", "enqueue", "scheduled", "idle", "memory", "scale", "profile")

assert sorted(PAGE) == sorted(RUN), "every section has its place on the page"


def load(name: str) -> ModuleType:
    """The section module ``name`` (imported only once the bench venv runs: sections import redis-py)."""
    return importlib.import_module(f"sections.{name}")
