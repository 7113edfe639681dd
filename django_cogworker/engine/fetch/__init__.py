"""Taking jobs from the queues: the contract, its strategies, and the thread that runs them.

    contract     Fetch (every call the engine makes on a strategy, and which thread makes it), Unit
    registry     make_fetch: the strategy the config names
    reliable     the default: each job held is also on this process's in-progress list
    basic        BRPOP; what runs is known only from this process's memory
    sharded      both on a Redis Cluster, where each queue has its own slot
    fetcher      the fetcher thread: as many jobs as there are idle processors
    ledger       the jobs this process holds, handed over or running
    stall        whether a job it holds may have been taken back while it was silent
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the old ``engine/fetch.py`` module, for one release (DeprecationWarning)."""
    module = "registry" if name in ("make_fetch", "STRATEGIES") else "contract"
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
    if value is None or name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} has moved to {__name__}.{module}.{name}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return value
